"""The bulk path of a Spark stage: a task whose source feeds a Spark stage directly runs this
loop instead of one coroutine per record in flight (``streamloop.tasks.in_flight``).

The loop takes fetched records off the task's queue in whole runs, into the task's open batch.
A batch is an offset range of the task's partition and one coroutine (``_drive``); it is the
task's part of a Spark job of the stage, which the thread's other tasks may share
(``streamloop.tasks.bulk_jobs``: sealed by records, bytes or time). Once the job is sealed its parts'
raw records go to a worker thread, where they are decoded, framed through Arrow, run through the
user's function and made output records (``SparkBatchStage.run_parts``; a part runs alone through
``run_fetched`` when the shared job raised or was given up). Nothing on the stream
thread's loop is done per input record but taking it off the queue; per output record, only
forwarding it downstream.

Bookkeeping is one entry per batch (``_batches``, in offset order), which gives:

- **Exact commits**: batches are released in offset order (``_release``): a batch's output is
  forwarded, then the committable position moves past its last offset, never past the first
  record of a batch that has not finished. A crash re-reads only the unreleased ranges.
- **Ordering**: output leaves in input offset order, a batch's rows after those of the batch
  before, with the timestamp of the record they leave with (``Batch.ran``'s rule).
- **Back-pressure**: at most ``max.in.flight`` batches of a task, and jobs of the stage on the
  thread when shared (the open one included), exist; then records stay in the task's buffer and
  fetching pauses once it fills.
- **Errors**: records that fail to decode, records that do not fit the stage's schema and, for a
  batch whose job raised, every record of the batch, are handed to the exception handlers one by
  one in offset order as soon as their batch finished (a PAUSE lands while earlier batches still
  run, at the lowest such record). A timeout (``spark.batch.timeout.ms``) retries the batch under
  ``task.timeout.ms``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from streamloop.errors import SparkBatchError, SparkSchemaError
from streamloop.processors.nodes import Node, ProcessorNode, SourceNode
from streamloop.records import ConsumerRecord, TopicPartition
from streamloop.spark.failures import SparkBatchTransientError, is_transient
from streamloop.spark.frames import decode
from streamloop.spark.schema import SchemaMismatch
from streamloop.spark.stage import FetchedResult, SparkBatchStage, direct_sink
from streamloop.stray_cancel import fail_stray

from .bulk_jobs import JobPart, StageJobs
from .processing import RecordPath
from .timeouts import is_timeout

if TYPE_CHECKING:
    from streamloop.tasks.task import StreamTask

log = logging.getLogger(__name__)


def bulk_window(task: StreamTask, spark_jobs: dict[str, StageJobs] | None) -> BatchWindow | None:
    """The bulk loop for ``task`` if it can take one: one input partition, no state stores, its
    source's only child a Spark stage (a processor in between runs per record: the usual path),
    no timestamp extractor on it (records pass with their own timestamps), and
    ``spark.batch.bulk`` on."""
    if len(task.partitions) != 1 or task.state_manager is not None:
        return None
    sources = {id(node): node for node in task.graph.sources.values()}
    if len(sources) != 1:
        return None
    source = next(iter(sources.values()))
    if len(source.children) != 1 or source.timestamp_extractor is not None:
        return None
    node = source.children[0]
    if not isinstance(node, ProcessorNode) or not isinstance(node.processor, SparkBatchStage):
        return None
    if not node.processor.bulk:
        return None
    (tp,) = task.partitions
    stage = node.processor
    jobs = StageJobs(stage)  # the task's own jobs, unless its thread shares them
    if spark_jobs is not None and stage.shared:
        jobs = spark_jobs.setdefault(stage.name, jobs)
    return BatchWindow(task, TopicPartition(*tp), source, node, stage, jobs)


class FetchedBatch:
    """One batch: its records (one offset range, the task's part of a job), and once run, what
    came back or the error."""

    __slots__ = ("done", "error", "part", "raws", "result", "stopped_at")

    def __init__(self, part: JobPart) -> None:
        self.part = part
        self.raws: list[ConsumerRecord] = part.raws
        self.done = False
        self.result: FetchedResult | None = None
        self.error: Exception | None = None
        # Where a PAUSE stopped the handlers asking about its records (None: it did not): the batch is
        # done only below it, even when a resume comes before the batch is released.
        self.stopped_at: int | None = None

    @property
    def first(self) -> int:
        return self.raws[0].offset


class BatchWindow:
    """The run loop of a task whose source feeds a Spark stage. Caller: ``StreamTask.run``."""

    def __init__(self, task: StreamTask, tp: TopicPartition, source: SourceNode, node: Node,
                 stage: SparkBatchStage, jobs: StageJobs) -> None:
        self._task = task
        self._tp = tp
        self._source = source
        self._node = node
        self._stage = stage
        self._sink = direct_sink(node)
        self._jobs = jobs
        self._max_records, self._max_wait_s, self._max_in_flight = stage.batching()
        self._batches: deque[FetchedBatch] = deque()  # taken in, not released yet; offset order
        self._open: FetchedBatch | None = None
        self._releasing: anyio.Lock | None = None
        # Failed records go to the handlers through the task's one per-record path.
        self._path = RecordPath(task, journal=False)

    # -- what StreamTask asks of its window -------------------------------------------
    def metadata(self, tp: TopicPartition, watermark: int) -> str:
        return ""  # batches are released in order: nothing is ever done above the watermark

    def lowest_in_flight(self, tp: TopicPartition) -> int | None:
        # The minimum, not the head: after a resume a re-read batch may sit behind a stale one.
        return min((batch.first for batch in self._batches), default=None)

    def resumed(self, tp: TopicPartition, start: int, skipped: int | None) -> None:
        for batch in self._batches:
            if batch.raws and batch.raws[-1].offset >= start:
                batch.stopped_at = _lowest(batch.stopped_at, start)
        if self._open is not None:
            # Taken before the pause: the records read again go into a part of their own.
            self._jobs.seal(self._open.part.job)
            self._open = None

    # -- the loop -----------------------------------------------------------------
    async def run(self) -> None:
        await self._serve(until_idle=False)

    async def drain(self) -> None:
        """Every buffered record, until no batch is left. Caller: the test driver."""
        await self._serve(until_idle=True)

    async def _serve(self, until_idle: bool) -> None:
        task = self._task
        self._releasing = anyio.Lock()
        async with anyio.create_task_group() as group:
            while not task.closing:
                # Cleared before looking, so a wake-up that comes meanwhile is never lost.
                task.clear_wakeup()
                self._admit(group)
                await task.flush_output()
                if until_idle:
                    if not self._batches and (not task.buffered() or task.pause_point is not None):
                        break
                    if self._open is not None:
                        self._jobs.seal(self._open.part.job)  # nothing more comes: run what was taken in
                await task.wait_for_wakeup()
                await task.punctuate_wall_clock()
            if self._open is not None:
                # Closing: what was taken in runs now, not after max.wait.ms.
                self._jobs.seal(self._open.part.job)
        await task.flush_output()

    def _admit(self, group: anyio.abc.TaskGroup) -> None:
        """Move buffered records into the task's part of the stage's open job, opening a part
        while the task has fewer than ``max.in.flight`` batches and the stage may open a job."""
        task, tp, jobs = self._task, self._tp, self._jobs
        max_bytes = jobs.max_bytes
        while task.buffered() and not task.closing and task.pause_point is None:
            batch = self._open
            if batch is not None and batch.part.job.sealed.is_set():
                batch = self._open = None
            if batch is None:
                if len(self._batches) >= self._max_in_flight:
                    return
                part = jobs.part_for(self, task.wake, self._source.key_serde, self._source.value_serde, self._sink)
                if part is None:
                    return  # woken when one of the stage's jobs finished
                batch = self._open = FetchedBatch(part)
                self._batches.append(batch)
                group.start_soon(fail_stray, "a Spark batch", self._drive, batch)
            job, raws = batch.part.job, batch.raws
            before = len(raws)
            room = min(jobs.room(job), task.buffered())
            size = 0
            take = task.input.take
            if max_bytes:
                # Sealed by bytes too: sizes are summed per record only when a limit is set.
                while room > 0 and job.bytes + size < max_bytes:
                    raw = take(tp)
                    raws.append(raw)
                    size += len(raw.key or b"") + len(raw.value or b"")
                    room -= 1
            else:
                for _ in range(room):
                    raws.append(take(tp))
            jobs.added(job, len(raws) - before, size)

    async def _drive(self, batch: FetchedBatch) -> None:
        started = self._task.monotonic_ms()
        outcome = await self._jobs.settle(batch.part)
        if self._open is batch:
            self._open = None
        self._task.wake()  # the next part may open now
        if isinstance(outcome, Exception) and not is_timeout(outcome) and len(batch.part.job.parts) > 1:
            # The job of several tasks' parts raised: this part alone tells whether it is its error.
            ran = await self._run(batch)
        else:
            ran = await self._run(batch, outcome, started)
        if not ran:
            return  # the task closed during a back-off: the batch's records are read again by the next owner
        await self._report_failures(batch)
        batch.stopped_at = _lowest(batch.stopped_at, self._task.paused_offset(self._tp))
        batch.done = True
        await self._release()

    async def _run(self, batch: FetchedBatch, outcome: FetchedResult | Exception | None = None,
                   started: int = 0) -> bool:
        """Run the batch on its own until it is not a timeout; ``outcome``: that of its first run,
        in a shared job (begun at ``started``). False when the task closed before it ran."""
        task, stage, source = self._task, self._stage, self._source
        timer = task.timer
        while True:
            if outcome is None:
                started = task.monotonic_ms() if timer.deadline_ms is not None else 0
            try:
                if outcome is None:
                    result = await stage.run_fetched(batch.raws, source.key_serde, source.value_serde, self._sink)
                else:
                    first, outcome = outcome, None
                    if isinstance(first, Exception):
                        raise first
                    result = first
                batch.result = result
                if result[4] is not None:
                    raise result[4]
            except Exception as failure:
                exc: Exception = failure
                if is_transient(exc) and not is_timeout(exc):
                    # A lost executor or worker: retried under task.timeout.ms like a timeout.
                    transient = SparkBatchTransientError(stage.name, len(batch.raws), exc)
                    transient.__cause__ = exc
                    exc = transient
                if not is_timeout(exc):
                    batch.error = exc
                    return True
                # Past spark.batch.timeout.ms (or a timeout Spark raised): the batch is run again
                # after the back-off, until task.timeout.ms has passed (then TaskTimeoutError).
                await task.back_off(exc, f"Spark stage '{stage.name}' on {self._tp.topic}-{self._tp.partition} "
                                         f"offsets {batch.first}..{batch.raws[-1].offset}", started)
                if task.closing:
                    return False  # woken by the close: never released, its records run again
                continue
            if timer.deadline_ms is not None and timer.cleared_by_processing:
                timer.clear()
            return True

    async def _report_failures(self, batch: FetchedBatch) -> None:
        """Ask the handlers about the batch's failed records, in offset order: FAIL raises, PAUSE
        pauses the task at the record (and the records above it are read again on resume, so they
        are not asked about now), CONTINUE drops the record."""
        stage, raws = self._stage, batch.raws
        failures: dict[int, Any] = {}
        if batch.result is not None:
            decoded, _out, left_out, _carrier, _error, _serialized = batch.result
            failures.update(decoded.failed)
            for position, mismatch in left_out.items():
                failures[decoded.positions[position]] = (decoded.records[position], mismatch)
        if batch.error is not None:
            # Every record of the batch fails with the job's error, but one that did not decode
            # goes to the deserialization handler as on the per-record path.
            decoded = batch.result[0] if batch.result is not None else decode(raws, self._source.key_serde,
                                                                              self._source.value_serde)
            for position, index in enumerate(decoded.positions):
                failures[index] = (decoded.records[position], batch.error)
            failures.update(decoded.failed)
        if not failures:
            return
        for index in sorted(failures):
            raw = raws[index]
            if self._task.paused_below(raw) or (batch.stopped_at is not None and raw.offset >= batch.stopped_at):
                return
            first, second = failures[index]
            if isinstance(first, str):  # (which part, the serde's error)
                await self._path.deserialization_failed(raw, first, second)
                continue
            error: SparkBatchError
            if isinstance(second, SchemaMismatch):
                error = SparkSchemaError(stage.name, second.field, second.expected, second.found, raw.topic,
                                         raw.partition, raw.offset)
            else:
                error = SparkBatchError(stage.name, len(raws), second)
                error.__cause__ = second
            await self._path.processing_failed(raw, stage.name, first, error)

    async def _release(self) -> None:
        """Hand on the output of the finished batches at the head, in offset order, and pass each:
        the committable position moves past it, and stream time with its records' timestamps."""
        assert self._releasing is not None
        task, tp, batches = self._task, self._tp, self._batches
        async with self._releasing:
            while batches and batches[0].done:
                batch = batches[0]
                began = time.perf_counter_ns()
                stop = _lowest(batch.stopped_at, task.paused_offset(tp))
                if batch.result is not None:
                    await self._forward(batch.result, stop)
                batches.popleft()
                raws = batch.raws if stop is None else [raw for raw in batch.raws if raw.offset < stop]
                bounds = [b for b in (self.lowest_in_flight(tp), task.input.first_offset(tp)) if b is not None]
                last = batch.raws[-1].offset if stop is None else min(batch.raws[-1].offset, stop - 1)
                task.positions.advance_past(tp, last, bounds, task.paused_offset(tp))
                task.processed += len(raws)
                task.meter.add(len(raws), time.perf_counter_ns() - began)
                if raws:
                    punctuating = self._path.passed(max(raw.timestamp for raw in raws))
                    if punctuating is not None:
                        await punctuating
            task.wake()

    async def _forward(self, result: FetchedResult, stop: int | None) -> None:
        """The batch's output records, downstream of the stage, in the context of the record they
        leave with; a failure downstream is that record's, as on the per-record path. ``stop``: the
        offset a PAUSE stopped the batch at, if one did."""
        task = self._task
        _decoded, out, _left_out, carrier, _error, serialized = result
        if not out or carrier is None:
            return
        if stop is not None and carrier.offset >= stop:
            return  # at or past the record that paused the task: read again on resume
        ctx = task.context
        ctx.topic, ctx.partition, ctx.offset = carrier.topic, carrier.partition, carrier.offset
        ctx.timestamp, ctx.headers = carrier.timestamp, carrier.headers
        sink = self._sink
        if serialized is not None and sink is not None:
            # Serialized on the worker: only partitioning and appending are left for this loop.
            topic, collector, send = sink.topic, sink.collector, sink.collector.send_serialized  # type: ignore[union-attr]  # set when the task is built; a RecordCollector
            assert isinstance(topic, str) and collector is not None
            for record, (key_bytes, value_bytes) in zip(out, serialized, strict=True):
                pending = send(topic, record, sink, key_bytes, value_bytes)
                if pending is not None:
                    await pending
            return
        await self._path.forward_rows(self._node, carrier, out)


def _lowest(first: int | None, second: int | None) -> int | None:
    return second if first is None else first if second is None else min(first, second)
