"""Which run loop runs a task's records: the one choice, for a client's tasks and the test driver's.

- ``SequentialLoop`` (``sequential.py``): one record at a time, the default and the hot path.
- ``InFlightWindow`` (``in_flight.py``): several records at once (``num.threads.per.task`` > 1,
  or a processor's ``concurrency=``), ordered by ``processing.ordering``.
- ``BatchWindow`` (``bulk.py``): a Spark stage right after the source takes its records in
  batches, one entry per batch (when records may be in flight, as for a Spark stage).
- ``ExecutorWindow`` (``bulk_exec.py``): such a stage with ``read="executors"``: Spark's
  executors read the task's offset ranges from Kafka; no record reaches this process.

Every loop runs records by the task's one per-record path (``processing.RecordPath``) and passes
them (position and stream time) in offset order per partition; what differs is how many run at
once and when their output leaves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from streamloop.records import TopicPartition

from .bulk import bulk_window
from .bulk_exec import ExecutorReads, executor_window
from .in_flight import InFlightWindow
from .record_slots import HeldCollector
from .sequential import SequentialLoop

if TYPE_CHECKING:
    from .bulk_jobs import StageJobs
    from .task import StreamTask

__all__ = ["InFlightPlan", "RunLoop", "run_loop"]


@dataclass(frozen=True)
class InFlightPlan:
    """Records of the task run in flight: at most ``limit`` at once, in ``ordering``, their output
    held by ``collector`` until their turn."""

    limit: int
    ordering: str
    collector: HeldCollector


class RunLoop(Protocol):
    async def run(self) -> None:
        """Until the task closes."""

    async def drain(self) -> None:
        """Until nothing is buffered or in flight (the test driver)."""

    def lowest_in_flight(self, tp: TopicPartition) -> int | None:
        """The lowest offset of ``tp`` still running or holding output: positions stay below it."""

    def resumed(self, tp: TopicPartition, start: int, skipped: int | None) -> None:
        """A resume reads ``tp`` again from ``start``: what was taken at or above it before (still
        running, or done and waiting for its turn) is not done, its output does not leave and its
        failures are not asked about (they are, once read again). ``skipped``: the paused record,
        when the resume goes past it (at or above ``start`` only when buffered records below it were
        dropped by the pause)."""


def run_loop(task: StreamTask, in_flight: InFlightPlan | None,
             skips: Mapping[TopicPartition, frozenset[int]],
             spark_jobs: dict[str, StageJobs] | None,
             executor_reads: ExecutorReads | None = None) -> RunLoop:
    # A Spark stage whose executors read Kafka: the records never reach this process.
    executors = executor_window(task, executor_reads)
    if executors is not None:
        return executors
    if in_flight is None:
        # After an owner with records in flight (num.threads.per.task lowered), what it finished
        # above its commit is skipped here too: under exactly-once its output is committed.
        return SequentialLoop(task, skips)
    # A Spark stage right after the source takes its records in bulk: one entry per batch.
    bulk = bulk_window(task, spark_jobs)
    if bulk is not None:
        return bulk
    return InFlightWindow(task, in_flight.limit, in_flight.ordering, in_flight.collector, skips)
