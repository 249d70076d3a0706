"""Per-task punctuation schedules on stream time and on wall-clock time.

Stream time is the largest record timestamp the task has seen; it only moves
when records arrive. A schedule fires at most once per call even if time jumped
several intervals (Kafka Streams does the same), then aligns to the next
interval after the current time.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from streamloop.processors.api import PunctuationType


@dataclass(order=True)
class Schedule:
    due: int
    seq: int
    interval: int = field(compare=False)
    kind: PunctuationType = field(compare=False)
    callback: Callable[[int], Any] = field(compare=False)
    node_name: str = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class PunctuationQueue:
    """The schedules of one kind for one task, ordered by due time."""

    def __init__(self, kind: PunctuationType) -> None:
        self.kind = kind
        self._heap: list[Schedule] = []
        self._seq = itertools.count()

    def schedule(self, now: int, interval: int, callback: Callable[[int], Any], node_name: str) -> Schedule:
        if interval < 1:
            raise ValueError(f"Punctuation interval must be at least 1 ms, got {interval}")
        entry = Schedule(now + interval, next(self._seq), interval, self.kind, callback, node_name)
        heapq.heappush(self._heap, entry)
        return entry

    def next_due(self) -> int | None:
        while self._heap and self._heap[0].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0].due if self._heap else None

    def due(self, now: int) -> list[Schedule]:
        """Pop the schedules due at ``now`` and re-arm them for their next interval."""
        fired: list[Schedule] = []
        while self._heap and self._heap[0].due <= now:
            entry = heapq.heappop(self._heap)
            if entry.cancelled:
                continue
            fired.append(entry)
        for entry in fired:
            # Skip missed intervals: the next firing is the first one after now.
            missed = (now - entry.due) // entry.interval + 1
            entry.due += missed * entry.interval
            entry.seq = next(self._seq)
            heapq.heappush(self._heap, entry)
        return fired

    def __len__(self) -> int:
        return sum(1 for e in self._heap if not e.cancelled)


PunctuatorResult = Awaitable[None] | None
