"""Time comes from a ``Clock`` so that every deadline can be tested on a manual one."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def wall_ms(self) -> int:
        """Milliseconds since the epoch (record timestamps, wall-clock punctuation)."""

    def monotonic_ms(self) -> int:
        """Milliseconds on a clock that never goes back (intervals, deadlines)."""


class SystemClock:
    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when told to (``advance``); safe to share between threads."""

    def __init__(self, start_ms: int = 0) -> None:
        self._now = start_ms
        self._lock = threading.Lock()

    def wall_ms(self) -> int:
        return self._now

    def monotonic_ms(self) -> int:
        return self._now

    def advance(self, ms: int) -> None:
        if ms < 0:
            raise ValueError(f"A clock cannot go back ({ms} ms)")
        with self._lock:
            self._now += ms


SYSTEM_CLOCK = SystemClock()
