"""``SparkBatchStage``: a task's records in micro-batches, each run on Spark off the loop.

Built on records in flight (``engine.tasks.in_flight``): each record's ``process``
joins the task's open batch and awaits that batch. The first record of a batch
drives it: it waits until the batch holds ``max.records`` or ``max.wait.ms`` has
passed, then runs the job on a worker thread (``anyio.to_thread.run_sync``), at most
``max.in.flight`` batches of the task at once (a ``CapacityLimiter``). The rows that
come back are forwarded in the context of the batch's last record, so they leave
when that record is released, in offset order.

What that gives, with no commit logic of its own:

- At-least-once: every record of a batch stays in flight until the batch's output is
  handed on (or written, for a sink), and commits never pass a record in flight. A
  crash mid-batch re-reads the whole batch.
- Back-pressure: the sub-topology's window is ``max.records × max.in.flight`` records,
  so a slow cluster stops new records, then fetching.
- Errors: a failing job raises ``SparkBatchError`` for each of its records, which go
  to the processing exception handler one by one. With ``schema=``, a record whose value
  does not fit it is left out of the batch before Spark is called and raises its own
  ``SparkSchemaError`` (the rest of the batch runs); a batch that runs past
  ``spark.batch.timeout.ms`` is cancelled (by its Spark job tag) and each record gets a
  ``SparkBatchTimeoutError``, a timeout retried under ``task.timeout.ms``.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from engine import config as cfg
from engine.errors import SparkBatchError, SparkBatchTimeoutError, SparkSchemaError, TopologyError
from engine.records import Record

from .failures import SparkBatchTransientError, is_transient
from .frames import to_frame, to_records, to_rows
from .schema import SchemaMismatch, resolve_schema

if TYPE_CHECKING:
    from engine.processors.context import NodeContext

    from .session import SparkSessions

log = logging.getLogger(__name__)

_tags = itertools.count()


@dataclass(frozen=True)
class BatchSettings:
    """A stage's batching; ``None`` takes the ``spark.batch.*`` config key."""

    max_records: int | None = None
    max_wait_ms: int | None = None
    max_in_flight: int | None = None

    def resolve(self, config: Mapping[str, Any]) -> tuple[int, int, int]:
        return (
            self.max_records if self.max_records is not None else config.get(cfg.SPARK_BATCH_MAX_RECORDS, 10_000),
            self.max_wait_ms if self.max_wait_ms is not None else config.get(cfg.SPARK_BATCH_MAX_WAIT_MS, 1_000),
            self.max_in_flight if self.max_in_flight is not None
            else config.get(cfg.SPARK_BATCH_MAX_IN_FLIGHT, 2),
        )

    def window(self, config: Mapping[str, Any]) -> int:
        """Records of a task in flight: enough for every batch allowed to run, and never 1
        (a window of one would process records one by one, each waiting ``max.wait.ms``)."""
        records, _wait, in_flight = self.resolve(config)
        return max(2, records * in_flight)

    def check(self, stage: str) -> None:
        for name, value, low in (("max_records", self.max_records, 1), ("max_wait_ms", self.max_wait_ms, 0),
                                 ("max_batches_in_flight", self.max_in_flight, 1)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise TopologyError(f"{name} of Spark stage '{stage}' must be an int >= {low}, got {value!r}")


# A batch's work on the worker thread: the batch as a DataFrame in, rows out (None for a sink).
BatchJob = Callable[[Any], "list[dict[str, Any]] | None"]
# What a batch's run gives back: the job's rows, and the records left out of the frame by index.
BatchResult = tuple["list[dict[str, Any]] | None", "dict[int, SchemaMismatch]"]


class Batch:
    """The records of one micro-batch and, once it ran, its rows or its error."""

    __slots__ = ("records", "full", "done", "rows", "left_out", "carrier", "error")

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.full = anyio.Event()
        self.done = anyio.Event()
        self.rows: list[dict[str, Any]] | None = None
        self.left_out: dict[int, SchemaMismatch] = {}
        self.carrier = -1
        self.error: BaseException | None = None

    def ran(self, result: BatchResult) -> None:
        """Keep a run's rows and left-out records, and pick the ``carrier``: the index of the
        record that the rows leave with.

        That is the last record, released after every other one. When records were left out,
        it is the last record before the first of them: a PAUSE at a record drops the output
        of every record from it on, so rows riding on a later record would be lost for the
        records before it. When the very first record was left out, it is the last that fits.
        """
        self.rows, self.left_out = result
        if not self.left_out:
            self.carrier = len(self.records) - 1
        elif (first := min(self.left_out)) > 0:
            self.carrier = first - 1
        else:
            self.carrier = max((i for i in range(len(self.records)) if i not in self.left_out), default=-1)


class SparkBatchStage:
    """The processor behind ``spark_batch`` and ``to_spark``; one per task."""

    def __init__(self, name: str, job: BatchJob, settings: BatchSettings, key_column: str,
                 value_columns: Sequence[str] | None, schema: Any = None) -> None:
        self.name = name
        self._job = job
        self._settings = settings
        self._key_column = key_column
        self._value_columns = value_columns
        self._schema = schema
        self._resolved_schema: Any = None
        self._open: Batch | None = None
        self._limiter: anyio.CapacityLimiter | None = None
        self.batches = 0

    def init(self, context: NodeContext) -> None:
        sessions = context.spark
        if sessions is None:
            raise TopologyError(f"Spark stage '{self.name}' runs only inside a KafkaStreams client")
        self._context = context
        self._sessions: SparkSessions = sessions
        config = sessions.config
        self._max_records, wait_ms, self._max_in_flight = self._settings.resolve(config)
        self._max_wait_s = wait_ms / 1000.0
        self._timeout_ms: int = config.get(cfg.SPARK_BATCH_TIMEOUT_MS, 0)
        self._tag_prefix = f"streamloop-{context.application_id}-{context.task_id}-{self.name}"

    def process(self, record: Record) -> Any:
        return self._join(record)

    def close(self) -> None:
        pass

    async def _join(self, record: Record) -> None:
        batch = self._open
        drives = batch is None
        if batch is None:
            batch = self._open = Batch()
        index = len(batch.records)
        batch.records.append(record)
        if len(batch.records) >= self._max_records:
            self._open = None
            batch.full.set()
        if drives:
            await self._drive(batch)
        else:
            await batch.done.wait()
        if batch.error is not None:
            if isinstance(batch.error, SparkBatchTimeoutError):
                raise SparkBatchTimeoutError(self.name, len(batch.records), self._timeout_ms) from batch.error
            if is_transient(batch.error):  # a lost executor or worker: retried under task.timeout.ms
                raise SparkBatchTransientError(self.name, len(batch.records), batch.error) from batch.error
            raise SparkBatchError(self.name, len(batch.records), batch.error) from batch.error
        mismatch = batch.left_out.get(index)
        if mismatch is not None:
            context = self._context
            raise SparkSchemaError(self.name, mismatch.field, mismatch.expected, mismatch.found,
                                   context.topic, context.partition, context.offset) from None
        if batch.rows is not None and index == batch.carrier:
            for out in to_records(batch.rows, self._key_column, self._value_columns, record.timestamp):
                self._context.forward(out)

    async def _drive(self, batch: Batch) -> None:
        opened = time.monotonic()
        with anyio.move_on_after(self._max_wait_s):
            await batch.full.wait()
        if self._open is batch:
            self._open = None
        log.debug("Spark stage '%s' sealed a batch of %d records after %.3f s", self.name, len(batch.records),
                  time.monotonic() - opened)
        try:
            if self._limiter is None:
                self._limiter = anyio.CapacityLimiter(self._max_in_flight)  # made on this task's loop
            async with self._limiter:
                started = time.monotonic()
                batch.ran(await self._run(batch))
            self.batches += 1
            log.debug("Spark stage '%s' ran a batch of %d records in %.3f s", self.name, len(batch.records),
                      time.monotonic() - started)
        except Exception as exc:  # noqa: BLE001 - every record of the batch reports it
            batch.error = exc
        finally:
            batch.done.set()

    async def _run(self, batch: Batch) -> BatchResult:
        tag = f"{self._tag_prefix}-{next(_tags)}"
        work = functools.partial(self._on_worker, list(batch.records), tag)
        try:
            with anyio.fail_after(self._timeout_ms / 1000.0 if self._timeout_ms else None):
                # Abandoned on cancel: a task closed dirty must not wait for the cluster.
                return await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
        except TimeoutError as exc:
            # The worker thread was left behind; cancelling the job lets it end.
            await anyio.to_thread.run_sync(self._cancel, tag)
            raise SparkBatchTimeoutError(self.name, len(batch.records), self._timeout_ms) from exc
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._cancel, tag)
            raise

    def _on_worker(self, records: list[Record], tag: str) -> BatchResult:
        session = self._sessions.get()
        context = session.sparkContext
        context.addJobTag(tag)
        context.setInterruptOnCancel(True)
        try:
            if self._schema is not None and self._resolved_schema is None:
                # Two batches in flight may both resolve it: the same schema either way.
                self._resolved_schema = resolve_schema(session, self._schema)
            frame, left_out = to_frame(session, records, self._key_column, self._resolved_schema)
            # No record fits the schema: nothing for Spark to do, each record reports its own error.
            return (None if frame is None else self._job(frame)), left_out
        finally:
            context.removeJobTag(tag)

    def _cancel(self, tag: str) -> None:
        if not self._sessions.started:
            return
        try:
            self._sessions.get().sparkContext.cancelJobsWithTag(tag)
        except Exception:  # noqa: BLE001 - the batch failed already; cancelling is best effort
            log.warning("Could not cancel the Spark jobs tagged %s", tag, exc_info=True)


def transform_job(fn: Callable[[Any], Any], stage: str) -> BatchJob:
    """The job of ``spark_batch``: ``fn(DataFrame) -> DataFrame``, its rows collected."""
    def run(frame: Any) -> list[dict[str, Any]]:
        return to_rows(fn(frame), stage)

    return run
