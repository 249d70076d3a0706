"""A partition log: the append-only list of records of one topic partition.

The log starts at offset 0 and never truncates, so a record's offset is its index.
It is not thread-safe by itself: the broker only touches it under its lock.
"""

from __future__ import annotations

from typing import NamedTuple

from streamloop.records import FetchedRecord, Headers, TopicPartition


class ProducedRecord(NamedTuple):
    """A record as a producer hands it to the broker (the log assigns the offset)."""

    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: Headers


class PartitionLog:
    __slots__ = ("_records", "partition")

    def __init__(self, partition: TopicPartition) -> None:
        self.partition = partition
        self._records: list[FetchedRecord] = []

    @property
    def end_offset(self) -> int:
        """The offset the next appended record gets (Kafka's log end offset)."""
        return len(self._records)

    def append(self, record: ProducedRecord) -> FetchedRecord:
        stored = FetchedRecord(
            topic=self.partition.topic,
            partition=self.partition.partition,
            offset=len(self._records),
            timestamp=record.timestamp,
            key=record.key,
            value=record.value,
            headers=tuple(record.headers),
        )
        self._records.append(stored)
        return stored

    def read(self, offset: int, max_records: int) -> list[FetchedRecord]:
        """Up to ``max_records`` records from ``offset`` on; empty at or past the end."""
        return self._records[offset : offset + max_records]
