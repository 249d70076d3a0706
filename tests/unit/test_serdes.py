"""Serdes: values survive a round trip, ``None`` passes through, wrong input is a clear error."""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamloop.serdes import BytesSerde, IntegerSerde, JsonSerde, LongSerde, Serde, StringSerde, as_serde

INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
# Lone surrogates cannot be encoded as UTF-8 at all; they are not strings a serde can carry.
TEXT = st.text(st.characters(blacklist_categories=("Cs",)))
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | INT64 | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
    max_leaves=12,
)

ALL_SERDES = [BytesSerde(), StringSerde(), IntegerSerde(), LongSerde(), JsonSerde()]


# -- round trips -----------------------------------------------------------------


@given(st.binary())
def test_bytes_round_trip_unchanged(value: bytes) -> None:
    serde = BytesSerde()

    assert serde.deserialize(serde.serialize(value)) == value


@given(TEXT)
def test_strings_round_trip(value: str) -> None:
    serde = StringSerde()

    assert serde.deserialize(serde.serialize(value)) == value


@given(TEXT.filter(lambda s: all(ord(c) < 256 for c in s)))
def test_strings_round_trip_in_another_encoding(value: str) -> None:
    serde = StringSerde("latin-1")

    assert serde.serialize(value) == value.encode("latin-1")
    assert serde.deserialize(serde.serialize(value)) == value


@given(INT32)
def test_32_bit_integers_round_trip(value: int) -> None:
    serde = IntegerSerde()

    assert serde.deserialize(serde.serialize(value)) == value


@given(INT64)
def test_64_bit_integers_round_trip(value: int) -> None:
    serde = LongSerde()

    assert serde.deserialize(serde.serialize(value)) == value


@given(JSON_VALUES.filter(lambda v: v is not None))
def test_json_values_round_trip(value: Any) -> None:
    serde = JsonSerde()

    assert serde.deserialize(serde.serialize(value)) == value


# -- layouts -----------------------------------------------------------------------


def test_integer_serde_writes_4_bytes_big_endian() -> None:
    assert IntegerSerde().serialize(1) == b"\x00\x00\x00\x01"
    assert IntegerSerde().serialize(-1) == b"\xff\xff\xff\xff"


def test_long_serde_writes_8_bytes_big_endian() -> None:
    assert LongSerde().serialize(258) == b"\x00\x00\x00\x00\x00\x00\x01\x02"


def test_string_serde_writes_utf8_by_default() -> None:
    assert StringSerde().serialize("é") == b"\xc3\xa9"


def test_json_serde_writes_compact_json() -> None:
    assert JsonSerde().serialize({"n": [1, 2]}) == b'{"n":[1,2]}'


@pytest.mark.parametrize("buffer", [bytearray(b"ab"), memoryview(b"ab")])
def test_bytes_serde_copies_other_buffers_to_bytes(buffer: Any) -> None:
    serialized = BytesSerde().serialize(buffer)

    assert serialized == b"ab"
    assert type(serialized) is bytes


# -- None ---------------------------------------------------------------------------


@pytest.mark.parametrize("serde", ALL_SERDES, ids=repr)
def test_none_serializes_to_none(serde: Serde) -> None:
    assert serde.serialize(None) is None


@pytest.mark.parametrize("serde", ALL_SERDES, ids=repr)
def test_none_deserializes_to_none(serde: Serde) -> None:
    assert serde.deserialize(None) is None


# -- wrong input -----------------------------------------------------------------------


@pytest.mark.parametrize("value", ["text", 1, object()])
def test_bytes_serde_rejects_non_bytes_with_type_error(value: Any) -> None:
    with pytest.raises(TypeError, match=f"BytesSerde expects bytes, got {type(value).__name__}"):
        BytesSerde().serialize(value)


@pytest.mark.parametrize("value", [b"bytes", 1, ["a"]])
def test_string_serde_rejects_non_strings_with_type_error(value: Any) -> None:
    with pytest.raises(TypeError, match=f"StringSerde expects str, got {type(value).__name__}"):
        StringSerde().serialize(value)


def test_string_serde_rejects_invalid_utf8_with_value_error() -> None:
    with pytest.raises(ValueError):
        StringSerde().deserialize(b"\xff\xfe")


