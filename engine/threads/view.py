"""What other threads may read about a stream thread: metadata, counters, task details, lags.

The thread's loop publishes snapshots here (``publish_tasks``, ``publish_log_ends``)
and bumps plain counters; readers on any thread (the client's metrics, the console,
interactive queries) only read attributes and copy dicts: no lock, no call into the
thread's loop, so a reader never waits for a busy or stuck thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from streamloop.ids import TaskId
from streamloop.records import TopicPartition
from streamloop.tasks.task import StreamTask, TaskState
from streamloop.threads.states import StreamThreadState

if TYPE_CHECKING:
    from collections.abc import Iterable

    from streamloop.state.store import StateStore
    from streamloop.tasks.manager import TaskManager
    from streamloop.tasks.standby import StandbyTask


@dataclass(frozen=True)
class TaskMetadata:
    """A task as seen from outside its thread."""

    task_id: TaskId
    topic_partitions: frozenset[TopicPartition]
    is_running: bool = True
    """False while the task is PAUSED by an error handler."""


class TaskRunState(Enum):
    """What a task is doing, as the console shows it."""

    RUNNING = "running"
    PAUSED = "paused"
    RETRYING = "retrying"
    """Set aside by a timeout (KIP-572), retrying until its deadline, or with records answered
    RETRY by the processing handler waiting out their back-off."""
    RESTORING = "restoring"
    """Rebuilding its state stores from their changelogs before it processes."""


@dataclass(frozen=True)
class TaskDetails:
    """A task as the console shows it: a snapshot taken from another thread."""

    task_id: TaskId
    thread_name: str
    topic_partitions: frozenset[TopicPartition]
    state: TaskRunState
    committed: dict[TopicPartition, int]
    """The last committed position per partition (partitions not committed yet are absent)."""
    lag: int | None
    """Log end minus next offset to process, summed over the partitions; None until measured."""
    timeout_deadline_in_ms: int | None
    """While retrying: milliseconds left until task.timeout.ms runs out (negative once past)."""
    paused_at: tuple[TopicPartition, int] | None
    """While paused: the partition and offset of the record the handler paused on."""
    records_processed: int
    records_dropped: int
    timeout_retries: int


@dataclass(frozen=True)
class ThreadMetadata:
    thread_name: str
    thread_state: StreamThreadState
    active_tasks: frozenset[TaskMetadata]
    consumer_client_id: str
    producer_client_id: str
    cache_size_bytes: int
    standby_tasks: frozenset[TaskMetadata] = frozenset()
    """The thread's standby tasks (``num.standby.replicas``): stores kept warm, no processing."""


class ThreadView:
    """Written by one stream thread's loop, read from anywhere (plain attribute reads)."""

    def __init__(self, thread_name: str) -> None:
        self.thread_name = thread_name
        self.manager: TaskManager | None = None
        self.tasks: tuple[StreamTask, ...] = ()
        """The tasks as of the last change."""
        self.active: frozenset[TaskMetadata] = frozenset()
        self.standby: frozenset[TaskMetadata] = frozenset()
        self.log_ends: dict[TopicPartition, int] = {}
        """Log end offsets of the tasks' partitions, refreshed at most once a second by the loop."""
        self.records_polled = 0
        self.polls = 0

    # -- written by the thread's loop ---------------------------------------------
    def publish_tasks(self) -> None:
        manager = self.manager
        if manager is not None:
            self.active = frozenset(TaskMetadata(t.id, t.partitions, not t.is_paused)
                                    for t in manager.tasks.values())
            self.tasks = tuple(manager.tasks.values())

    def publish_standbys(self, tasks: Iterable[StandbyTask]) -> None:
        self.standby = frozenset(TaskMetadata(t.id, frozenset(t.inputs)) for t in tasks)

    def clear_tasks(self) -> None:
        self.active = frozenset()
        self.standby = frozenset()

    # -- read from any thread ------------------------------------------------------
    def local_stores(self, name: str) -> list[StateStore]:
        """The running tasks' instances of store ``name`` (for interactive queries)."""
        stores = []
        for task in self.tasks:
            manager = task.state_manager
            if manager is not None and name in manager.stores and task.state.state is TaskState.RUNNING:
                stores.append(manager.stores[name])
        return stores

    def counters(self, cache_bytes: int, cache_evictions: int) -> dict[str, float]:
        """Running totals for metrics."""
        manager = self.manager
        tasks = self.tasks
        closed_processed = manager.closed_processed if manager is not None else 0
        closed_timeouts = manager.closed_timeouts if manager is not None else 0
        return {
            "records-polled-total": float(self.records_polled),
            "poll-total": float(self.polls),
            "process-total": float(closed_processed + sum(t.processed for t in tasks)),
            "commit-total": float(manager.commits if manager is not None else 0),
            "timeout-retries-total": float(closed_timeouts + sum(t.timeouts for t in tasks)),
            # Tasks paused now (a PAUSE answer not yet resumed), not pause events (pause-total).
            "paused-tasks-total": float(sum(t.is_paused for t in tasks)),
            "record-cache-bytes": float(cache_bytes),
            "record-cache-evictions-total": float(cache_evictions),
        }

    def task_counters(self) -> list[tuple[TaskId, dict[str, float]]]:
        return [(t.id, task_counters(t)) for t in self.tasks]

    def task_lags(self) -> dict[TaskId, int]:
        """Each task's lag: last known log end minus the next offset to process, summed over its
        partitions (a task not measured yet has none)."""
        ends = self.log_ends
        lags: dict[TaskId, int] = {}
        for task in self.tasks:
            if not all(tp in ends for tp in task.partitions):
                continue
            total = 0
            for tp in task.partitions:
                position = task.position(tp)
                if position is None:
                    position = task.group_committed.get(tp, 0)
                total += max(0, ends[tp] - position)
            lags[task.id] = total
        return lags

    def task_details(self, now_ms: int) -> list[TaskDetails]:
        """Each active task's state, offsets, lag and timeout deadline (attribute reads and dict
        copies of the task's own fields)."""
        lag = self.task_lags()
        result = []
        for task in self.tasks:
            deadline = task.timer.deadline_ms
            if task.is_paused:
                state = TaskRunState.PAUSED
            elif task.state.state in (TaskState.CREATED, TaskState.RESTORING) and task.state_manager is not None:
                state = TaskRunState.RESTORING
            elif deadline is not None or task.timer.records.waiting:
                state = TaskRunState.RETRYING
            else:
                state = TaskRunState.RUNNING
            result.append(TaskDetails(
                task.id, self.thread_name, task.partitions, state, task.committed_offsets(), lag.get(task.id),
                None if deadline is None else deadline - now_ms, task.paused_at, task.processed, task.dropped,
                task.timeouts))
        return sorted(result, key=lambda d: d.task_id)


def task_counters(task: StreamTask) -> dict[str, float]:
    """One task's ``stream-task-metrics`` counters (``KafkaStreams.metrics``, the test driver's ``task_metrics``)."""
    return {"records-processed-total": float(task.processed),
            "dropped-records-total": float(task.dropped),
            "timeout-retries-total": float(task.timeouts),
            "enforced-processing-total": float(task.input.enforced),
            "record-retries-total": float(task.retries),
            "record-retries-exhausted-total": float(task.retries_exhausted),
            "paused": float(task.is_paused),
            "restore-records-total": float(task.state_manager.restored if task.state_manager else 0)}
