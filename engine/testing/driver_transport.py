"""The clients the test driver's task manager sees: a producer, a consumer and a restore
reader over the driver's in-memory topic logs (``TopicLog``), in the shape of
``streamloop.transport.base``. Acks are immediate and nothing waits: the driver runs the
tasks itself, one call at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from streamloop.records import FetchedRecord, Headers, TopicPartition
from streamloop.testing.topics import TopicLog
from streamloop.transport.base import OffsetAndMetadata

LogOf = Callable[[str], TopicLog]
"""The driver's log of a topic (created on first use, with the topic's partition count)."""


class DriverProducer:
    """Implements ``streamloop.transport.base.Producer`` over the driver's logs; acks are immediate."""

    def __init__(self, log_of: LogOf, now_ms: Callable[[], int]) -> None:
        self._log_of = log_of
        self._now_ms = now_ms  # the driver's wall clock: the timestamp of output given none
        self._buffer: list[tuple[str, int, bytes | None, bytes | None, int, Headers]] = []
        self._acked: dict[TopicPartition, int] = {}

    async def start(self) -> None:
        return None

    def append(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
               timestamp_ms: int | None, headers: Headers) -> None:
        timestamp = timestamp_ms if timestamp_ms is not None else self._now_ms()
        self._buffer.append((topic, partition, key, value, timestamp, headers))

    def buffered(self) -> int:
        return len(self._buffer)

    async def send_buffered(self) -> None:
        buffer, self._buffer = self._buffer, []
        for topic, partition, key, value, timestamp, headers in buffer:
            topic_log = self._log_of(topic)
            topic_log.append(partition, key, value, timestamp, headers)
            self._acked[TopicPartition(topic, partition)] = len(topic_log.partitions[partition])

    def acked_ends(self) -> Mapping[TopicPartition, int]:
        return self._acked

    async def flush(self) -> None:
        await self.send_buffered()

    def drop(self) -> None:
        """A crash: what was not handed over is lost."""
        self._buffer = []

    async def close(self) -> None:
        self._buffer = []


class DriverConsumer:
    """The parts of ``streamloop.transport.base.Consumer`` a task manager and committer use, plus ``fetch``."""

    def __init__(self, log_of: LogOf) -> None:
        self._log_of = log_of
        self.positions: dict[TopicPartition, int] = {}
        self._paused: set[TopicPartition] = set()
        self._committed: dict[TopicPartition, OffsetAndMetadata] = {}

    def assignment(self) -> set[TopicPartition]:
        return set(self.positions)

    def pause(self, *partitions: TopicPartition) -> None:
        self._paused.update(TopicPartition(*tp) for tp in partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self._paused.difference_update(TopicPartition(*tp) for tp in partitions)

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    def take_fetched(self, partition: TopicPartition) -> Sequence[FetchedRecord]:
        return []  # the driver hands records to poll one by one: nothing is fetched ahead

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self.positions[TopicPartition(*partition)] = offset

    async def position(self, partition: TopicPartition) -> int:
        return self.positions[TopicPartition(*partition)]

    async def committed(self, partition: TopicPartition) -> OffsetAndMetadata | None:
        return self._committed.get(TopicPartition(*partition))

    async def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        for tp, om in offsets.items():
            self._committed[TopicPartition(*tp)] = om

    def committed_now(self, partition: TopicPartition) -> OffsetAndMetadata | None:
        return self._committed.get(partition)

    async def end_offsets(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return {TopicPartition(*tp): len(self._log_of(tp.topic).partitions[tp.partition]) for tp in partitions}

    def fetched_end(self, partition: TopicPartition) -> int | None:
        return len(self._log_of(partition.topic).partitions[partition.partition])

    def fetched_lag(self, partition: TopicPartition) -> int | None:
        return 0  # records are run as piped (TopologyTestDriver): a task never waits for another input

    def fetch(self, max_records: int) -> dict[TopicPartition, list[FetchedRecord]]:
        """Records after each assigned, unpaused position, in partition order."""
        fetched: dict[TopicPartition, list[FetchedRecord]] = {}
        left = max_records
        for tp in sorted(self.positions):
            if tp in self._paused or left <= 0:
                continue
            log_ = self._log_of(tp.topic).partitions[tp.partition]
            start = self.positions[tp]
            records = log_[start:start + left]
            if records:
                fetched[tp] = records
                self.positions[tp] = start + len(records)
                left -= len(records)
        return fetched


class DriverReader:
    """A groupless reader of the driver's logs: what restoring a store from its changelog uses."""

    def __init__(self, log_of: LogOf) -> None:
        self._log_of = log_of
        self._positions: dict[TopicPartition, int] = {}

    async def start(self) -> None:
        return None

    def assign(self, partitions: Sequence[TopicPartition]) -> None:
        self._positions = {TopicPartition(*tp): 0 for tp in partitions}

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self._positions[TopicPartition(*partition)] = offset

    async def position(self, partition: TopicPartition) -> int:
        return self._positions[TopicPartition(*partition)]

    def fetched_end(self, partition: TopicPartition) -> int | None:
        """The log's end: the restore asks it once it reached the end ListOffsets reported."""
        return len(self._log_of(partition.topic).partitions[partition.partition])

    def fetched_lag(self, partition: TopicPartition) -> int | None:
        end = self.fetched_end(partition)
        return None if end is None else max(0, end - self._positions.get(TopicPartition(*partition), 0))

    async def poll(self, timeout_ms: int, max_records: int | None = None) -> dict[TopicPartition, list[FetchedRecord]]:
        fetched = {}
        for tp, start in self._positions.items():
            records = self._log_of(tp.topic).partitions[tp.partition][start:]
            if records:
                fetched[tp] = records
                self._positions[tp] = start + len(records)
        return fetched

    async def close(self, leave_group: bool = True) -> None:
        self._positions = {}


