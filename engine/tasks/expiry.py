"""A task's side of stores with a time to live (``streamloop.state.ttl``): their clocks and sweeps.

Each such store gets "now" from its task (stream time, the record in progress included, for
record time; the task's wall clock otherwise) and a punctuation of the same clock that runs one
bounded sweep step every ``sweep_interval_ms``. Both are wired when the task manager creates the
task, before the task exists (its stream time is read through ``task()`` once it does), as its
restore is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from streamloop.processors.context import TaskContext
from streamloop.state.task_state import TaskStateManager
from streamloop.state.ttl import NEVER, ExpiryClock, TtlKeyValueStore

if TYPE_CHECKING:
    from .task import StreamTask


def schedule_expiry(state: TaskStateManager, context: TaskContext, task: Callable[[], StreamTask | None]) -> int:
    """Bind the clocks of ``state``'s stores with a time to live and schedule their sweeps in
    ``context``; returns how many stores that was. ``task()`` is None until the task exists (a
    processor's ``init`` may read a store before): nothing has expired then."""
    stores = [s for s in state.stores.values() if isinstance(s, TtlKeyValueStore)]
    for store in stores:
        ttl = store.ttl
        if ttl.clock is ExpiryClock.RECORD_TIME:
            store.bind_clock(lambda: _stream_time(task()))
            context.stream_time_schedules.schedule(
                0, ttl.sweep_interval_ms, _sweep_on_stream_time(store, task), f"ttl-sweep-{store.name}")
        else:
            store.bind_clock(context.wall_clock_ms)
            context.wall_clock_schedules.schedule(
                context.wall_clock_ms(), ttl.sweep_interval_ms, _sweep_on_wall_clock(store, task),
                f"ttl-sweep-{store.name}")
    return len(stores)


def _stream_time(task: StreamTask | None) -> int:
    """The task's stream time, counting the record in progress (as Kafka Streams' stream time
    does: it moves when a record is taken, before the record is processed)."""
    if task is None:
        return NEVER
    return max(task.input.stream_time, task.record_time)


def _sweep_on_stream_time(store: TtlKeyValueStore, task: Callable[[], StreamTask | None]) -> Callable[[int], int]:
    def sweep(now: int) -> int:
        current = task()
        if current is None or not current.is_running:
            return 0
        cause = _last_taken(current)
        # Stream time moves only as records pass, so one has; without its position no tombstone
        # could be tagged, and an untagged one would be applied by a restore too early.
        return 0 if cause is None else store.sweep(now, cause)
    return sweep


def _sweep_on_wall_clock(store: TtlKeyValueStore, task: Callable[[], StreamTask | None]) -> Callable[[int], int]:
    def sweep(now: int) -> int:
        current = task()
        # Only once the store is restored (the test driver fires wall-clock punctuations of a task
        # that has not started yet when its clock is moved before any record).
        if current is None or not current.is_running:
            return 0
        # Untagged: a restore always applies these tombstones. The wall clock only moves on, so
        # an entry expired when one was written is expired for every record replayed after it.
        return store.sweep(now, None)
    return sweep


def _last_taken(task: StreamTask) -> tuple[str, int] | None:
    """The last record taken of the task's partition with the latest time: one after which stream
    time had reached the sweep's "now" (it runs as the records pass). The source a record-time sweep
    tags its tombstones with (``TtlKeyValueStore.sweep``): a restore applies one once a commit covers
    that record, as the first commit after the sweep does, and never from an earlier commit, whose
    replayed records saw the entry before it expired.

    Not the next record: a sweep's delete may replace a covered write of the key in the record
    cache (a late write, expired when made), and a commit that did not count the delete would
    restore the key's older value instead of either."""
    positions = task.positions.next
    if not positions:
        return None
    tp = max(positions, key=lambda p: (task.input.partition_time(p), p))
    return tp[0], positions[tp] - 1
