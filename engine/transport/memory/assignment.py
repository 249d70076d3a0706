"""The partitions one consumer fetches: positions, pause flags and a fair fetch order.

Loop-local: only the consumer's own loop touches it (``poll``, ``seek``, ``pause``,
and the rebalance steps in ``membership.py``), so it has no lock.
Caller: ``MemoryConsumer`` and ``GroupMembership``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from streamloop.errors import IllegalStateError
from streamloop.records import FetchedRecord, TopicPartition


class AssignmentState:
    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._partitions: list[TopicPartition] = []
        # None: not known yet; resolved from the committed offset or auto.offset.reset.
        self._positions: dict[TopicPartition, int | None] = {}
        self._paused: set[TopicPartition] = set()
        self._rotation = 0
        # The log end each partition had when a fetch last asked for it (Kafka's high watermark
        # in a fetch response): a task's readiness reads the fetch lag from it.
        self._ends: dict[TopicPartition, int] = {}

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Replace the assignment: positions unknown, nothing paused (as after an eager rebalance)."""
        self._partitions = sorted({TopicPartition(*tp) for tp in partitions})
        self._positions = dict.fromkeys(self._partitions)
        self._paused = set()
        self._rotation = 0
        self._ends = {}

    def reassign(self, partitions: Iterable[TopicPartition]) -> None:
        """A new assignment that keeps the positions and pause flags of the partitions that stay
        (cooperative); the new ones start unknown. Same as ``assign`` after a full revocation."""
        partitions = [TopicPartition(*tp) for tp in partitions]
        kept = {tp: self._positions[tp] for tp in partitions if tp in self._positions}
        paused = self._paused & set(kept)
        ends = {tp: end for tp, end in self._ends.items() if tp in kept}
        self.assign(partitions)
        self._positions.update(kept)
        self._paused = paused
        self._ends = ends

    def clear(self) -> None:
        self.assign(())

    @property
    def partitions(self) -> set[TopicPartition]:
        return set(self._partitions)

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        self._paused.update(self._checked(partitions))

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        self._paused.difference_update(self._checked(partitions))

    def seek(self, partition: TopicPartition, offset: int) -> None:
        if offset < 0:
            raise ValueError(f"Cannot seek {partition} to negative offset {offset}.")
        (tp,) = self._checked((partition,))
        self._positions[tp] = offset

    def position(self, partition: TopicPartition) -> int | None:
        (tp,) = self._checked((partition,))
        return self._positions[tp]

    def unknown_positions(self) -> list[TopicPartition]:
        return [tp for tp in self._partitions if self._positions[tp] is None]

    def set_positions(self, positions: Mapping[TopicPartition, int]) -> None:
        for tp, offset in positions.items():
            if tp in self._positions:
                self._positions[tp] = offset

    def fetch_requests(self) -> list[tuple[TopicPartition, int]]:
        """Unpaused partitions with a known position, starting one further each time."""
        if not self._partitions:
            return []
        start = self._rotation % len(self._partitions)
        order = self._partitions[start:] + self._partitions[:start]
        return [
            (tp, position)
            for tp in order
            if tp not in self._paused and (position := self._positions[tp]) is not None
        ]

    def fetched(self, ends: Mapping[TopicPartition, int]) -> None:
        """A fetch asked for these partitions, whose logs ended at ``ends``."""
        self._ends.update(ends)

    def lag(self, partition: TopicPartition) -> int | None:
        """The last fetch's log end minus the position; None before a fetch asked for it."""
        end = self._ends.get(partition)
        position = self._positions.get(partition)
        return None if end is None or position is None else max(0, end - position)

    def advance(self, fetched: Mapping[TopicPartition, Sequence[FetchedRecord]]) -> None:
        """Move past the records ``poll`` returns, and rotate the fetch order."""
        for tp, batch in fetched.items():
            if batch:
                self._positions[tp] = batch[-1].offset + 1
        self._rotation += 1

    def _checked(self, partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
        checked = [TopicPartition(*tp) for tp in partitions]
        missing = sorted(tp for tp in checked if tp not in self._positions)
        if missing:
            names = ", ".join(str(tp) for tp in missing)
            raise IllegalStateError(f"{self._owner}: no current assignment for {names}.")
        return checked
