"""What a task has finished, per partition: the positions a commit may take, and what it took.

Each committed position carries its partition's time in the commit metadata (with the offsets
done above it when records are in flight; ``streamloop.completed_offsets`` holds the format), as
Kafka Streams does, so that a task initialised from the commit restores its stream time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from streamloop.completed_offsets import UNKNOWN_TIME, decode_metadata, encode_metadata
from streamloop.records import TopicPartition
from streamloop.transport.base import OffsetAndMetadata


def _unknown_time(_tp: TopicPartition) -> int:
    return UNKNOWN_TIME


class Positions:
    """Caller: the task (its run loops move ``next``; its commit methods read and mark).

    ``next``: the offset of the next record to process per partition, once one was
    processed (a record done, dropped by a handler, or paused at). Keyed by plain
    ``TopicPartition`` tuples; the hot path writes it once per record.

    ``time_of(tp)``: the partition's time now (negative: unknown), committed with its position.
    """

    def __init__(self, partitions: Iterable[TopicPartition],
                 time_of: Callable[[TopicPartition], int] = _unknown_time) -> None:
        self._partitions = frozenset(partitions)
        self._time_of = time_of
        self.next: dict[TopicPartition, int] = {}
        # ``next`` as of the last cache flush: what a commit may take when stores cache updates,
        # and the partition times then: a later record's time must not be committed with a
        # position below it (it would be processed again after a crash, under a time it raised).
        self._flushed: dict[TopicPartition, int] = {}
        self._flushed_times: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._committed_meta: dict[TopicPartition, OffsetAndMetadata] = {}
        # Records in flight: the highest offset done per partition.
        self._done_high: dict[TopicPartition, int] = {}

    def flushed(self) -> None:
        """The caches' updates went down: every position so far may be committed."""
        self._flushed = dict(self.next)
        self._flushed_times = {tp: self._time_of(tp) for tp in self._flushed}

    def advance_past(self, tp: TopicPartition, offset: int, bounds: list[int], cap: int | None) -> int:
        """``offset`` is done in flight; the position becomes the contiguous watermark (returned): the
        lowest of ``bounds`` (records still in flight or buffered), else one past the highest done,
        and never above ``cap`` (the offset a handler paused the task at)."""
        high = self._done_high.get(tp, -1)
        if offset > high:
            self._done_high[tp] = high = offset
        watermark = min(bounds) if bounds else high + 1
        if cap is not None:
            watermark = min(watermark, cap)
        self.next[tp] = watermark
        return watermark

    def rewind(self, tp: TopicPartition, done_below: int, position: int) -> None:
        """A resume: ``tp`` is read again from ``done_below`` (the paused offset, or one past it),
        its position ``position`` (lower while records below are in flight). Everything below
        ``done_below`` is done or in flight; what was done at or above it is done again, so it no
        longer counts: a record below it done later must not move the position past records not
        read again yet."""
        self.next[tp] = position
        self._done_high[tp] = done_below - 1

    def moved(self, flushed_only: bool, listed: Mapping[tuple[str, int], Iterable[int]] | None = None,
              ) -> dict[TopicPartition, OffsetAndMetadata]:
        """Positions that moved since the last commit (``flushed_only``: as of the last cache flush),
        each with its partition's time. A time that moved while the offset did not is not a reason
        to commit (Kafka Streams commits a partition when its offset moved): it cannot, in fact,
        without a record taken, and the next moved offset carries it. ``listed``: offsets done above
        the positions, that a previous owner finished (``SequentialLoop.listed``)."""
        positions = self._flushed if flushed_only else self.next
        times = self._flushed_times if flushed_only else None
        moved = {}
        for tp, offset in positions.items():
            if self._committed.get(tp) == offset:
                continue
            time = times.get(tp, UNKNOWN_TIME) if times is not None else self._time_of(tp)
            done = frozenset(o for o in listed.get(tp, ()) if o >= offset) if listed else frozenset()
            moved[TopicPartition(*tp)] = OffsetAndMetadata(offset, encode_metadata(offset, time, done))
        return moved

    def moved_with_metadata(self, metadata: Callable[[TopicPartition, int], str]) -> dict[TopicPartition,
                                                                                          OffsetAndMetadata]:
        """Records in flight: the metadata (offsets done above the watermark, as the window wrote
        them, and the partition time) may change while the watermark stays, so a position is new
        when either changed."""
        with_meta = {}
        for tp, offset in self.next.items():
            key = TopicPartition(*tp)
            completed = decode_metadata(offset, metadata(key, offset)).completed
            with_meta[key] = OffsetAndMetadata(offset, encode_metadata(offset, self._time_of(tp), completed))
        return {tp: om for tp, om in with_meta.items() if self._committed_meta.get(tp) != om}

    def mark_committed(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        for tp, om in offsets.items():
            if tp in self._partitions:
                self._committed[tp] = om.offset
                self._committed_meta[tp] = om

    def committed_offsets(self) -> dict[TopicPartition, int]:
        """A copy, safe to take from another thread."""
        return {TopicPartition(*tp): offset for tp, offset in dict(self._committed).items()}
