"""The record types that flow through the engine.

``TopicPartition`` is a plain named tuple so that it hashes and compares equal to
aiokafka's own ``TopicPartition`` (also a named tuple of ``topic, partition``):
records fetched by either transport can be keyed by either type.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

Headers = Sequence[tuple[str, bytes]]


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


class ConsumerRecord(Protocol):
    """What a transport hands the engine for each fetched record (raw bytes).

    aiokafka's ``ConsumerRecord`` satisfies it as is, so the Kafka transport does
    not copy records; the memory transport uses :class:`FetchedRecord`.
    """

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Headers: ...


@dataclass(slots=True, frozen=True)
class FetchedRecord:
    """A raw record as stored in a partition log (memory transport)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Headers = ()


@dataclass(slots=True)
class Record:
    """A deserialized record on its way through the processors.

    Processors get a ``Record`` and forward new ones; ``with_key``/``with_value``
    copy the rest, as in Kafka Streams' ``Record``.
    """

    key: Any
    value: Any
    timestamp: int
    headers: Headers = field(default=())

    def with_key(self, key: Any) -> Record:
        return Record(key, self.value, self.timestamp, self.headers)

    def with_value(self, value: Any) -> Record:
        return Record(self.key, value, self.timestamp, self.headers)

    def with_timestamp(self, timestamp: int) -> Record:
        return Record(self.key, self.value, timestamp, self.headers)

    def with_headers(self, headers: Headers) -> Record:
        return Record(self.key, self.value, self.timestamp, headers)
