"""What the task manager decides for a task before it exists, handed to it at construction
(``StreamTask(..., setup)``): a task is complete when constructed, never wired up afterwards."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from streamloop.ids import TaskId
from streamloop.logcontext import LogContext
from streamloop.metrics import ProcessMeter
from streamloop.processors.context import CURRENT, TaskContext
from streamloop.records import TopicPartition
from streamloop.serdes import Serde
from streamloop.state.task_state import StateSettings, TaskStateManager
from streamloop.transport.base import OffsetAndMetadata

from .error_handling import ErrorHandling
from .record_slots import RecordJournals
from .timeouts import TaskTimer

if TYPE_CHECKING:
    from streamloop.collector import RecordCollector
    from streamloop.state.stores import StoreBuilder

    from .bulk_exec import ExecutorReads
    from .bulk_jobs import StageJobs
    from .loops import InFlightPlan
    from .partition_group import IdleRule
    from .task import StreamTask
    from .tracing import TaskTracing

__all__ = ["Committed", "ExactlyOnceTask", "TaskSetup", "task_state"]

Committed = Mapping[TopicPartition, OffsetAndMetadata | None]
"""A task's partitions' committed positions, read once when it starts."""



@dataclass(frozen=True)
class ExactlyOnceTask:
    """Exactly-once: the task's own collector (over its transactional producer), how it starts
    (the producer, which fences a previous owner), how it rewinds to its commit once started, and
    whom to tell when its transaction fails."""

    collector: RecordCollector
    start: Callable[[], Awaitable[object]]
    rewind: Callable[[Committed], None]
    on_failed: Callable[[StreamTask], None]


@dataclass(frozen=True)
class TaskSetup:
    """What the task manager decided for a task, all of it given at construction."""

    errors: ErrorHandling | None = None
    meter: ProcessMeter = field(default_factory=ProcessMeter)
    timer: TaskTimer | None = None
    on_pause: Callable[[StreamTask], None] | None = None
    state: TaskStateManager | None = None
    # Restores the stores, given the committed positions of the task's partitions.
    restore: Callable[[Committed], Awaitable[object]] | None = None
    # Reads a partition's committed position (once per partition, when the task starts).
    committed: Callable[[TopicPartition], Awaitable[OffsetAndMetadata | None]] | None = None
    exactly_once: ExactlyOnceTask | None = None
    in_flight: InFlightPlan | None = None
    # The Spark jobs the bulk path shares with the thread's other tasks, by stage.
    spark_jobs: dict[str, StageJobs] | None = None
    # With tracing.enabled: the task's spans (streamloop.tasks.tracing); None costs nothing per record.
    tracing: TaskTracing | None = None
    # The group consumer's side of a Spark stage that reads on the executors (streamloop.tasks.bulk_exec).
    executor_reads: ExecutorReads | None = None
    # max.task.idle.ms and the consumer's fetch lag (None: never wait, as the test driver runs).
    idle: IdleRule | None = None


def task_state(settings: StateSettings, application_id: str, task_id: TaskId, builders: Iterable[StoreBuilder],
               context: TaskContext, serdes: tuple[Serde, Serde], append: Callable[..., None], in_flight: bool,
               logger: LogContext, tracing: TaskTracing | None) -> TaskStateManager:
    """The task's stores (``builders``: its sub-topology's), whose updates take their time and
    source record from the record being processed: the context's, or the record in flight's."""

    def timestamp() -> int:
        slot = CURRENT.get()
        return context.timestamp if slot is None else slot.timestamp

    def source() -> tuple[str, int] | None:
        slot = CURRENT.get()
        if slot is not None:
            return slot.raw.topic, slot.raw.offset
        if context.topic is None or context.offset is None:
            return None
        return context.topic, context.offset

    if tracing is not None:
        # Each update remembers its record's span, to go down in it when a cache holds it.
        source = tracing.source(source)
    manager = TaskStateManager(
        str(task_id), application_id, settings.state_dir, task_id.partition, builders,
        settings.default_persistent, serdes[0], serdes[1], append,
        # Records in flight finish out of order: their updates go down at once, uncached, and
        # each record journals its own (a retried one undoes its updates first).
        None if in_flight else settings.cache, timestamp, source, logger,
        journal=RecordJournals() if in_flight else None, budget=settings.uncommitted,
        request_commit=functools.partial(setattr, context, "commit_requested", True))
    if tracing is not None:
        tracing.trace_flushes(manager)
    return manager
