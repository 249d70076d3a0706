"""The topics of a ``TopologyTestDriver``: the in-driver logs and the handles tests use on them.

``TopicLog`` keeps one topic's partitions and, for readers, every record in the order it
was appended. ``TestInputTopic`` serialises and pipes records in; ``TestOutputTopic``
reads and deserialises what the topology wrote, each handle from its own position.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from streamloop.errors import StreamsError
from streamloop.records import FetchedRecord, Headers, Record
from streamloop.serdes import Serde


class EmptyTopicError(StreamsError, LookupError):
    """``read_*`` on an output topic that has no unread record."""


@dataclass(frozen=True)
class TestRecord:
    """One record read from an output topic."""

    __test__ = False  # not a pytest test class

    key: Any
    value: Any
    timestamp: int
    headers: Headers = ()
    topic: str = ""
    partition: int = 0
    offset: int = 0


class TopicLog:
    """One topic's partitions, plus every record in the order it was appended (for readers)."""

    def __init__(self, topic: str, partitions: int) -> None:
        self.topic = topic
        self.partitions: list[list[FetchedRecord]] = [[] for _ in range(partitions)]
        self.appended: list[FetchedRecord] = []

    def append(self, partition: int, key: bytes | None, value: bytes | None, timestamp: int,
               headers: Headers) -> FetchedRecord:
        log_ = self.partitions[partition]
        record = FetchedRecord(self.topic, partition, len(log_), timestamp, key, value, tuple(headers))
        log_.append(record)
        self.appended.append(record)
        return record


# pipe(topic, key bytes, value bytes, timestamp, headers, partition): the driver's ``pipe_raw``.
Pipe = Callable[[str, "bytes | None", "bytes | None", "int | None", Headers, "int | None"], None]


class TestInputTopic:
    """Pipes records into one source topic of the driver's topology."""

    __test__ = False

    def __init__(self, pipe: Pipe, topic: str, key_serde: Serde, value_serde: Serde) -> None:
        self._pipe = pipe
        self.topic = topic
        self._key_serde = key_serde
        self._value_serde = value_serde

    def pipe_input(self, key: Any, value: Any, timestamp: int | None = None, headers: Headers = (),
                   partition: int | None = None) -> None:
        """Write one record and process everything it causes before returning.

        ``timestamp`` defaults to the driver's wall clock; ``partition`` to the one the key's bytes
        hash to (Kafka's default partitioner), round-robin for a None key.
        """
        self._pipe(self.topic, self._key_serde.serialize(key), self._value_serde.serialize(value),
                   timestamp, headers, partition)

    def pipe_records(self, records: Iterable[tuple[Any, Any] | Record]) -> None:
        """``pipe_input`` for each ``(key, value)`` pair or ``Record``, one after the other."""
        for item in records:
            if isinstance(item, Record):
                self.pipe_input(item.key, item.value, item.timestamp, item.headers)
            else:
                key, value = item
                self.pipe_input(key, value)


class TestOutputTopic:
    """Reads what the topology wrote to one topic, in the order it was written (all partitions),
    from where this handle last stopped."""

    __test__ = False

    def __init__(self, log: TopicLog, key_serde: Serde, value_serde: Serde) -> None:
        self._log = log
        self.topic = log.topic
        self._key_serde = key_serde
        self._value_serde = value_serde
        self._position = 0

    def _unread(self) -> list[FetchedRecord]:
        return self._log.appended[self._position:]

    def queue_size(self) -> int:
        return len(self._log.appended) - self._position

    def is_empty(self) -> bool:
        return self.queue_size() == 0

    def read_record(self) -> TestRecord:
        """The next unread record; ``EmptyTopicError`` when there is none."""
        if self.is_empty():
            raise EmptyTopicError(f"Output topic '{self.topic}' has no unread record")
        raw = self._log.appended[self._position]
        self._position += 1
        return self._decode(raw)

    def read_key_value(self) -> tuple[Any, Any]:
        record = self.read_record()
        return record.key, record.value

    def read_value(self) -> Any:
        return self.read_record().value

    def read_records(self) -> list[TestRecord]:
        """Every unread record (possibly none)."""
        unread = self._unread()
        self._position += len(unread)
        return [self._decode(r) for r in unread]

    def read_key_values(self) -> list[tuple[Any, Any]]:
        return [(r.key, r.value) for r in self.read_records()]

    def read_values(self) -> list[Any]:
        return [r.value for r in self.read_records()]

    def _decode(self, raw: FetchedRecord) -> TestRecord:
        return TestRecord(self._key_serde.deserialize(raw.key), self._value_serde.deserialize(raw.value),
                          raw.timestamp, raw.headers, raw.topic, raw.partition, raw.offset)
