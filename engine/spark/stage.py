"""``SparkBatchStage``: a task's records in micro-batches, each run on Spark off the loop.

Built on records in flight (``streamloop.tasks.in_flight``): each record's ``process``
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
- Back-pressure: the sub-topology's window is ``max.records x max.in.flight`` records,
  so a slow cluster stops new records, then fetching.
- Errors: a failing job raises ``SparkBatchError`` for each of its records, which go
  to the processing exception handler one by one. With ``schema=``, a record whose value
  does not fit it is left out of the batch before Spark is called and raises its own
  ``SparkSchemaError`` (the rest of the batch runs); a batch that runs past
  ``spark.batch.timeout.ms`` is cancelled (by its Spark job tag) and each record gets a
  ``SparkBatchTimeoutError``, a timeout retried under ``task.timeout.ms``.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.to_thread

from streamloop import config as cfg
from streamloop.errors import SparkBatchError, SparkBatchTimeoutError, SparkSchemaError, TopologyError
from streamloop.processors.nodes import Node, SinkNode
from streamloop.records import ConsumerRecord, Record
from streamloop.serdes import BytesSerde, IntegerSerde, JsonSerde, Serde, StringSerde

from .failures import SparkBatchTransientError, is_transient
from .frames import Decoded, create_frame, decode, to_arrow, to_frame, to_records
from .parts import BatchJob, Part, TransformJob, row_wise, run_combined, run_parts, transform_job
from .schema import SchemaMismatch, resolve_schema
from .timing import JobClock
from .timing import finish as finish_clock
from .timing import start as start_clock

if TYPE_CHECKING:
    from streamloop.processors.context import NodeContext

    from .session import SparkSessions

log = logging.getLogger(__name__)

_tags = itertools.count()
T = TypeVar("T")


@dataclass(frozen=True)
class BatchSettings:
    """A stage's batching; ``None`` takes the ``spark.batch.*`` config key."""

    max_records: int | None = None
    max_wait_ms: int | None = None
    max_in_flight: int | None = None

    def resolve(self, config: Mapping[str, Any], read: str = cfg.SPARK_READ_DRIVER) -> tuple[int, int, int]:
        """Records per batch (per range when ``read`` is executors), ms a batch waits, batches at once."""
        if self.max_records is not None:
            records = self.max_records
        elif read == cfg.SPARK_READ_EXECUTORS:
            # A range's records stay on the executors: a bigger range spreads a job's fixed cost
            # (two planned data sources, two jobs) over more of them.
            records = config.get(cfg.SPARK_BATCH_READ_MAX_RECORDS, cfg.default(cfg.SPARK_BATCH_READ_MAX_RECORDS))
        else:
            records = config.get(cfg.SPARK_BATCH_MAX_RECORDS, cfg.default(cfg.SPARK_BATCH_MAX_RECORDS))
        return (
            records,
            self.max_wait_ms if self.max_wait_ms is not None else config.get(cfg.SPARK_BATCH_MAX_WAIT_MS,
                                                                               cfg.default(cfg.SPARK_BATCH_MAX_WAIT_MS)),
            self.max_in_flight if self.max_in_flight is not None
            else config.get(cfg.SPARK_BATCH_MAX_IN_FLIGHT, cfg.default(cfg.SPARK_BATCH_MAX_IN_FLIGHT)),
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


# What a batch's run gives back: the job's rows, and the records left out of the frame by index.
BatchResult = tuple["list[dict[str, Any]] | None", "dict[int, SchemaMismatch]"]
# What a batch of fetched records gives back: the records decoded (and those that failed to),
# the output records (None: the job gave none back, a sink), the decoded records left out,
# the record the output leaves with (None: no output), the job's error if it raised, and the
# output's key and value bytes when they were made on the worker (``serialize_for``).
FetchedResult = tuple[Decoded, "list[Record] | None", "dict[int, SchemaMismatch]", "ConsumerRecord | None",
                      "Exception | None", "list[tuple[bytes | None, bytes | None]] | None"]


class Batch:
    """The records of one micro-batch and, once it ran, its rows or its error."""

    __slots__ = ("carrier", "done", "error", "full", "left_out", "records", "rows")

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
        self.carrier = carrier_of(len(self.records), self.left_out)


def carrier_of(size: int, left_out: Mapping[int, Any]) -> int:
    """The index of the record a batch's rows leave with (see ``Batch.ran``); -1: none fits."""
    if not left_out:
        return size - 1
    if (first := min(left_out)) > 0:
        return first - 1
    return max((i for i in range(size) if i not in left_out), default=-1)


class SparkBatchStage:
    """The processor behind ``spark_batch`` and ``to_spark``; one per task."""

    def __init__(self, name: str, job: BatchJob, settings: BatchSettings, key_column: str,
                 value_columns: Sequence[str] | None, schema: Any = None, read: str | None = None) -> None:
        self.name = name
        # Who reads the stage's records (streamloop.spark.kafka_source); None: spark.batch.read.
        self.read_setting = read
        self.read = read or cfg.SPARK_READ_DRIVER
        self._job = job
        # ``to_spark``: the job writes as it runs, and a job given up may still write (the cancel
        # comes after its write, or before a job its worker thread then starts).
        self.writes = not isinstance(job, TransformJob)
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
        self.read = self.read_setting or config.get(cfg.SPARK_BATCH_READ, cfg.SPARK_READ_DRIVER)
        self._max_records, wait_ms, self._max_in_flight = self._settings.resolve(config, self.read)
        self._max_wait_s = wait_ms / 1000.0
        self._timeout_ms: int = config.get(cfg.SPARK_BATCH_TIMEOUT_MS, 0)
        self.bulk: bool = config.get(cfg.SPARK_BATCH_BULK, True)
        self.shared: bool = config.get(cfg.SPARK_BATCH_SHARED, True)
        self.max_bytes: int = config.get(cfg.SPARK_BATCH_MAX_BYTES, 0)
        self.max_shared_ms: int = config.get(cfg.SPARK_BATCH_SHARED_MAX_MS, 10_000)
        self.eager: bool = config.get(cfg.SPARK_BATCH_EAGER, True)
        self._tag_prefix = f"streamloop-{context.application_id}-{context.task_id}-{self.name}"

    def executor_job(self) -> tuple[BatchJob, str, Sequence[str] | None, Any]:
        """The job, key column, value columns and declared schema: what the executors' read path
        (``streamloop.tasks.bulk_exec``) runs the stage with."""
        return self._job, self._key_column, self._value_columns, self._schema

    def batching(self) -> tuple[int, float, int]:
        """Records per batch, seconds a batch waits to fill, batches of a task at once."""
        return self._max_records, self._max_wait_s, self._max_in_flight

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
        except Exception as exc:
            batch.error = exc
        finally:
            batch.done.set()

    async def _run(self, batch: Batch) -> BatchResult:
        tag = f"{self._tag_prefix}-{next(_tags)}"
        return await self._off_loop(functools.partial(self._on_worker, list(batch.records), tag), tag,
                                    len(batch.records))

    async def run_fetched(self, raws: Sequence[ConsumerRecord], key_serde: Serde, value_serde: Serde,
                          sink: SinkNode | None = None) -> FetchedResult:
        """One batch of fetched records, decoded, framed, run and its rows made records, all on a
        worker thread, at most ``max.in.flight`` at once; the bulk path's call
        (``streamloop.tasks.bulk``). Raises like ``_run``: ``SparkBatchTimeoutError`` past
        ``spark.batch.timeout.ms``, or the job's own error.

        ``sink``: the stage's only child, a sink with built-in serdes; the output is then also
        serialized on the worker (see ``serialize_for``)."""
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self._max_in_flight)  # made on this task's loop
        tag = f"{self._tag_prefix}-{next(_tags)}"
        work = functools.partial(self._on_worker_fetched, raws, key_serde, value_serde, tag, sink)
        async with self._limiter:
            started = time.monotonic()
            result = await self._off_loop(work, tag, len(raws))
        self.batches += 1
        log.debug("Spark stage '%s' ran a batch of %d records in %.3f s", self.name, len(raws),
                  time.monotonic() - started)
        return result

    async def run_parts(self, parts: Sequence[Part]) -> list[FetchedResult]:
        """The batches of several tasks (``parts``) in one Spark job, on a worker thread; a result
        per part, as ``run_fetched`` gives for a batch alone. The bulk path's call for a job shared
        by the tasks of a stream thread (``streamloop.tasks.bulk_jobs``), which bounds how many run at
        once itself. Raises as ``run_fetched`` (then every part is run again on its own, which tells
        whose records the error is)."""
        tag = f"{self._tag_prefix}-{next(_tags)}"
        size = sum(len(part.raws) for part in parts)
        started = time.monotonic()
        results = await self._off_loop(functools.partial(self._on_worker_parts, parts, tag), tag, size)
        self.batches += 1
        log.debug("Spark stage '%s' ran %d parts of %d records in one job in %.3f s", self.name, len(parts), size,
                  time.monotonic() - started)
        return results

    @contextlib.contextmanager
    def _tagged(self, tag: str) -> Iterator[Any]:
        """The session, with the Spark jobs started meanwhile under ``tag`` (so a timeout can cancel
        them) and the stage's schema resolved. Caller: a worker thread."""
        session = self._sessions.get()
        context = session.sparkContext
        context.addJobTag(tag)
        context.setInterruptOnCancel(True)
        try:
            if self._schema is not None and self._resolved_schema is None:
                # Two batches in flight may both resolve it: the same schema either way.
                self._resolved_schema = resolve_schema(session, self._schema)
            yield session
        finally:
            context.removeJobTag(tag)

    def _on_worker_parts(self, parts: Sequence[Part], tag: str) -> list[FetchedResult]:
        clock = start_clock(sum(len(part.raws) for part in parts), len(parts))
        with self._tagged(tag) as session:
            if clock is not None:
                clock.skip()  # the session and tag: not a phase of the job
            decodes = [decode(part.raws, part.key_serde, part.value_serde) for part in parts]
            if clock is not None:
                clock.mark("decode")
            schema = self._resolved_schema
            tables = [to_arrow(decoded.records, self._key_column, schema, clock) if decoded.records else (None, {})
                      for decoded in decodes]
            job = self._job
            rows = None
            if isinstance(job, TransformJob) and job.row_wise:
                rows = run_combined(session, job, [table for table, _left_out in tables], schema, self.name, clock)
            if rows is None:
                frames = [None if table is None else create_frame(session, table, schema, clock)
                          for table, _left_out in tables]
                rows = run_parts(job, frames, self.name, clock)
        results: list[FetchedResult] = []
        for part, decoded, (_table, left_out), part_rows in zip(parts, decodes, tables, rows, strict=True):
            results.append(self._fetched_result(part.raws, decoded, left_out, part_rows, part.sink, clock))
        finish_clock(clock)
        return results

    def _fetched_result(self, raws: Sequence[ConsumerRecord], decoded: Decoded, left_out: dict[int, SchemaMismatch],
                        rows: list[dict[str, Any]] | None, sink: SinkNode | None,
                        clock: JobClock | None = None) -> FetchedResult:
        """A batch's result from its job's rows: the output records, the record they leave with
        and, for a direct sink, their bytes."""
        if rows is None:
            return decoded, None, left_out, None, None, None
        # The rows leave with one record (``Batch.ran``'s rule), records that failed to decode
        # counting as left out, and carry its timestamp.
        left = set(decoded.failed).union(decoded.positions[i] for i in left_out)
        index = carrier_of(len(raws), dict.fromkeys(left))
        if index < 0:
            return decoded, None, left_out, None, None, None
        carrier = raws[index]
        out = to_records(rows, self._key_column, self._value_columns, carrier.timestamp)
        if clock is not None:
            clock.mark("records")
        serialized = None if sink is None else serialize_for(sink, out)
        if clock is not None:
            clock.mark("serialize")
        return decoded, out, left_out, carrier, None, serialized

    async def _off_loop(self, work: Callable[[], T], tag: str, size: int) -> T:
        try:
            with anyio.fail_after(self._timeout_ms / 1000.0 if self._timeout_ms else None):
                # Abandoned on cancel: a task closed dirty must not wait for the cluster.
                return await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
        except TimeoutError as exc:
            # The worker thread was left behind; cancelling the job lets it end.
            await anyio.to_thread.run_sync(self._cancel, tag)
            raise SparkBatchTimeoutError(self.name, size, self._timeout_ms) from exc
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._cancel, tag)
            raise

    def _on_worker(self, records: list[Record], tag: str, clock: JobClock | None = None) -> BatchResult:
        with self._tagged(tag) as session:
            frame, left_out = to_frame(session, records, self._key_column, self._resolved_schema, clock)
            # No record fits the schema: nothing for Spark to do, each record reports its own error.
            if frame is None:
                return None, left_out
            if clock is not None and isinstance(self._job, TransformJob):
                return self._job(frame, clock), left_out
            return self._job(frame), left_out

    def _on_worker_fetched(self, raws: Sequence[ConsumerRecord], key_serde: Serde, value_serde: Serde,
                           tag: str, sink: SinkNode | None) -> FetchedResult:
        clock = start_clock(len(raws))
        decoded = decode(raws, key_serde, value_serde)
        if clock is not None:
            clock.mark("decode")
        if not decoded.records:  # every record failed to decode: nothing for Spark to do
            return decoded, None, {}, None, None, None
        try:
            rows, left_out = self._on_worker(decoded.records, tag, clock)
        except Exception as exc:
            return decoded, None, {}, None, exc, None
        result = self._fetched_result(raws, decoded, left_out, rows, sink, clock)
        finish_clock(clock)
        return result

    def _cancel(self, tag: str) -> None:
        self._sessions.cancel_tagged(tag)


