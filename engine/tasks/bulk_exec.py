"""The run loop of a task whose Spark stage reads on the executors (``read="executors"``).

The records never pass through this process. The group consumer keeps the task's partition
assigned (membership, heartbeats, commits) but paused; the loop picks the next offset range of
the partition (``kafka_source.pick_range``: from the task's position to the end offset, at most
``max.records``), runs one Spark job whose executors read, decode and align that range and run
the stage's function (``kafka_source.run_range_job``), and then, in this order:

1. hands each record that did not decode to the deserialization handler and each that does not
   fit the schema to the processing handler (``SparkSchemaError``), in offset order; a PAUSE
   stops there (the rest of the range is read again on resume);
2. forwards the function's rows downstream, in the context of the range's carrier record (the
   driver path's rule), unless the task paused at or below it; when the stage's only child is a
   direct sink (one topic, built-in serdes, no partitioner: ``stage.direct_sink``), the executors
   write the rows to its topic themselves instead (``streamloop.spark.kafka_writer``), in a second
   job over the range's persisted frame that runs only after step 1, so nothing of the range
   passes through this process and the handlers are still asked before anything is written;
3. moves the task's position to the range's end (never past a PAUSE): the commit takes it from
   there, after the producer's flush, as for every other loop. A ``to_spark`` write is done when
   the job returns, so its range is safe then.

A job that raised (not a timeout, not a lost executor) fails each record of the range with
``SparkBatchError``: the range is read once more, raw, so that each record reaches the
processing handler as on the driver path. Timeouts and lost executors are retried under
``task.timeout.ms``. One range per task runs at a time.
"""

from __future__ import annotations

import enum
import functools
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.to_thread

from streamloop import config as cfg
from streamloop.errors import ConfigError, SparkBatchError, SparkBatchTimeoutError, SparkSchemaError
from streamloop.processors.nodes import ProcessorNode, SinkNode, SourceNode
from streamloop.records import FetchedRecord, Record, TopicPartition
from streamloop.spark.failures import SparkBatchTransientError, is_transient
from streamloop.spark.kafka_source import (
    COUNT,
    ERROR,
    HEADERS,
    KEY_FAILED,
    MAX_TIMESTAMP,
    MISFIT,
    OFFSET,
    RAW_KEY,
    RAW_VALUE,
    TIMESTAMP,
    VALUE_FAILED,
    KafkaRange,
    RangeOutcome,
    pick_range,
    unpack_error,
)
from streamloop.spark.parts import TransformJob
from streamloop.spark.stage import SparkBatchStage, direct_sink

from .exec_work import RangeWork
from .processing import RecordPath
from .range_jobs import RangeJobs
from .timeouts import is_timeout

if TYPE_CHECKING:

    from .task import StreamTask

log = logging.getLogger(__name__)


class Closed(enum.Enum):
    """``_settle``'s answer when the task closed during a back-off: the range is read again by the
    next owner."""

    CLOSED = "closed"


CLOSED = Closed.CLOSED
_tags = itertools.count()
T = TypeVar("T")


@dataclass(frozen=True)
class ExecutorReads:
    """What the loop needs of the thread's group consumer (from the task manager): pausing the
    task's partition, its position and end offset, and the options the executors' readers take
    (None: the transport cannot be read by executors, the memory broker)."""

    pause: Callable[[TopicPartition], None]
    position: Callable[[TopicPartition], Awaitable[int]]
    end_offsets: Callable[[Sequence[TopicPartition]], Awaitable[Mapping[TopicPartition, int]]]
    options: Mapping[str, Any] | None
    # The stream thread's shared range jobs, by stage (``streamloop.tasks.range_jobs``); None: none shared.
    shared: dict[str, RangeJobs] | None = None


