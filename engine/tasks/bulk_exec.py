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
``task.timeout.ms``; a read that timed out is retried with half its offsets, and the task's next
ranges stay that small until one takes under a quarter of the timeout (``exec_work.RangeLimit``).

A task finishes one range at a time, in offset order, but with a backlog it reads one ahead: once
a range's first job (its read; the whole job when the rows come back) is done and a full range
(``RangeLimit.records``) waits past it, that range's first job runs while steps 1-3 of the range
before it run. Its outcome is looked at only after that, so the handlers are still asked in
offset order and nothing of it is written before the range below it is (a ``to_spark`` job, which
writes as it runs, is never run ahead). A range that paused (or a close) drops what was read
ahead: the resume, or the next owner, reads on from the position.
"""

from __future__ import annotations

import enum
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.to_thread

from streamloop import config as cfg
from streamloop.errors import ConfigError, SparkBatchTimeoutError
from streamloop.processors.nodes import ProcessorNode, SinkNode, SourceNode
from streamloop.records import TopicPartition
from streamloop.spark.kafka_source import (
    COUNT,
    MAX_TIMESTAMP,
    OFFSET,
    TIMESTAMP,
    KafkaRange,
    RangeOutcome,
    pick_range,
)
from streamloop.spark.parts import TransformJob
from streamloop.spark.stage import SparkBatchStage, direct_sink
from streamloop.stray_cancel import fail_stray

from .exec_work import CLOSED, Closed, RangeWork, release_read
from .range_jobs import RangeGroup, RangeJobs
from .range_outcomes import RangeOutcomes

if TYPE_CHECKING:

    from .task import StreamTask

log = logging.getLogger(__name__)


class _Kind(enum.Enum):
    """How a range is run: its rows come back (``ROWS``), or the executors write them to the direct
    sink, the range read and written in jobs of its own (``DIRECT``) or with the thread's other
    tasks' (``SHARED``)."""

    ROWS = "rows"
    DIRECT = "direct"
    SHARED = "shared"


