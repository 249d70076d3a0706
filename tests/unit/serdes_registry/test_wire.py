"""Confluent's wire format: the header, and the Protobuf message indexes (zig-zag varints)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamloop.schema_registry import UnknownMagicByteError, WireFormatError
from streamloop.schema_registry.wire import decode_message_indexes, encode_message_indexes, frame, unframe


def model_varint(value: int) -> bytes:
    """Protobuf's zig-zag varint, written out from its definition: 7 bits a byte, low first."""
    n = 2 * value if value >= 0 else -2 * value - 1
    out = []
    while True:
        low, n = n % 128, n // 128
        out.append(low + (128 if n else 0))
        if not n:
            return bytes(out)


def model_indexes(indexes: list[int]) -> bytes:
    """Confluent's array: ``[0]`` is the byte 0, anything else its count then each index."""
    if indexes == [0]:
        return b"\0"
    return model_varint(len(indexes)) + b"".join(model_varint(i) for i in indexes)


def test_frame_is_magic_byte_then_big_endian_id() -> None:
    assert frame(258, b"xy") == b"\x00\x00\x00\x01\x02xy"
    schema_id, payload = unframe(b"\x00\x00\x00\x01\x02xy")
    assert (schema_id, bytes(payload)) == (258, b"xy")


@pytest.mark.parametrize(("data", "first"), [(b"\x01\x00\x00\x00\x01x", 1), (b"{\"a\": 1}", 123), (b"", None),
                                             (b"\x07", 7)])
def test_unknown_magic_byte_names_it_and_what_to_do(data: bytes, first: int | None) -> None:
    with pytest.raises(UnknownMagicByteError, match="Unknown magic byte") as caught:
        unframe(data)
    assert caught.value.first == first
    assert "default.deserialization.exception.handler" in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_a_truncated_header_is_a_wire_format_error() -> None:
    with pytest.raises(WireFormatError, match="at least 5 bytes"):
        unframe(b"\x00\x00\x01")


@pytest.mark.parametrize(("indexes", "encoded"), [([0], b"\x00"), ([1], b"\x02\x02"), ([1, 0], b"\x04\x02\x00"),
                                                  ([0, 2], b"\x04\x00\x04")])
def test_message_indexes_as_confluent_writes_them(indexes: list[int], encoded: bytes) -> None:
    assert encode_message_indexes(indexes) == encoded
    decoded, rest = decode_message_indexes(memoryview(encoded + b"body"))
    assert (decoded, bytes(rest)) == (indexes, b"body")


def test_truncated_message_indexes_are_a_wire_format_error() -> None:
    with pytest.raises(WireFormatError):
        decode_message_indexes(memoryview(b"\x04\x02"))  # two indexes announced, one there


@given(st.lists(st.integers(0, 2 ** 31 - 1), min_size=1, max_size=6), st.binary(max_size=20),
       st.integers(0, 2 ** 32 - 1))
def test_property_indexes_and_frame_match_the_model_and_read_back(indexes: list[int], body: bytes,
                                                                  schema_id: int) -> None:
    encoded = encode_message_indexes(indexes)
    assert encoded == model_indexes(indexes)
    data = frame(schema_id, encoded + body)
    assert data == b"\0" + schema_id.to_bytes(4, "big") + model_indexes(indexes) + body
    read_id, payload = unframe(data)
    decoded, rest = decode_message_indexes(payload)
    assert (read_id, decoded, bytes(rest)) == (schema_id, indexes, body)