def executor_window(task: StreamTask, reads: ExecutorReads | None) -> ExecutorWindow | None:
    """The loop for ``task`` if its stage reads on the executors; None otherwise. A stage that
    reads on the executors in a task that cannot (checked at build and client creation for what
    the topology shows) raises ``ConfigError``."""
    sources = {id(node): node for node in task.graph.sources.values()}
    stage_node = None
    for feeding in sources.values():
        for child in feeding.children:
            if isinstance(child, ProcessorNode) and isinstance(child.processor, SparkBatchStage):
                stage_node = child
    if stage_node is None:
        return None
    stage = stage_node.processor
    assert isinstance(stage, SparkBatchStage)
    if stage.read != cfg.SPARK_READ_EXECUTORS:
        return None
    source = next(iter(sources.values())) if len(sources) == 1 else None
    why = None
    if source is None or len(task.partitions) != 1 or len(source.children) != 1:
        why = "its task reads more than one partition, or its source feeds other processors too"
    elif task.state_manager is not None:
        why = "its sub-topology has state stores"
    elif source.timestamp_extractor is not None:
        why = "its source has a timestamp extractor (the executors keep the records' own timestamps)"
    elif task.exactly_once:
        why = "exactly-once: its output is not part of the task's transaction"
    elif reads is None or reads.options is None:
        why = "the transport is not Kafka (the executors read from Kafka brokers)"
    if why is not None:
        raise ConfigError(cfg.SPARK_BATCH_READ, f"Spark stage '{stage.name}' cannot read on the executors: {why}; "
                          f"give it read='driver' or set {cfg.SPARK_BATCH_READ}=driver")
    assert source is not None and reads is not None
    (tp,) = task.partitions
    sink = direct_sink(stage_node) if isinstance(stage.executor_job()[0], TransformJob) else None
    jobs = None
    if sink is not None and stage.shared and reads.shared is not None:
        jobs = reads.shared.setdefault(stage.name, RangeJobs(stage.batching()[1]))
    return ExecutorWindow(task, TopicPartition(*tp), source, stage_node, stage, reads, sink, jobs)


