"""Timestamped key-value stores: each value kept with a timestamp, read back as a
``ValueAndTimestamp`` (Kafka Streams' ``TimestampedKeyValueStore``, KIP-258).

Build one with ``Stores.timestamped_key_value_store_builder(supplier, key_serde, value_serde)``
over any key-value supplier (``Stores.persistent_timestamped_key_value_store(name)`` or
``Stores.in_memory_key_value_store(name)``). The store keeps ``timestamp + value`` bytes (the
timestamp as 8 big-endian bytes, then the value serde's bytes), in the bytes store and its
changelog alike, so that a restored store has the timestamps back. Queries
(``KafkaStreams.store``, the driver's ``get_key_value_store``) return ``ValueAndTimestamp``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from streamloop.serdes import Serde
from streamloop.state.store import KeyValueStore

_TIMESTAMP = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class ValueAndTimestamp:
    """A stored value and its timestamp (ms)."""

    value: Any
    timestamp: int

    @classmethod
    def make(cls, value: Any, timestamp: int) -> ValueAndTimestamp | None:
        """None for a None value (a delete), as Kafka Streams' ``ValueAndTimestamp.make``."""
        return None if value is None else cls(value, timestamp)


class ValueAndTimestampSerde:
    """``ValueAndTimestamp`` as its timestamp's 8 bytes followed by ``inner``'s bytes of the value."""

    def __init__(self, inner: Serde) -> None:
        self.inner = inner

    def serialize(self, value: ValueAndTimestamp | None) -> bytes | None:
        if value is None:
            return None
        if not isinstance(value, ValueAndTimestamp):
            raise TypeError(f"a timestamped store keeps ValueAndTimestamp values, got {type(value).__name__}")
        data = self.inner.serialize(value.value)
        return _TIMESTAMP.pack(value.timestamp) + (data or b"")

    def deserialize(self, data: bytes | None) -> ValueAndTimestamp | None:
        if data is None:
            return None
        (timestamp,) = _TIMESTAMP.unpack_from(data)
        return ValueAndTimestamp(self.inner.deserialize(data[_TIMESTAMP.size:]), timestamp)

    def __repr__(self) -> str:
        return f"ValueAndTimestampSerde({self.inner!r})"


class TimestampedKeyValueStore(KeyValueStore):
    """A ``KeyValueStore`` of ``ValueAndTimestamp``: ``get`` returns one (None if absent).

    ``put(key, value)`` takes a ``ValueAndTimestamp``, or a plain value, which is stamped with the
    timestamp of the record being processed (what a Kafka Streams processor would pass as
    ``ValueAndTimestamp.make(value, record.timestamp())``); None deletes the key.
    """

    def put(self, key: Any, value: Any) -> None:
        if value is not None and not isinstance(value, ValueAndTimestamp):
            value = ValueAndTimestamp(value, self._timestamp())
        super().put(key, value)
