"""What a task has finished, per partition: the positions a commit may take, and what it took."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from engine.records import TopicPartition
from engine.transport.base import OffsetAndMetadata


class Positions:
    """Caller: the task (its run loops move ``next``; its commit methods read and mark).

    ``next``: the offset of the next record to process per partition, once one was
    processed (a record done, dropped by a handler, or paused at). Keyed by plain
    ``TopicPartition`` tuples; the hot path writes it once per record.
    """

    def __init__(self, partitions: Iterable[TopicPartition]) -> None:
        self._partitions = frozenset(partitions)
        self.next: dict[TopicPartition, int] = {}
        # ``next`` as of the last cache flush: what a commit may take when stores cache updates.
        self._flushed: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._committed_meta: dict[TopicPartition, OffsetAndMetadata] = {}
        # Records in flight: the highest offset done per partition.
        self._done_high: dict[TopicPartition, int] = {}

    def flushed(self) -> None:
        """The caches' updates went down: every position so far may be committed."""
        self._flushed = dict(self.next)

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

    def moved(self, flushed_only: bool) -> dict[TopicPartition, OffsetAndMetadata]:
        """Positions that moved since the last commit (``flushed_only``: as of the last cache flush)."""
        positions = self._flushed if flushed_only else self.next
        return {
            TopicPartition(*tp): OffsetAndMetadata(offset)
            for tp, offset in positions.items()
            if self._committed.get(tp) != offset
        }

    def moved_with_metadata(self, metadata: Callable[[TopicPartition, int], str]) -> dict[TopicPartition,
                                                                                          OffsetAndMetadata]:
        """Records in flight: the metadata (offsets done above the watermark) may change while the
        watermark stays, so a position is new when either changed."""
        with_meta = {
            TopicPartition(*tp): OffsetAndMetadata(offset, metadata(TopicPartition(*tp), offset))
            for tp, offset in self.next.items()
        }
        return {tp: om for tp, om in with_meta.items() if self._committed_meta.get(tp) != om}

    def mark_committed(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        for tp, om in offsets.items():
            if tp in self._partitions:
                self._committed[tp] = om.offset
                self._committed_meta[tp] = om

    def committed_offsets(self) -> dict[TopicPartition, int]:
        """A copy, safe to take from another thread."""
        return {TopicPartition(*tp): offset for tp, offset in dict(self._committed).items()}