class _Ahead:
    """A range whose first job (its read; the whole job when the rows come back) was started in the
    loop's task group: ``value`` is the job's outcome once ``done`` is set (None if cancelled first)."""

    __slots__ = ("began", "done", "kafka_range", "kind", "scope", "value")

    def __init__(self, kafka_range: KafkaRange, kind: _Kind, began: int) -> None:
        self.kafka_range = kafka_range
        self.kind = kind
        self.began = began
        self.scope = anyio.CancelScope()
        self.done = anyio.Event()
        self.value: Any = None


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
        self._max_wait_s = stage.batching()[1]
        # Only a first job with no effect outside (a read, a transform whose rows come back) is run
        # ahead: a ``to_spark`` job writes as it runs, before the handlers of the range below it.
        self._reads_ahead = sink is not None or isinstance(stage.executor_job()[0], TransformJob)
        self._running: KafkaRange | None = None
        self._outcomes = RangeOutcomes(task, tp, source, node, stage)
        assert reads.options is not None  # executor_window's rule
        self._work = RangeWork(task, stage, source, reads.options)
        self.ranges = 0  # jobs run (tests and the benchmark look)

    # -- what StreamTask asks of its window -------------------------------------------
    def metadata(self, tp: TopicPartition, watermark: int) -> str:
        return ""  # ranges finish in order: nothing is ever done above the watermark

    def lowest_in_flight(self, tp: TopicPartition) -> int | None:
        running = self._running
        return None if running is None or tp != self._tp else running.start

    def resumed(self, tp: TopicPartition, start: int, skipped: int | None) -> None:
        running = self._running
        if running is not None and running.end > start:
            # The running range is done only below the resume point (a range read ahead is dropped
            # once it finishes: the position is no longer its start).
            self._outcomes.stop_at(start)

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
        # The range whose first job was started and not yet handed to ``_run_range`` (which then
        # owns its frame, or its place in a shared group), and the one read ahead of it: whatever
        # ends the loop, the ``finally`` lets go of both.
        current: _Ahead | None = None
        ahead: _Ahead | None = None
        async with anyio.create_task_group() as group:
            try:
                while not task.closing:
                    task.clear_wakeup()
                    self._hold()
                    await task.flush_output()
                    if task.pause_point is not None:
                        if ahead is not None:  # paused by a handler since (a failed produce's)
                            await self._discard(ahead)
                            ahead = None
                        self._idle()
                        if until_idle:
                            break
                        await task.wait_for_wakeup()
                        continue
                    if ahead is None:
                        position = task.position(tp)
                        if position is None:
                            if initial is None:
                                initial = await self._initial_position()
                            position = initial
                        first = await self._next_range(position)
                        if first is None:
                            self._idle()
                            if until_idle:
                                break
                            # Nothing past the position yet: look again after max.wait.ms (or a close).
                            with anyio.move_on_after(self._max_wait_s or 0.1):
                                await task.wait_for_wakeup()
                            await task.punctuate_wall_clock()
                            continue
                        ahead = self._start(group, first)
                    current, ahead = ahead, None
                    await current.done.wait()
                    if current.value is CLOSED:
                        break  # the task closed during a back-off: the range is read again by the next owner
                    # With a backlog (a full range past this one), the next range's first job runs on the
                    # cluster while this range's handlers are asked and its output is written; its own
                    # outcome is looked at only after that. Without one it waits: it would hold only
                    # what came during this read, and on a small cluster two jobs at once make each
                    # slower (at 2,000 rec/s on two cores, p50 1.2 -> 1.8 s when it always read ahead).
                    if self._reads_ahead:
                        following = await self._next_range(current.kafka_range.end)
                        if following is not None and following.size >= self._work.limit.records:
                            ahead = self._start(group, following)
                        elif following is None:
                            self._idle()
                    running, current = current, None
                    await self._run_range(running)
                    if ahead is not None and (task.pause_point is not None
                                              or task.position(tp) != ahead.kafka_range.start):
                        # Paused inside this range (or closed): the next owner, or the resume, reads on from
                        # the position, so what was read ahead of it goes.
                        await self._discard(ahead)
                        ahead = None
                    await task.punctuate_wall_clock()
            finally:
                with anyio.CancelScope(shield=True):
                    for dropped in (current, ahead):
                        if dropped is not None:
                            await self._discard(dropped)
        await task.flush_output()

    async def _next_range(self, start: int) -> KafkaRange | None:
        """The range from ``start`` to the partition's end offset (at most ``RangeLimit.records``);
        None when there is nothing past ``start`` yet."""
        end = (await self._reads.end_offsets([self._tp]))[self._tp]
        return pick_range(self._tp, start, end, self._work.limit.records)

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
    def _start(self, group: anyio.abc.TaskGroup, kafka_range: KafkaRange) -> _Ahead:
        """Start the range's first job (its read; the whole job when the rows come back) in
        ``group``; its outcome is ``_run_range``'s to handle, or ``_discard``'s to drop."""
        if self.sink is None:
            kind = _Kind.ROWS
        else:
            job = self._stage.executor_job()[0]
            shared = self._jobs is not None and isinstance(job, TransformJob) and job.row_wise
            kind = _Kind.SHARED if shared else _Kind.DIRECT
        ahead = _Ahead(kafka_range, kind, time.perf_counter_ns())
        group.start_soon(fail_stray, f"a Spark read of task {self._task.id}", self._first_job, ahead)
        return ahead

    async def _first_job(self, ahead: _Ahead) -> None:
        kafka_range = ahead.kafka_range
        try:
            with ahead.scope:
                if ahead.kind is _Kind.SHARED:
                    assert self._jobs is not None
                    ahead.value = await self._jobs.read(self, kafka_range, self._read_ranges, self._unpersist)
                elif ahead.kind is _Kind.DIRECT:
                    ahead.kafka_range, ahead.value = await self._read_alone(kafka_range)
                else:
                    ahead.kafka_range, ahead.value = await self._work.settle(self._work.run, kafka_range, narrow=True)
        finally:
            ahead.done.set()

    async def _discard(self, ahead: _Ahead) -> None:
        """Drop a range read ahead: cancel its job if it still runs, and let go of what it made."""
        ahead.scope.cancel()
        await ahead.done.wait()
        value = ahead.value
        if ahead.kind is _Kind.SHARED and value is not None:
            assert self._jobs is not None
            await self._jobs.done(*value)
        elif ahead.kind is _Kind.DIRECT and isinstance(value, tuple):
            await self._unpersist(value[0])

    async def _run_range(self, ahead: _Ahead) -> None:
        """The rest of a range whose first job is done: its handlers, its output, its position."""
        task, stage, kafka_range, first = self._task, self._stage, ahead.kafka_range, ahead.value
        self._running = kafka_range
        self._outcomes.stopped_at = None
        try:
            if ahead.kind is _Kind.SHARED:
                assert self.sink is not None and self._jobs is not None
                done, summary = await self._run_shared(self._jobs, first, ahead, self.sink)
                kafka_range = ahead.kafka_range  # cut when its read timed out
            elif ahead.kind is _Kind.DIRECT:
                assert self.sink is not None
                done, summary = await self._run_direct(first, kafka_range, self.sink)
            elif isinstance(first, Exception):
                done, summary = True, None
                await self._fail_each(kafka_range, first)
            else:
                done, summary = True, first.summary()
                await self._outcomes.report_failures(first)
                if first.rows is not None and summary is not None:
                    await self._outcomes.forward(first.rows, summary)
            if not done:
                return  # the task closed during a back-off: the range is read again by the next owner
        finally:
            self._running = None
        tp = self._tp
        # Done up to the end, or up to where a PAUSE stopped the handlers: a resume since then (with
        # the range still running) must not carry the position past records it did not ask about.
        stopped = self._outcomes.stopped_at
        end = kafka_range.end if stopped is None else min(kafka_range.end, stopped)
        task.positions.advance_past(tp, end - 1, [], task.paused_offset(tp))
        count = summary[COUNT] if summary is not None else kafka_range.size
        task.processed += count
        elapsed_ns = time.perf_counter_ns() - ahead.began
        task.meter.add(count, elapsed_ns)
        self._work.limit.finished(kafka_range.size, elapsed_ns / 1e6, self._work.timeout_ms)
        self.ranges += 1
        log.debug("Spark stage '%s' read %s on the executors: %d records", stage.name, kafka_range, count)
        if summary is not None and summary[MAX_TIMESTAMP] is not None:
            punctuating = self._outcomes.path.passed(summary[MAX_TIMESTAMP])
            if punctuating is not None:
                await punctuating

    async def _read_alone(self, kafka_range: KafkaRange) -> tuple[KafkaRange,
                                                                  tuple[Any, list[RangeOutcome]] | Exception | Closed]:
        """Read (and persist) the range in a job of its own, retrying under ``task.timeout.ms`` (a
        timeout with half its offsets: the range read comes first)."""
        return await self._work.settle(self._work.read_range, kafka_range, narrow=True, release=release_read)

    async def _run_direct(self, read: tuple[Any, list[RangeOutcome]] | Exception | Closed, kafka_range: KafkaRange,
                          sink: SinkNode) -> tuple[bool, dict[str, Any] | None]:
        """A range whose output the executors write to ``sink``'s topic, once ``read`` (``_read_alone``)
        is done: ask the handlers about its failed records, then write. (False, None) when the task
        closed during a back-off; else True and the range's summary (None after a job that raised)."""
        ranges = (kafka_range,)
        if read is CLOSED:
            return False, None
        if isinstance(read, Exception):
            await self._fail_each(kafka_range, read)
            return True, None
        frame, (outcome,) = read
        try:
            await self._outcomes.report_failures(outcome)
            summary = outcome.summary()
            if summary is None or not self._outcomes.leaves(summary[OFFSET]):
                return True, summary
            return await self._write_alone(frame, ranges, 0, kafka_range, sink, summary)
        finally:
            with anyio.CancelScope(shield=True):
                await self._unpersist(frame)

    async def _run_shared(self, jobs: RangeJobs, read: tuple[RangeGroup, int], ahead: _Ahead,
                          sink: SinkNode) -> tuple[bool, dict[str, Any] | None]:
        """``_run_direct`` together with the stage's other tasks on the thread: the range was read in
        one job with theirs (``read``: the group and the range's index in it, from ``RangeJobs.read``),
        and is written in one job with theirs (``streamloop.tasks.range_jobs``). When either job
        failed, this range is read or written on its own, as ``_run_direct`` does (after a timed-out
        read, cut to the halved limit: ``ahead.kafka_range``)."""
        stage, kafka_range = self._stage, ahead.kafka_range
        group, index = read
        try:
            if group.read.error is not None:
                log.info("Spark stage '%s': a read shared by %d tasks failed (%r); %s is read on its own",
                         stage.name, len(group.ranges), group.read.error, kafka_range)
                if isinstance(group.read.error, SparkBatchTimeoutError):
                    self._work.timed_out(kafka_range)
                ahead.kafka_range, alone = await self._read_alone(self._work.limit.narrowed(kafka_range))
                return await self._run_direct(alone, ahead.kafka_range, sink)
            outcome = group.outcome(index)
            await self._outcomes.report_failures(outcome)
            summary = outcome.summary()
            leaves = summary is not None and self._outcomes.leaves(summary[OFFSET])
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
                if isinstance(written, SparkBatchTimeoutError):
                    self._work.timed_out(kafka_range)
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
        # A frame's range is written whole (its rows are read already), retried as it is.
        _written_range, written = await self._work.settle(lambda _range, tag: write(tag), kafka_range)
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
        return await self._work.off_loop(functools.partial(self._work.read_ranges, ranges), ranges[0], release_read)

    async def _write_ranges(self, sink: SinkNode, frame: Any, ranges: tuple[KafkaRange, ...], leaving: Sequence[int],
                            stamps: tuple[int, ...]) -> str | None:
        """Write the ranges at ``leaving`` of a group's ``frame``: one range alone (``stamps``: its
        timestamp) or several in one row-wise job (``stamps``: each range's)."""
        partitions = await self._partitions(sink)
        work = functools.partial(self._work.write_ranges, frame, ranges, tuple(leaving), stamps, sink, partitions)
        return await self._work.off_loop(work, ranges[leaving[0]])

    async def _unpersist(self, frame: Any) -> None:
        await anyio.to_thread.run_sync(frame.unpersist)

    # -- handlers -------------------------------------------------------------------
    async def _fail_each(self, kafka_range: KafkaRange, error: Exception) -> None:
        """The job raised: each record of the range to the processing handler with
        ``SparkBatchError`` (one that does not decode to the deserialization handler), as the
        driver path does; the range is read once more, raw, for that."""
        log.warning("Spark stage '%s' failed on %s: %r; asking the handlers about each record", self._stage.name,
                    kafka_range, error)
        raws = await self._work.off_loop(functools.partial(self._work.raw, kafka_range), kafka_range)
        await self._outcomes.fail_each(kafka_range, error, raws)
