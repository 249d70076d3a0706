"""``PartitionGroup``: a task's input (Kafka Streams' ``PartitionGroup``): the queue of fetched
records of each of its partitions, which partition goes next, and the task's time.

Time, in one place:

- **partition time** of a source with a timestamp extractor: the largest timestamp extracted from
  a record of that partition (the extractor is given it). Other sources keep none: their
  partition time is the task's stream time, which is never below it and is what a restart needs.
- **stream time**: the largest timestamp of the records the task has *passed*: records whose
  position the task moved past, processed or dropped by a handler (a record that could not be
  read has none). Whatever runs the records (one at a time, in flight, in Spark batches) passes
  them in offset order per partition (``RecordPath.passed``), so a committed position never
  carries a time that a record above it raised, and stream-time punctuation runs between records.
- A task started from a commit restores both from the commit metadata (``restore``).

Readiness (Kafka Streams' ``max.task.idle.ms``, KIP-353/KIP-695): a task with several partitions
takes the lowest head only while every partition has a record buffered, or the empty ones are
caught up (fetch lag 0). Otherwise one input could run ahead in event time on a backlog, and the
other input's records arrive after a join's store retention (their results lost). ``ready``
answers how long the task must wait before it may go on with the partitions it has.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from streamloop.completed_offsets import decode_metadata
from streamloop.records import ConsumerRecord, TopicPartition
from streamloop.transport.base import OffsetAndMetadata

__all__ = ["IdleRule", "PartitionGroup"]

# ``max.task.idle.ms`` that never waits (processes whichever partition has records).
NEVER_IDLE = -1


@dataclass(frozen=True)
class IdleRule:
    """``max.task.idle.ms`` and where the fetch lag of a partition is read: the consumer's log end
    as the last fetch saw it minus its position (None before a fetch answered)."""

    idle_ms: int
    lag: Callable[[TopicPartition], int | None]


# How long a task that waits for a lagging partition waits before it looks again: records arriving
# wake it sooner; this catches a fetch that answered without records (the partition caught up).
_RECHECK_MS = 50.0


class PartitionGroup:
    """Caller: the task (records in, from the task manager) and its run loop (records out)."""

    __slots__ = ("_idle", "_idle_since", "_queues", "_timed", "enforced", "head_stamps", "head_time",
                 "partition_times", "stream_time")

    def __init__(self, partitions: Iterable[TopicPartition], timed_topics: Iterable[str] = (),
                 idle: IdleRule | None = None) -> None:
        self._queues: dict[TopicPartition, deque[ConsumerRecord]] = {tp: deque() for tp in partitions}
        # The topics whose partitions keep their own time: sources with a timestamp extractor.
        self._timed = frozenset(timed_topics)
        self.stream_time = -1
        # Keyed by plain (topic, partition) tuples, as the hot path builds them.
        self.partition_times: dict[tuple[str, int], int] = {}
        # The heads' timestamps extracted to choose among them, (offset, timestamp) per partition.
        self.head_stamps: dict[tuple[str, int], tuple[int, int]] = {}
        # Set when a source has an extractor: orders the partitions' heads (else their own timestamps).
        self.head_time: Callable[[ConsumerRecord], int] | None = None
        # None: never wait (a single partition, or the test driver, which runs records as piped).
        self._idle = idle if idle is not None and idle.idle_ms != NEVER_IDLE and len(self._queues) > 1 else None
        # Wall-clock ms since which the task found a partition empty and not caught up.
        self._idle_since: int | None = None
        # Times the idle time ran out and the task went on without a lagging partition.
        self.enforced = 0

    # -- records in ------------------------------------------------------------------
    def add(self, partition: TopicPartition, records: Sequence[ConsumerRecord]) -> int:
        """Queue fetched records; returns how many the partition now holds."""
        queue = self._queues[partition]
        queue.extend(records)
        return len(queue)

    # -- records out -----------------------------------------------------------------
    def buffered(self, partition: TopicPartition | None = None) -> int:
        if partition is None:
            # Counted from the queues, not kept beside them: the run loops pop records without
            # bookkeeping, and a PAUSE or a close empties the queues.
            return sum(len(queue) for queue in self._queues.values())
        return len(self._queues[partition])

    def __len__(self) -> int:
        return len(self._queues)

    def queues(self) -> dict[TopicPartition, deque[ConsumerRecord]]:
        return self._queues

    def next_queue(self) -> deque[ConsumerRecord] | None:
        """The partition whose head has the lowest timestamp (Kafka Streams' choice)."""
        best: deque[ConsumerRecord] | None = None
        head_time = self.head_time
        if head_time is not None and len(self._queues) > 1:
            best_time = 0
            for queue in self._queues.values():
                if queue:
                    time = head_time(queue[0])
                    if best is None or time < best_time:
                        best, best_time = queue, time
            return best
        for queue in self._queues.values():
            if queue and (best is None or queue[0].timestamp < best[0].timestamp):
                best = queue
        return best

    def ready(self, now_ms: int) -> float:
        """0 when the task may take the next record; else how many ms to wait before asking again
        (Kafka Streams' ``PartitionGroup.readyToProcess``). Caller: the run loop, before a chunk and
        whenever a queue runs empty. Does not look at whether any record is buffered at all."""
        idle = self._idle
        if idle is None:
            return 0.0
        lagging = False
        for tp, queue in self._queues.items():
            if not queue:
                lag = idle.lag(tp)
                # Never fetched (lag unknown) counts as behind until a fetch answers.
                if lag is None or lag > 0:
                    lagging = True
                    break
        if not lagging:
            self._idle_since = None
            return 0.0
        if idle.idle_ms == 0:
            return _RECHECK_MS
        if self._idle_since is None:
            self._idle_since = now_ms
        waited = now_ms - self._idle_since
        if waited >= idle.idle_ms:
            self.enforced += 1
            return 0.0
        return float(min(idle.idle_ms - waited, _RECHECK_MS))

    def take(self, partition: TopicPartition, index: int = 0) -> ConsumerRecord:
        """Take a queued record out to run it (records in flight may take one behind a busy key)."""
        queue = self._queues[partition]
        if index == 0:
            return queue.popleft()
        raw = queue[index]
        del queue[index]
        return raw

    def first_offset(self, partition: TopicPartition) -> int | None:
        """The offset of the first record waiting in ``partition``'s queue, if any."""
        queue = self._queues.get(partition)
        return queue[0].offset if queue else None

    def discard(self, partition: TopicPartition) -> None:
        """Drop the records fetched from ``partition`` (it was seeked elsewhere)."""
        self._queues[partition].clear()

    def clear(self) -> None:
        for queue in self._queues.values():
            queue.clear()

    # -- time --------------------------------------------------------------------------
    def tracks_partition_time(self, topic: str) -> bool:
        return topic in self._timed

    def partition_time(self, tp: TopicPartition) -> int:
        """The time committed with ``tp``'s position (see the module's docstring)."""
        if tp[0] in self._timed:
            return self.partition_times.get((tp[0], tp[1]), -1)
        return self.stream_time

    def restore(self, committed: Mapping[TopicPartition, OffsetAndMetadata | None]) -> dict[tuple[str, int], int]:
        """Start from the times the last commit of each partition carried in its metadata (Kafka
        Streams' ``initializeTaskTime``): each tracked partition's own, and stream time the largest
        of them, so it does not fall back to -1 after a restart or a move. Returns the times found."""
        times = {}
        for tp, om in sorted(committed.items()):
            if om is not None and om.metadata and (time := decode_metadata(om.offset, om.metadata).partition_time) >= 0:
                times[(tp.topic, tp.partition)] = time
        if not times:
            return times
        for key, time in times.items():
            if key[0] in self._timed:
                self.partition_times[key] = max(self.partition_times.get(key, -1), time)
        self.stream_time = max(self.stream_time, *times.values())
        return times
