"""Health for orchestrators: is the client alive, is it ready to serve. ``KafkaStreams.health``.

Two questions, as a Kubernetes liveness and readiness probe ask them (``streamloop.web`` serves both at
``/health/live`` and ``/health/ready``; a service calls them from its own web framework):

- ``live()``: restarting the process would help. Not live when the client is in ERROR (or on its
  way there) or NOT_RUNNING, when a stream thread died and was not replaced (the uncaught-exception
  handler answered SHUTDOWN_THREAD; a thread being replaced counts as alive), or when a task has
  been inside its records past ``task.timeout.ms``: records wait, and it has neither finished nor
  dropped one (its positions and counts have not moved) over that long. A task paused by an error
  handler, restoring or retrying under its own timeout is not stuck.
- ``ready(max_lag=None)``: send traffic here. Ready when the client is RUNNING, no task is
  restoring its stores and, with ``max_lag``, no task is more than ``max_lag`` records behind the
  end of its partitions (a task whose lag is not measured yet counts as behind).

Each returns a ``HealthResult``: ``ok`` and a JSON-able ``reason`` (a dict: the client's state, and
one key per problem). Both read snapshots only: they never wait for a stream thread, so a thread
stuck in a record cannot hang the probe that is meant to find it.

A stuck task is seen by comparing what the calls observe: the first call that sees a task with
records waiting remembers its progress and the time; a later call that sees the same progress more
than ``task.timeout.ms`` later reports it. So the probe must be called periodically (an
orchestrator's probe is); the hot path pays nothing for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from streamloop.client_states import ClientState
from streamloop.redaction import redact_text
from streamloop.threads.states import StreamThreadState
from streamloop.threads.view import TaskRunState

if TYPE_CHECKING:
    from streamloop.tasks.task import StreamTask
    from streamloop.threads.stream_thread import StreamThread

__all__ = ["Health", "HealthResult"]


@dataclass(frozen=True, slots=True)
class HealthResult:
    """A probe's answer: ``ok``, and why, as JSON-able data (``{"state": "RUNNING", ...}``)."""

    ok: bool
    reason: dict[str, Any] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.ok


_NOT_LIVE_STATES = (ClientState.ERROR, ClientState.PENDING_ERROR, ClientState.NOT_RUNNING)


class Health:
    """The probes of one client; safe to call from any thread or event loop, never blocking."""

    def __init__(self, *, state: Callable[[], ClientState], threads: Callable[[], Sequence[StreamThread]],
                 dead_threads: Callable[[], Sequence[tuple[str, str]]], task_timeout_ms: int,
                 monotonic_ms: Callable[[], int]) -> None:
        self._state = state
        self._threads = threads
        self._dead_threads = dead_threads
        self._task_timeout_ms = task_timeout_ms
        self._monotonic_ms = monotonic_ms
        # (thread, task) -> (progress seen, when first seen so); only touched under the lock.
        self._seen: dict[tuple[str, str], tuple[tuple[int, ...], int]] = {}
        self._lock = threading.Lock()

    def live(self) -> HealthResult:
        state = self._state()
        reason: dict[str, Any] = {"state": state.name}
        ok = state not in _NOT_LIVE_STATES
        dead = [{"thread": name, "error": redact_text(error)} for name, error in self._dead_threads()]
        if dead:
            reason["dead_threads"] = dead
            ok = False
        stuck = self._stuck_tasks()
        if stuck:
            reason["stuck_tasks"] = stuck
            ok = False
        return HealthResult(ok, reason)

    def ready(self, max_lag: int | None = None) -> HealthResult:
        if max_lag is not None and max_lag < 0:
            raise ValueError(f"max_lag must be >= 0 records (or None: no bound), got {max_lag}")
        state = self._state()
        reason: dict[str, Any] = {"state": state.name}
        ok = state is ClientState.RUNNING
        details = [d for t in self._threads() if t.state.state is not StreamThreadState.DEAD
                   for d in t.task_details()]
        restoring = sorted(str(d.task_id) for d in details if d.state is TaskRunState.RESTORING)
        if restoring:
            reason["restoring_tasks"] = restoring
            ok = False
        if max_lag is not None:
            lagging = {str(d.task_id): d.lag for d in details if d.lag is None or d.lag > max_lag}
            if lagging:
                reason["lagging_tasks"] = dict(sorted(lagging.items()))
                reason["max_lag"] = max_lag
                ok = False
        return HealthResult(ok, reason)

    # -- stuck tasks -----------------------------------------------------------------
    def _stuck_tasks(self) -> list[dict[str, Any]]:
        now = self._monotonic_ms()
        stuck = []
        current: dict[tuple[str, str], tuple[tuple[int, ...], int]] = {}
        with self._lock:
            for thread in self._threads():
                if not thread.is_alive:
                    continue
                states = {d.task_id: d.state for d in thread.task_details()}
                for task in thread.view.tasks:
                    if states.get(task.id) is not TaskRunState.RUNNING or not task.buffered():
                        continue  # nothing waits, or it is paused, restoring or retrying
                    key = (thread.name, str(task.id))
                    progress = _progress(task)
                    seen = self._seen.get(key)
                    since = seen[1] if seen is not None and seen[0] == progress else now
                    current[key] = (progress, since)
                    if now - since > self._task_timeout_ms:
                        stuck.append({"task": str(task.id), "thread": thread.name, "stuck_ms": now - since,
                                      "task_timeout_ms": self._task_timeout_ms})
            self._seen = current  # tasks gone or idle are forgotten
        return stuck


def _progress(task: StreamTask) -> tuple[int, ...]:
    """What moves when a task finishes or drops a record: its counts and the sum of its positions
    (a long chunk counts its records only at its end; positions move per record)."""
    try:
        positions = sum(task.positions.next.values())
    except RuntimeError:  # the thread added a partition meanwhile: it is moving
        positions = -1
    return task.processed, task.dropped, positions