class ExecutorWindow:
    """Caller: ``StreamTask.run`` (the loop) and the task (``lowest_in_flight``, ``metadata``)."""

    def __init__(self, task: StreamTask, tp: TopicPartition, source: SourceNode, node: ProcessorNode,
                 stage: SparkBatchStage, reads: ExecutorReads, sink: SinkNode | None = None,
                 jobs: RangeJobs | None = None) -> None:
        self._task = task
        self._tp = tp
        self._source = source
        self._node = node
        self._stage = stage
        self._reads = reads
        # The sink the executors write to themselves; None: the rows come back and go downstream.
        self.sink = sink
        # Shared with the stage's other tasks on the thread: one read and one write job for all
        # their ranges, while the stage's function is row-wise (``streamloop.tasks.range_jobs``).
        self._jobs = jobs
        self._max_records, self._max_wait_s, _in_flight = stage.batching()
        self._running: KafkaRange | None = None
        self._path = RecordPath(task, journal=False)
        assert reads.options is not None  # executor_window's rule
        self._work = RangeWork(task, stage, source, reads.options)
        self.ranges = 0  # jobs run (tests and the benchmark look)

    # -- what StreamTask asks of its window -------------------------------------------
    def metadata(self, tp: TopicPartition, watermark: int) -> str:
        return ""  # ranges finish in order: nothing is ever done above the watermark

    def lowest_in_flight(self, tp: TopicPartition) -> int | None:
        running = self._running
        return None if running is None or tp != self._tp else running.start

    # -- the loop -----------------------------------------------------------------
    async def run(self) -> None:
        await self._serve(until_idle=False)

    async def drain(self) -> None:
        await self._serve(until_idle=True)

    async def _serve(self, until_idle: bool) -> None:
        jobs = self._jobs
        if jobs is None:
            await self._serve_ranges(until_idle)
            return
        jobs.join(self)
        try:
            await self._serve_ranges(until_idle)
        finally:
            jobs.leave(self)

    def _idle(self) -> None:
        if self._jobs is not None:
            self._jobs.idle(self)

    async def _serve_ranges(self, until_idle: bool) -> None:
        task, tp = self._task, self._tp
        initial: int | None = None
        while not task.closing:
            task.clear_wakeup()
            self._hold()
            await task.flush_output()
            if task.paused_at is not None:
                self._idle()
                if until_idle:
                    break
                await task.wait_for_wakeup()
                continue
            position = task.position(tp)
            if position is None:
                if initial is None:
                    initial = await self._initial_position()
                position = initial
            end = (await self._reads.end_offsets([tp]))[tp]
            next_range = pick_range(tp, position, end, self._max_records)
            if next_range is None:
                self._idle()
                if until_idle:
                    break
                # Nothing past the position yet: look again after max.wait.ms (or a close).
                with anyio.move_on_after(self._max_wait_s or 0.1):
                    await task.wait_for_wakeup()
                await task.punctuate_wall_clock()
                continue
            await self._run_range(next_range)
            await task.punctuate_wall_clock()
        await task.flush_output()

    def _hold(self) -> None:
        """Keep the partition paused in the group consumer and drop what it fetched before: the
        executors read it. Every turn, since a back-pressure release or a resume may un-pause it."""
        self._reads.pause(self._tp)
        self._task.input.discard(self._tp)

    async def _initial_position(self) -> int:
        """Where the task starts: its group's committed offset, else the consumer's position (the
        reset policy), lowered to the first record it already fetched."""
        task, tp = self._task, self._tp
        committed = task.group_committed.get(tp)
        if committed is not None:
            return committed
        position = await self._reads.position(tp)
        first = task.input.first_offset(tp)
        return position if first is None else min(position, first)

    # -- one range ------------------------------------------------------------------
    async def _run_range(self, kafka_range: KafkaRange) -> None:
        task, stage = self._task, self._stage
        self._running = kafka_range
        began = time.perf_counter_ns()
        try:
            if self.sink is not None:
                jobs, job = self._jobs, stage.executor_job()[0]
                if jobs is not None and isinstance(job, TransformJob) and job.row_wise:
                    done, summary = await self._run_shared(jobs, kafka_range, self.sink)
                else:
                    done, summary = await self._run_direct(kafka_range, self.sink)
                if not done:
                    return  # the task closed during a back-off: the range is read again by the next owner
            else:
                outcome = await self._settle(functools.partial(self._work.run, kafka_range), kafka_range)
                if outcome is CLOSED:
                    return  # as above
                if isinstance(outcome, Exception):
                    await self._fail_each(kafka_range, outcome)
                    summary = None
                else:
                    await self._report_failures(outcome)
                    summary = outcome.summary()
                    if outcome.rows is not None and summary is not None:
                        await self._forward(outcome.rows, summary)
        finally:
            self._running = None
        tp = self._tp
        task.positions.advance_past(tp, kafka_range.end - 1, [], task.paused_offset(tp))
        count = summary[COUNT] if summary is not None else kafka_range.size
        task.processed += count
        task.meter.add(count, time.perf_counter_ns() - began)
        self.ranges += 1
        log.debug("Spark stage '%s' read %s on the executors: %d records", stage.name, kafka_range, count)
        if summary is not None and summary[MAX_TIMESTAMP] is not None:
            punctuating = self._path.passed(summary[MAX_TIMESTAMP])
            if punctuating is not None:
                await punctuating

    async def _run_direct(self, kafka_range: KafkaRange, sink: SinkNode) -> tuple[bool, dict[str, Any] | None]:
        """A range whose output the executors write to ``sink``'s topic: read (and persist) it,
        ask the handlers about its failed records, then write. (False, None) when the task closed
        during a back-off; else True and the range's summary (None after a job that raised)."""
        ranges = (kafka_range,)
        read = await self._settle(functools.partial(self._work.read_ranges, ranges), kafka_range)
        if read is CLOSED:
            return False, None
        if isinstance(read, Exception):
            await self._fail_each(kafka_range, read)
            return True, None
        frame, (outcome,) = read
        try:
            await self._report_failures(outcome)
            summary = outcome.summary()
            if summary is None or not self._passes_pause(summary):
                return True, summary
            return await self._write_alone(frame, ranges, 0, kafka_range, sink, summary)
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(frame.unpersist)

    async def _run_shared(self, jobs: RangeJobs, kafka_range: KafkaRange,
                          sink: SinkNode) -> tuple[bool, dict[str, Any] | None]:
        """``_run_direct`` together with the stage's other tasks on the thread: the range is read in
        one job with theirs, and written in one job with theirs (``streamloop.tasks.range_jobs``).
        When either job fails, this range is read or written on its own, as ``_run_direct`` does."""
        stage = self._stage
        group, index = await jobs.read(self, kafka_range, self._read_ranges, self._unpersist)
        try:
            if group.read.error is not None:
                log.info("Spark stage '%s': a read shared by %d tasks failed (%r); %s is read on its own",
                         stage.name, len(group.ranges), group.read.error, kafka_range)
                return await self._run_direct(kafka_range, sink)
            outcome = group.outcome(index)
            await self._report_failures(outcome)
            summary = outcome.summary()
            leaves = summary is not None and self._passes_pause(summary)
            write = functools.partial(self._write_ranges, sink)
            written = await jobs.write(group, index, summary[TIMESTAMP] if summary is not None and leaves else None,
                                       write)
            if written is None:
                return True, summary
            assert summary is not None
            job = stage.executor_job()[0]
            if isinstance(written, str) and isinstance(job, TransformJob) and job.row_wise:
                job.row_wise = False
                log.warning("Spark stage '%s': its function is marked row_wise but %s; each task's range is now "
                            "written on its own", stage.name, written)
            elif isinstance(written, Exception):
                log.info("Spark stage '%s': a write shared by %d tasks failed (%r); %s is written on its own",
                         stage.name, len(group.ranges), written, kafka_range)
            return await self._write_alone(group.frame, tuple(group.ranges), index, kafka_range, sink, summary)
        finally:
            with anyio.CancelScope(shield=True):
                await jobs.done(group, index)

    async def _write_alone(self, frame: Any, ranges: tuple[KafkaRange, ...], index: int, kafka_range: KafkaRange,
                           sink: SinkNode, summary: dict[str, Any]) -> tuple[bool, dict[str, Any] | None]:
        """Write range ``index`` of ``frame`` (``kafka_range``, this task's) on its own, retrying
        under ``task.timeout.ms``; ``_run_direct``'s answer."""
        partitions = await self._partitions(sink)
        write = functools.partial(self._work.write_ranges, frame, ranges, (index,), (summary[TIMESTAMP],), sink,
                                  partitions)
        written = await self._settle(write, kafka_range)
        if written is CLOSED:
            return False, None
        if isinstance(written, Exception):
            await self._fail_each(kafka_range, written)
            return True, None
        return True, summary

    @staticmethod
    async def _partitions(sink: SinkNode) -> int:
        assert sink.collector is not None and isinstance(sink.topic, str)  # direct_sink's rule; set at build
        return await sink.collector.partition_count(sink.topic)

    async def _read_ranges(self, ranges: tuple[KafkaRange, ...]) -> tuple[Any, list[RangeOutcome]]:
        return await self._off_loop(functools.partial(self._work.read_ranges, ranges), ranges[0])

    async def _write_ranges(self, sink: SinkNode, frame: Any, ranges: tuple[KafkaRange, ...], leaving: Sequence[int],
                            stamps: tuple[int, ...]) -> str | None:
        """Write the ranges at ``leaving`` of a group's ``frame``: one range alone (``stamps``: its
        timestamp) or several in one row-wise job (``stamps``: each range's)."""
        partitions = await self._partitions(sink)
        work = functools.partial(self._work.write_ranges, frame, ranges, tuple(leaving), stamps, sink, partitions)
        return await self._off_loop(work, ranges[leaving[0]])

    async def _unpersist(self, frame: Any) -> None:
        await anyio.to_thread.run_sync(frame.unpersist)

    def _passes_pause(self, summary: Mapping[str, Any]) -> bool:
        """Whether the range's output may leave: it has a carrier record (a record that decoded)
        and the task did not pause at or below it (the driver path's rule, ``_forward``)."""
        offset = summary[OFFSET]
        if offset is None or offset < 0:
            return False
        paused = self._task.paused_at
        return not (paused is not None and paused[0] == self._tp and offset >= paused[1])

    async def _settle(self, work: Callable[[str], T], kafka_range: KafkaRange) -> T | Exception | Closed:
        """The outcome of ``work`` (a job over the range), retrying timeouts and lost executors
        under ``task.timeout.ms``; an exception when the job raised otherwise; ``CLOSED`` when the
        task closed meanwhile (a sentinel: a job's own outcome may be None)."""
        task, stage = self._task, self._stage
        timer = task.timer
        while True:
            started = task.monotonic_ms()
            try:
                outcome = await self._off_loop(work, kafka_range)
            except Exception as exc:
                if is_transient(exc) and not is_timeout(exc):
                    transient = SparkBatchTransientError(stage.name, kafka_range.size, exc)
                    transient.__cause__ = exc
                    exc = transient
                if not is_timeout(exc):
                    return exc
                await task.back_off(exc, f"Spark stage '{stage.name}' reading {kafka_range.topic}-"
                                         f"{kafka_range.partition} offsets {kafka_range.start}.."
                                         f"{kafka_range.end - 1} on the executors", started)
                if task.closing:
                    return CLOSED
                continue
            if timer.deadline_ms is not None and timer.cleared_by_processing:
                timer.clear()
            return outcome

    async def _off_loop(self, work: Callable[[str], T], kafka_range: KafkaRange) -> T:
        """``work`` on a worker thread, under ``spark.batch.timeout.ms``; a timeout cancels the job
        by its tag (the thread is left to end with it)."""
        stage = self._stage
        tag = f"streamloop-exec-{self._task.context.application_id}-{self._task.id}-{stage.name}-{next(_tags)}"
        timeout_ms: int = self._work.sessions().config.get(cfg.SPARK_BATCH_TIMEOUT_MS, 0)
        try:
            with anyio.fail_after(timeout_ms / 1000.0 if timeout_ms else None):
                # Abandoned on cancel: a task closed dirty must not wait for the cluster.
                return await anyio.to_thread.run_sync(work, tag, abandon_on_cancel=True)
        except TimeoutError as exc:
            await anyio.to_thread.run_sync(self._work.cancel, tag)
            raise SparkBatchTimeoutError(stage.name, kafka_range.size, timeout_ms) from exc
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._work.cancel, tag)
            raise

    # -- handlers -------------------------------------------------------------------
    def _raw(self, row: Mapping[str, Any]) -> FetchedRecord:
        headers = tuple((h["key"], h["value"]) for h in row[HEADERS] or ())
        return FetchedRecord(self._tp.topic, self._tp.partition, row[OFFSET], row[TIMESTAMP], row[RAW_KEY],
                             row[RAW_VALUE], headers)

    async def _report_failures(self, outcome: RangeOutcome) -> None:
        """Each failed record of the range to its handler, in offset order (``bulk`` does the same
        for a driver batch); the records are decoded again here, only these few."""
        stage, source = self._stage, self._source
        for row in outcome.failures():
            raw = self._raw(row)
            if self._task.paused_below(raw):
                return
            kind, error = row["__streamloop_kind"], unpack_error(row[ERROR])
            if kind in (KEY_FAILED, VALUE_FAILED):
                await self._path.deserialization_failed(raw, kind, error)
                continue
            assert kind == MISFIT
            mismatch = error.mismatch()
            record = Record(source.key_serde.deserialize(raw.key), source.value_serde.deserialize(raw.value),
                            raw.timestamp, raw.headers)
            failure = SparkSchemaError(stage.name, mismatch.field, mismatch.expected, mismatch.found, raw.topic,
                                       raw.partition, raw.offset)
            await self._path.processing_failed(raw, stage.name, record, failure)

    async def _fail_each(self, kafka_range: KafkaRange, error: Exception) -> None:
        """The job raised: each record of the range to the processing handler with
        ``SparkBatchError`` (one that does not decode to the deserialization handler), as the
        driver path does; the range is read once more, raw, for that."""
        stage, source = self._stage, self._source
        failure = SparkBatchError(stage.name, kafka_range.size, error)
        failure.__cause__ = error
        log.warning("Spark stage '%s' failed on %s: %r; asking the handlers about each record", stage.name,
                    kafka_range, error)
        raws = await self._off_loop(functools.partial(self._work.raw, kafka_range), kafka_range)
        for row in raws.side:
            raw = self._raw(row)
            if self._task.paused_below(raw):
                return
            what = "key"
            try:
                key = source.key_serde.deserialize(raw.key)
                what = "value"
                value = source.value_serde.deserialize(raw.value)
            except Exception as exc:
                await self._path.deserialization_failed(raw, what, exc)
                continue
            await self._path.processing_failed(raw, stage.name, Record(key, value, raw.timestamp, raw.headers),
                                               failure)

    async def _forward(self, rows: list[dict[str, Any]], summary: Mapping[str, Any]) -> None:
        """The rows downstream, in the context of the range's carrier record (``bulk._forward``)."""
        task, tp = self._task, self._tp
        offset, timestamp = summary[OFFSET], summary[TIMESTAMP]
        if not rows or offset is None or offset < 0:
            return
        paused = task.paused_at
        if paused is not None and paused[0] == tp and offset >= paused[1]:
            return  # at or past the record that paused the task: read again on resume
        from streamloop.spark.frames import to_records

        _job, key_column, value_columns, _schema = self._stage.executor_job()
        out = to_records(rows, key_column, value_columns, timestamp)
        ctx = task.context
        ctx.topic, ctx.partition, ctx.offset = tp.topic, tp.partition, offset
        ctx.timestamp, ctx.headers = timestamp, ()
        carrier = FetchedRecord(tp.topic, tp.partition, offset, timestamp, None, None)
        await self._path.forward_rows(self._node, carrier, out)
