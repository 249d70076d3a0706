"""The client's stream threads: names, indices, cache shares, failure count.

Indices: a new thread takes the lowest index that no thread in the registry
uses. DEAD threads are dropped first, but a thread that is still shutting down
keeps its index until it is DEAD (KAFKA-12375), so a replacement started from a
dying thread's handler gets another one.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from streamloop.threads.stream_thread import StreamThread, StreamThreadState


class ThreadRegistry:
    def __init__(self) -> None:
        self._threads: list[StreamThread] = []
        self.lock = threading.RLock()
        self.failed_threads = 0

    def snapshot(self) -> list[StreamThread]:
        """A copy that is safe to iterate from any thread without the lock."""
        return list(self._threads)

    def __iter__(self) -> Iterator[StreamThread]:
        return iter(self.snapshot())

    def trim_dead(self) -> None:
        with self.lock:
            self._threads = [t for t in self._threads if t.state.state is not StreamThreadState.DEAD]

    def next_index(self) -> int:
        with self.lock:
            self.trim_dead()
            used = {t.index for t in self._threads}
            index = 1
            while index in used:
                index += 1
            return index

    def add(self, thread: StreamThread) -> None:
        with self.lock:
            self._threads.append(thread)

    def remove(self, thread: StreamThread) -> None:
        """Lock-free on purpose: a dying thread calls it while it holds its own state lock, and a
        caller holding this registry's lock may be waiting for that state lock (shutting it down).
        ``list.remove`` is atomic; ``trim_dead`` drops the thread too should it miss the list."""
        with contextlib.suppress(ValueError):
            self._threads.remove(thread)

    def alive(self) -> list[StreamThread]:
        return [t for t in self.snapshot() if t.is_alive]

    def current(self) -> StreamThread | None:
        """The stream thread the caller runs on, if any."""
        return next((t for t in self.snapshot() if t.is_current), None)

    def resize_caches(self, total: int, uncommitted: int = -1) -> int:
        """Split ``total`` (and ``uncommitted``, the bound of writes held until a commit; -1: none)
        evenly over the alive threads; returns the cache share."""
        alive = self.alive()
        share = total // len(alive) if alive else total
        held = uncommitted // len(alive) if alive and uncommitted >= 0 else uncommitted
        for thread in alive:
            thread.resize_cache(share)
            thread.uncommitted.resize(held)
        return share