@pytest.mark.parametrize("value", ["1", 1.0, True])
def test_integer_serde_rejects_non_integers_with_type_error(value: Any) -> None:
    with pytest.raises(TypeError, match=f"IntegerSerde expects int, got {type(value).__name__}"):
        IntegerSerde().serialize(value)


@pytest.mark.parametrize(("serde", "value"), [(IntegerSerde(), 2**31), (LongSerde(), -(2**63) - 1)],
                         ids=["int", "long"])
def test_integer_serde_rejects_out_of_range_values_with_value_error(serde: IntegerSerde, value: int) -> None:
    with pytest.raises(ValueError):
        serde.serialize(value)


@pytest.mark.parametrize(
    ("serde", "data", "message"),
    [(IntegerSerde(), b"\x00" * 8, "expects 4 bytes, got 8"), (LongSerde(), b"\x00" * 4, "expects 8 bytes, got 4")],
    ids=["int", "long"],
)
def test_integer_serde_rejects_data_of_the_wrong_length_with_value_error(
    serde: IntegerSerde, data: bytes, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        serde.deserialize(data)


def test_integer_serde_size_must_be_4_or_8() -> None:
    with pytest.raises(ValueError, match="size must be 4 or 8, got 2"):
        IntegerSerde(2)


def test_a_serialized_json_value_holds_about_its_own_length_in_memory() -> None:
    """Stores hold serialized values until a commit (in memory for good): orjson's own result
    keeps its whole write buffer, 4 KiB for a 50-byte value, which held 4 GiB at 1M records."""
    serde = JsonSerde()
    value = {"id": "order-1", "customer": "customer-5", "amount": 500}
    length = len(serde.serialize(value) or b"")
    tracemalloc.start()
    try:
        held = [serde.serialize(value) for _ in range(1000)]
        traced, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(held) == 1000
    # A bytes object's header is 33 bytes; the list's slot 8.
    assert traced / 1000 < length + 33 + 8 + 64, f"{traced / 1000:.0f} bytes held per {length}-byte value"


def test_json_serde_rejects_unserializable_values_with_type_error() -> None:
    with pytest.raises(TypeError):
        JsonSerde().serialize(object())


def test_json_serde_rejects_invalid_json_with_value_error() -> None:
    with pytest.raises(ValueError):
        JsonSerde().deserialize(b"{not json")


# -- as_serde ------------------------------------------------------------------------


def test_as_serde_returns_an_instance_unchanged() -> None:
    serde = StringSerde()

    assert as_serde(serde, "key serde") is serde


def test_as_serde_instantiates_a_serde_class() -> None:
    assert isinstance(as_serde(JsonSerde, "value serde"), JsonSerde)


def test_as_serde_accepts_any_object_with_serialize_and_deserialize() -> None:
    class Upper:
        def serialize(self, value: str | None) -> bytes | None:
            return None if value is None else value.upper().encode()

        def deserialize(self, data: bytes | None) -> str | None:
            return None if data is None else data.decode()

    assert as_serde(Upper(), "value serde").serialize("a") == b"A"


@pytest.mark.parametrize("value", ["utf-8", str, 42])
def test_as_serde_rejects_non_serdes_with_type_error_naming_the_role(value: object) -> None:
    with pytest.raises(TypeError, match="value serde of 'sink' must have serialize"):
        as_serde(value, "value serde of 'sink'")


@pytest.mark.parametrize("same", [
    (BytesSerde(), BytesSerde()),
    (StringSerde(), StringSerde("utf-8")),
    (IntegerSerde(), IntegerSerde(4)),
    (LongSerde(), LongSerde()),
    (JsonSerde(), JsonSerde()),
])
def test_ready_serdes_with_the_same_settings_are_equal(same: tuple[Serde, Serde]) -> None:
    assert same[0] == same[1]
    assert hash(same[0]) == hash(same[1])


@pytest.mark.parametrize("different", [
    (StringSerde(), StringSerde("latin-1")),
    (IntegerSerde(), LongSerde()),
    (IntegerSerde(8), LongSerde()),
    (BytesSerde(), JsonSerde()),
])
def test_ready_serdes_that_write_differently_or_are_other_classes_differ(different: tuple[Serde, Serde]) -> None:
    assert different[0] != different[1]
