"""What the task manager decides for a task before it exists, handed to it at construction
(``StreamTask(..., setup)``): a task is complete when constructed, never wired up afterwards."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from streamloop.metrics import ProcessMeter
from streamloop.records import TopicPartition
from streamloop.transport.base import OffsetAndMetadata

from .error_handling import ErrorHandling
from .timeouts import TaskTimer

if TYPE_CHECKING:
    from streamloop.collector import RecordCollector
    from streamloop.state.task_state import TaskStateManager

    from .bulk_exec import ExecutorReads
    from .bulk_jobs import StageJobs
    from .loops import InFlightPlan
    from .partition_group import IdleRule
    from .task import StreamTask
    from .tracing import TaskTracing

__all__ = ["Committed", "ExactlyOnceTask", "TaskSetup"]

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