# Serdes that keep no state and touch no event loop: safe to call on a worker thread.
BUILTIN_SERDES = (BytesSerde, IntegerSerde, JsonSerde, StringSerde)


def direct_sink(node: Node) -> SinkNode | None:
    """The stage's only child if it is a sink to one topic with built-in serdes and no partitioner
    (its output can then be serialized on the worker thread), else None."""
    if len(node.children) != 1:
        return None
    sink = node.children[0]
    if not isinstance(sink, SinkNode) or not isinstance(sink.topic, str) or sink.partitioner is not None:
        return None
    if not (isinstance(sink.key_serde, BUILTIN_SERDES) and isinstance(sink.value_serde, BUILTIN_SERDES)):
        return None
    return sink


def serialize_for(sink: SinkNode, records: Sequence[Record]) -> list[tuple[bytes | None, bytes | None]] | None:
    """The key and value bytes of ``records`` as ``sink`` writes them (call on a worker thread, so
    the stream thread only appends them). None when one does not serialize: the batch then goes
    down the usual way, where that record's failure reaches the processing handler."""
    key_serde, value_serde = sink.key_serde, sink.value_serde
    try:
        return [(key_serde.serialize(r.key), value_serde.serialize(r.value)) for r in records]
    except Exception:
        return None


__all__ = ["BatchJob", "BatchSettings", "SparkBatchStage", "TransformJob", "row_wise", "transform_job"]
