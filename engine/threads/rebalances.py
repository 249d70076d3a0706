"""A client's rebalances as operators see them: per-thread counts and durations, and a warning
when the client stays REBALANCING too long.

A rebalance of a thread runs from the moment it starts a join (``on_partitions_revoked``) to the
moment its assignment has been taken on, however many JoinGroup and SyncGroup rounds that took.
Each one is recorded with why it started: the first join, a rejoin this thread asked for (and
why), or the group coordinator's request (another member joined, left or rejoined).

A client that livelocks in rebalances (generation after generation, never settling) shows it
without DEBUG logs: once the client has been REBALANCING for longer than its bound
(3 × ``session.timeout.ms``), ``RebalanceWatch`` logs one WARNING with the generations that
passed meanwhile and who asked for each.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from streamloop.client_states import ClientState
from streamloop.logcontext import LogContext

__all__ = ["RebalanceRecord", "RebalanceWatch", "ThreadRebalances"]

# Records a thread keeps: enough for a livelock's story, bounded however long it lasts.
_HISTORY = 64


@dataclass(frozen=True, slots=True)
class RebalanceRecord:
    thread: str
    join: int
    reason: str
    started_ms: int
    generation: int | None = None
    ended_ms: int | None = None


class ThreadRebalances:
    """Written by one stream thread's loop; read from any thread (attribute reads, a deque copy)."""

    def __init__(self, thread_name: str, clock_ms: Callable[[], int]) -> None:
        self._thread_name = thread_name
        self._clock_ms = clock_ms
        self._current: RebalanceRecord | None = None
        self._history: deque[RebalanceRecord] = deque(maxlen=_HISTORY)
        self.total = 0
        """Rebalances completed (assignments taken on)."""
        self.last_latency_ms: float = 0.0
        self.max_latency_ms: float = 0.0
        self._latency_sum_ms = 0.0
        self.last_completed_ms: int | None = None

    def started(self, join: int, reason: str) -> None:
        """A join starts; one already under way (the first, counted from the consumer's start)
        keeps its start time."""
        current = self._current
        started_ms = self._clock_ms() if current is None else current.started_ms
        self._current = RebalanceRecord(self._thread_name, join, reason, started_ms)

    def completed(self, generation: int | None) -> None:
        current, self._current = self._current, None
        now = self._clock_ms()
        if current is None:  # an assignment without a join of ours (a static member's return)
            current = RebalanceRecord(self._thread_name, 0, "the group coordinator's assignment", now)
        record = RebalanceRecord(current.thread, current.join, current.reason, current.started_ms, generation, now)
        self._history.append(record)
        latency = float(now - current.started_ms)
        self.total += 1
        self.last_latency_ms = latency
        self.max_latency_ms = max(self.max_latency_ms, latency)
        self._latency_sum_ms += latency
        self.last_completed_ms = now

    def since(self, start_ms: int) -> list[RebalanceRecord]:
        """The rebalances that started at or after ``start_ms``, the one under way included."""
        records = [r for r in list(self._history) if r.started_ms >= start_ms]
        current = self._current
        if current is not None and current.started_ms >= start_ms:
            records.append(current)
        return records

    def metrics(self) -> dict[str, float]:
        """Named after the Java consumer's coordinator metrics; latencies in ms."""
        last = self.last_completed_ms
        return {
            "rebalance-total": float(self.total),
            "rebalance-latency-last": self.last_latency_ms,
            "rebalance-latency-max": self.max_latency_ms,
            "rebalance-latency-avg": self._latency_sum_ms / self.total if self.total else 0.0,
            "last-rebalance-seconds-ago": -1.0 if last is None else (self._clock_ms() - last) / 1000,
        }


class RebalanceWatch:
    """Warns once per REBALANCING period that outlasts ``bound_ms``.

    ``state_changed`` is a listener of the client's state; ``check`` runs on every stream thread's
    loop turn (cheap: a clock read and a comparison until the bound is passed)."""

    def __init__(self, bound_ms: int, clock_ms: Callable[[], int],
                 rebalances: Callable[[], Iterable[ThreadRebalances]], log: LogContext) -> None:
        self._bound_ms = bound_ms
        self._clock_ms = clock_ms
        self._rebalances = rebalances
        self._log = log
        self._lock = threading.Lock()
        self._since_ms: int | None = None
        self._warned = False

    def state_changed(self, _old: ClientState, new: ClientState) -> None:
        with self._lock:
            if new is ClientState.REBALANCING:
                if self._since_ms is None:
                    self._since_ms = self._clock_ms()
                    self._warned = False
            else:
                self._since_ms = None

    def check(self) -> None:
        since = self._since_ms
        if since is None or self._warned:
            return
        now = self._clock_ms()
        if now - since < self._bound_ms:
            return
        with self._lock:  # one warning, whichever thread gets here first
            if self._warned or self._since_ms != since:
                return
            self._warned = True
        records = sorted((r for t in self._rebalances() for r in t.since(since)), key=lambda r: r.started_ms)
        generations = sorted({r.generation for r in records if r.generation is not None})
        self._log.warning(
            "The client has been REBALANCING for %.1f s (more than 3 × session.timeout.ms): %d generations "
            "passed without the group settling. Joins since then: %s", (now - since) / 1000, len(generations),
            "; ".join(_describe(r) for r in records) or "none (the threads are still waiting for the group)")


def _describe(record: RebalanceRecord) -> str:
    where = "still joining" if record.ended_ms is None else f"generation {record.generation}"
    return f"{record.thread} join {record.join} ({record.reason}) -> {where}"
