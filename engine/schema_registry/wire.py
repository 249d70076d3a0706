"""Confluent's wire format: magic byte 0, the schema id as 4 big-endian bytes, then the payload.

A Protobuf payload is preceded by its message indexes: the path to the message type inside
its .proto file (the first top-level message is ``[0]``), written as zig-zag varints after
their count; ``[0]``, by far the most common, is the single byte 0.
"""

from __future__ import annotations

import struct

from streamloop.schema_registry.errors import UnknownMagicByteError, WireFormatError

MAGIC_BYTE = 0
_HEADER = struct.Struct(">bI")
HEADER_SIZE = _HEADER.size


def frame(schema_id: int, payload: bytes) -> bytes:
    """``payload`` behind the header naming ``schema_id``."""
    return _HEADER.pack(MAGIC_BYTE, schema_id) + payload


def unframe(data: bytes) -> tuple[int, memoryview]:
    """The schema id and the payload (a view, not a copy) of framed ``data``."""
    if len(data) < HEADER_SIZE:
        if not data or data[0] != MAGIC_BYTE:
            raise UnknownMagicByteError(data[0] if data else None)
        raise WireFormatError(f"A Schema Registry record is at least {HEADER_SIZE} bytes (magic byte, schema id), "
                              f"this one is {len(data)}")
    magic, schema_id = _HEADER.unpack_from(data)
    if magic != MAGIC_BYTE:
        raise UnknownMagicByteError(data[0])
    return schema_id, memoryview(data)[HEADER_SIZE:]


def _zigzag(value: int) -> int:
    return (value << 1) ^ (value >> 63)


def _unzigzag(value: int) -> int:
    return (value >> 1) ^ -(value & 1)


def _write_varint(out: bytearray, value: int) -> None:
    value = _zigzag(value) & 0xFFFFFFFFFFFFFFFF
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _read_varint(data: memoryview, offset: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if offset >= len(data):
            raise WireFormatError("The Protobuf message indexes end before their last varint")
        byte = data[offset]
        offset += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return _unzigzag(result), offset
        shift += 7
        if shift > 63:
            raise WireFormatError("A Protobuf message index varint is longer than 10 bytes")


def encode_message_indexes(indexes: list[int]) -> bytes:
    """The message-index array as Confluent writes it (``[0]`` as the single byte 0)."""
    if indexes == [0]:
        return b"\x00"
    out = bytearray()
    _write_varint(out, len(indexes))
    for index in indexes:
        _write_varint(out, index)
    return bytes(out)


def decode_message_indexes(payload: memoryview) -> tuple[list[int], memoryview]:
    """The message indexes at the start of a Protobuf payload, and the message bytes after them."""
    count, offset = _read_varint(payload, 0)
    if count == 0:
        return [0], payload[offset:]
    if count < 0 or count > len(payload):
        raise WireFormatError(f"The Protobuf message-index count {count} is not a count of the bytes that follow")
    indexes = []
    for _ in range(count):
        index, offset = _read_varint(payload, offset)
        indexes.append(index)
    return indexes, payload[offset:]
