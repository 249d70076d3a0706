"""``StreamTask``: one sub-topology over one partition number, run by its own coroutine.

The stream thread buffers fetched records into the task; the task's coroutine
(``run``) processes them in a tight loop: deserialize, run the graph, and only
await where a processor is async. The committable position of each partition
advances only after a record's whole graph has finished.

A task with logged state stores first restores them (RESTORING). With a record
cache, its stores' updates go down when the task flushes them between records;
a commit covers only the positions of records whose updates went down.

States::

    CREATED ──> RESTORING ──> RUNNING ──> CLOSED
       │            │  ┌────────^ │
       │            │  │          v
       │            │  │        PAUSED ──> CLOSED
       │            └──┼──────────────────> CLOSED
       └───────────────┴──────────────────> CLOSED
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from enum import Enum
from typing import TYPE_CHECKING

from anyio import CancelScope

from engine.errors import (
    DeserializationError,
    ProcessingError,
    ProducerFencedError,
    StreamsError,
    TaskCorruptedError,
    TaskError,
    TaskMigratedError,
    TransportError,
)
from engine.lifecycle import StateMachine
from engine.logcontext import LogContext
from engine.metrics import ProcessMeter
from engine.processors.context import TaskContext
from engine.processors.punctuation import Schedule
from engine.records import ConsumerRecord, Record, TopicPartition
from engine.spark.bulk import BatchWindow, bulk_window
from engine.topology.topology import TaskGraph
from engine.transport.base import OffsetAndMetadata

from .task_id import TaskId
from .error_handling import ErrorHandling, FailureAction
from .in_flight import InFlightWindow, RecordSlot
from .timeouts import TaskTimer, is_timeout

if TYPE_CHECKING:
    from engine.collector import RecordCollector
    from engine.state.task_state import TaskStateManager

log = logging.getLogger(__name__)

# Records processed before the task yields to the loop's other coroutines.
_CHUNK = 512


class TaskState(Enum):
    CREATED = "CREATED"
    RESTORING = "RESTORING"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    CLOSED = "CLOSED"


TASK_TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    TaskState.CREATED: frozenset({TaskState.RESTORING, TaskState.RUNNING, TaskState.CLOSED}),
    TaskState.RESTORING: frozenset({TaskState.RUNNING, TaskState.CLOSED}),
    TaskState.RUNNING: frozenset({TaskState.PAUSED, TaskState.CLOSED}),
    TaskState.PAUSED: frozenset({TaskState.RUNNING, TaskState.CLOSED}),
    TaskState.CLOSED: frozenset(),
}


class StreamTask:
    """Caller: ``TaskManager`` creates, feeds, commits and closes it; ``run`` is owned by the thread's task group."""

    def __init__(
        self,
        task_id: TaskId,
        partitions: Iterable[TopicPartition],
        graph: TaskGraph,
        context: TaskContext,
        send_buffered: Callable[[], object],
        logger: LogContext,
        clock_ms: Callable[[], int],
        timer_factory: Callable[[TaskId, LogContext], TaskTimer] | None = None,
        monotonic_ms: Callable[[], int] | None = None,
    ) -> None:
        self.id = task_id
        self.partitions = frozenset(partitions)
        self.graph = graph
        self.context = context
        self.log = logger.child(f"task [{task_id}] ")
        self.state = StateMachine(f"task {task_id}", TaskState.CREATED, TASK_TRANSITIONS, self.log, logging.DEBUG)
        self._send_buffered = send_buffered
        self._clock_ms = clock_ms
        self._monotonic_ms = monotonic_ms or clock_ms
        self.timer = (timer_factory or _no_retry_timer)(task_id, self.log)
        self.timeouts = 0
        self._closed_event = asyncio.Event()
        self._queues: dict[TopicPartition, deque[ConsumerRecord]] = {tp: deque() for tp in self.partitions}
        self._buffered = 0
        self._wakeup = asyncio.Event()
        self._closing = False
        # Offset of the next record to process per partition, once one was processed.
        self._next_offsets: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._committed_meta: dict[TopicPartition, OffsetAndMetadata] = {}
        # The group's committed offsets as last read for the lag metric, for partitions this
        # task has not committed itself yet (what the console shows for a task just assigned).
        self.group_committed: dict[TopicPartition, int] = {}
        self.stream_time = -1
        self.processed = 0
        self.dropped = 0
        # The thread's meter (its manager sets a shared one); the task's own when run alone.
        self.meter = ProcessMeter()
        self.finished = asyncio.Event()
        # Set by the thread that runs ``run``; cancelling it abandons a record that hangs.
        self.cancel_scope: CancelScope | None = None
        self.errors: ErrorHandling | None = None
        # Set by the manager when num.threads.per.task > 1: records then run concurrently.
        self.window: InFlightWindow | BatchWindow | None = None
        self._done_high: dict[TopicPartition, int] = {}
        self.on_pause: Callable[[StreamTask], None] | None = None
        self.paused_at: tuple[TopicPartition, int] | None = None
        # State stores (set by the manager when the sub-topology has any) and how to restore them.
        self.state_manager: TaskStateManager | None = None
        self.restore: Callable[[], Awaitable[object]] | None = None
        # Held while a chunk of records runs: a commit flushes the caches only between records.
        self.processing = asyncio.Lock()
        self._flush_requested = False
        self._flushed_offsets: dict[TopicPartition, int] = {}
        # Exactly-once: the task's own collector (over its transactional producer), what starts the
        # producer before anything else, and the failure that ends the task's transaction.
        self.exactly_once = False
        self.collector: RecordCollector | None = None
        self.initialize: Callable[[], Awaitable[object]] | None = None
        self.transaction_error: TaskCorruptedError | TaskMigratedError | None = None
        self.on_transaction_failed: Callable[[StreamTask], None] | None = None

    def __repr__(self) -> str:
        return f"StreamTask({self.id}, {sorted(self.partitions)}, {self.state.state.name})"

    # -- input ----------------------------------------------------------------
    def add_records(self, partition: TopicPartition, records: Sequence[ConsumerRecord]) -> int:
        """Buffer fetched records; returns how many this partition now holds.

        A paused task drops them: they were fetched before its partitions were
        paused, and ``resume`` reads them again.
        """
        if self.state.state is TaskState.PAUSED:
            return 0
        queue = self._queues[partition]
        queue.extend(records)
        self._buffered += len(records)
        self._wakeup.set()
        return len(queue)

    def buffered(self, partition: TopicPartition | None = None) -> int:
        if partition is None:
            return self._buffered
        return len(self._queues[partition])

    # -- the task's coroutine -------------------------------------------------------
    def request_close(self) -> None:
        """Stop after the record in progress (if any); ``finished`` is set when ``run`` returns."""
        self._closing = True
        self._wakeup.set()
        self._closed_event.set()

    async def run(self) -> None:
        started = self._monotonic_ms()
        try:
            await self._run()
        except (TaskCorruptedError, TaskMigratedError, ProducerFencedError) as exc:
            if not self.exactly_once:
                raise
            self.transaction_failed(exc if not isinstance(exc, ProducerFencedError)
                                    else TaskMigratedError(self.id, str(exc)))
        except TransportError as exc:
            if not (self.exactly_once and is_timeout(exc)):
                raise
            # Starting the producer or restoring timed out: start over (the timer is kept). An attempt
            # that started past task.timeout.ms is the last one (a revived task keeps its timer).
            self.timer.on_timeout(exc, "Initialising", started, cleared_by_processing=False)
            self.transaction_failed(TaskCorruptedError(self.id, f"initialising timed out: {exc}"))
        finally:
            self.finished.set()

    async def _prepare(self, step: Callable[[], Awaitable[object]], what: str) -> bool:
        """Run a step before processing; False when the task is closing (then a failure is expected:
        the thread may be closing the consumer the step uses)."""
        if self._closing:
            return False
        try:
            await step()
        except Exception as exc:
            if not self._closing:
                raise
            self.log.info("Stopped %s: the task is closing (%r)", what, exc)
            return False
        return not self._closing

    def transaction_failed(self, error: TaskCorruptedError | TaskMigratedError) -> None:
        """Exactly-once: the task's transaction must be aborted; the task manager revives or migrates it."""
        if self.transaction_error is None:
            self.transaction_error = error
            self._closing = True
            self._wakeup.set()
            self._closed_event.set()
            if self.on_transaction_failed is not None:
                self.on_transaction_failed(self)

    def discard_buffered(self, partition: TopicPartition) -> None:
        """Drop the records fetched from ``partition`` (it was seeked to its committed offset)."""
        queue = self._queues[partition]
        self._buffered -= len(queue)
        queue.clear()

    async def _run(self) -> None:
        if self.initialize is not None and not await self._prepare(self.initialize, "initialising"):
            return
        if self.restore is not None:
            if self._closing:
                return
            self.state.transition_to(TaskState.RESTORING)
            if not await self._prepare(self.restore, "restoring"):
                return
        self.state.transition_to(TaskState.RUNNING)
        if self.window is not None:
            # A Spark stage right after the source takes its records in bulk: one entry per batch.
            self.window = bulk_window(self) or self.window
            await self.window.run()
            return
        caching = self.state_manager is not None and self.state_manager.caching
        while not self._closing:
            if self._buffered == 0:
                await self._idle()
                # Punctuations may have produced output; hand it on now, not at the next chunk.
                await self._send_buffered()  # type: ignore[misc]
                continue
            async with self.processing:
                await self._process_chunk()
                if caching and self._flush_requested:
                    await self.flush_state()
            # Output of this chunk goes to the network together: one batch per partition.
            await self._send_buffered()  # type: ignore[misc]
            await asyncio.sleep(0)

    # -- state stores -------------------------------------------------------------
    async def flush_state(self) -> None:
        """Send the caches' updates down (forwarding them) and remember the positions they cover.

        Caller: this task's coroutine or the committer, holding ``processing``.
        """
        self._flush_requested = False
        manager = self.state_manager
        if manager is None:
            return
        forwarder = self.context.forwarder
        try:
            manager.flush_caches()
            if forwarder.pending:
                await forwarder.drain()
        except Exception as exc:
            forwarder.reset()
            if isinstance(exc, StreamsError):
                raise
            node = forwarder.node.name if forwarder.node is not None else "cache flush"
            raise ProcessingError(self.id, node, None, None, None, exc) from exc
        self._flushed_offsets = dict(self._next_offsets)

    async def prepare_commit(self) -> None:
        """Before a commit: flush the caches now if no record is running, else after the current chunk."""
        if self.state_manager is None or not self.state_manager.caching or self.window is not None:
            return
        if self.processing.locked():
            self._flush_requested = True
            return
        async with self.processing:
            await self.flush_state()
    async def process_buffered(self) -> None:
        """Process every buffered record now and hand the output on, one record at a time.

        Caller: ``engine.testing.TopologyTestDriver``, which schedules tasks itself instead of
        running ``run``. It is the same path as ``run`` (timeouts back off and retry, handlers
        decide), except that records of a task never run concurrently. Returns early when the
        task pauses or closes; a FAIL answer or a ``TaskTimeoutError`` is raised as in ``run``.
        """
        if self.state.state is TaskState.CREATED:
            if self.restore is not None:
                self.state.transition_to(TaskState.RESTORING)
                await self.restore()
            self.state.transition_to(TaskState.RUNNING)
        while self._buffered and self.state.state is TaskState.RUNNING and not self._closing:
            await self._process_chunk()
            await self._send_buffered()  # type: ignore[misc]

    async def _idle(self) -> None:
        self._wakeup.clear()
        due = self.context.wall_clock_schedules.next_due()
        timeout = None if due is None else max(0.0, (due - self._clock_ms()) / 1000.0)
        if timeout is None:
            await self._wakeup.wait()
        else:
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout)
            except TimeoutError:
                pass
        if self.context.wall_clock_schedules.next_due() is not None:
            async with self.processing:
                await self.maybe_punctuate_wall_clock()

    def _next_partition(self) -> deque[ConsumerRecord] | None:
        """The partition whose head has the lowest timestamp (Kafka Streams' choice)."""
        best: deque[ConsumerRecord] | None = None
        for queue in self._queues.values():
            if queue and (best is None or queue[0].timestamp < best[0].timestamp):
                best = queue
        return best

    async def _process_chunk(self) -> None:
        ctx = self.context
        forwarder = ctx.forwarder
        sources = self.graph.sources
        single = len(self._queues) == 1
        queue = self._next_partition()
        timer = self.timer
        # Records of a task with state run one at a time here: their store updates are journaled
        # so that a record run again (timeout retry, resume after PAUSE) does not apply them twice.
        states = self.state_manager if self.state_manager is not None and self.state_manager.stores else None
        done = 0
        began = time.perf_counter_ns()
        while queue and done < _CHUNK and not self._closing:
            raw = queue[0]
            # Only a retry needs to know when its attempt started (the final-attempt rule).
            started = self._monotonic_ms() if timer.deadline_ms is not None else 0
            source = sources[raw.topic]
            ctx.topic = raw.topic
            ctx.partition = raw.partition
            ctx.offset = raw.offset
            ctx.timestamp = raw.timestamp
            ctx.headers = raw.headers
            what = "key"
            try:
                key = source.key_serde.deserialize(raw.key)
                what = "value"
                value = source.value_serde.deserialize(raw.value)
            except Exception as exc:  # noqa: BLE001 - any serde failure is a deserialization error
                if await self._deserialization_failed(raw, what, exc) is FailureAction.PAUSE:
                    break
                self._skip(queue, raw)
                done += 1
                continue
            record = Record(key, value, raw.timestamp, raw.headers)
            if states is not None:
                states.begin_record()
            try:
                if forwarder.start(source, record):
                    await forwarder.drain()
                    if self.state.state is TaskState.CLOSED:
                        return  # closed dirty while the record was in flight: nothing more to do
            except StreamsError as exc:
                forwarder.reset()
                if not is_timeout(exc):
                    raise
                if states is not None:
                    states.undo_record()
                await self._back_off(exc, f"sending for {raw.topic}-{raw.partition} offset {raw.offset}",
                                     started)
                break
            except Exception as exc:
                node = forwarder.node.name if forwarder.node is not None else source.name
                forwarder.reset()
                if not is_timeout(exc):
                    action = await self._processing_failed(raw, node, record, exc)
                    if action is FailureAction.PAUSE:
                        if states is not None:
                            states.undo_record()  # resume() runs the record again
                        break
                    if states is not None:
                        states.end_record()
                    self._skip(queue, raw)
                    done += 1
                    continue
                # The record stays at the head of its queue: it is retried, never skipped.
                if states is not None:
                    states.undo_record()
                await self._back_off(exc, f"Processor '{node}' on {raw.topic}-{raw.partition} offset "
                                          f"{raw.offset}", started)
                break
            if states is not None:
                states.end_record()
            if timer.deadline_ms is not None and timer.cleared_by_processing:
                timer.clear()
            queue.popleft()
            self._buffered -= 1
            self._next_offsets[(raw.topic, raw.partition)] = raw.offset + 1  # type: ignore[index]
            done += 1
            if raw.timestamp > self.stream_time:
                self.stream_time = raw.timestamp
                if ctx.stream_time_schedules.next_due() is not None:
                    await self._punctuate(ctx.stream_time_schedules.due(self.stream_time), self.stream_time)
            if not single:
                queue = self._next_partition()
        self.processed += done
        self.meter.add(done, time.perf_counter_ns() - began)
        if ctx.wall_clock_schedules.next_due() is not None:
            await self.maybe_punctuate_wall_clock()

    async def _deserialization_failed(self, raw: ConsumerRecord, what: str, exc: Exception) -> FailureAction:
        """Ask the deserialization handler; FAIL raises, PAUSE pauses, CONTINUE is the caller's to do."""
        error = DeserializationError(self.id, raw.topic, raw.partition, raw.offset, what, exc)
        error.__cause__ = exc
        if self.errors is None:
            raise error from exc
        action = await self.errors.on_deserialization_error(self.id, raw, error)
        return self._act_on(action, raw, error, exc)

    async def _processing_failed(self, raw: ConsumerRecord, node: str, record: Record,
                                 exc: Exception) -> FailureAction:
        """Ask the processing handler; FAIL raises, PAUSE pauses, CONTINUE is the caller's to do."""
        error = ProcessingError(self.id, node, raw.topic, raw.partition, raw.offset, exc)
        error.__cause__ = exc
        if self.errors is None:
            raise error from exc
        action = await self.errors.on_processing_error(self.id, raw, node, record, error)
        return self._act_on(action, raw, error, exc)

    def _act_on(self, action: FailureAction, raw: ConsumerRecord, error: TaskError,
                exc: Exception) -> FailureAction:
        if action is FailureAction.FAIL:
            raise error from exc
        if action is FailureAction.PAUSE:
            self._pause(raw)
        else:
            self.dropped += 1
        return action

    def _skip(self, queue: deque[ConsumerRecord], raw: ConsumerRecord) -> None:
        """A handler said CONTINUE: the record is dropped and its offset committed past."""
        queue.popleft()
        self._buffered -= 1
        self._next_offsets[(raw.topic, raw.partition)] = raw.offset + 1  # type: ignore[index]

    # -- PAUSE ------------------------------------------------------------------
    def _pause(self, raw: ConsumerRecord) -> None:
        """A handler said PAUSE: nothing more of this task is processed until ``resume``.

        The failed record's offset becomes the partition's committable position, so
        the commit that follows leaves the group at exactly that record (once the
        records below it still in flight are done). Buffered records are dropped;
        ``resume`` seeks back to them.
        """
        tp = TopicPartition(raw.topic, raw.partition)
        if self.paused_at is not None and self.paused_at[0] == tp:
            # Records in flight that failed together, a higher one asked first: pause lower.
            if raw.offset < self.paused_at[1]:
                self.paused_at = (tp, raw.offset)
                self._next_offsets[tp] = self._below_in_flight(tp, raw.offset)
            return
        self.state.transition_to(TaskState.PAUSED)
        self.paused_at = (tp, raw.offset)
        self._next_offsets[tp] = self._below_in_flight(tp, raw.offset)
        for other, queue in self._queues.items():
            if queue and other not in self._next_offsets:
                # Nothing processed here yet: the dropped records start where fetching began.
                self._next_offsets[other] = queue[0].offset
            queue.clear()
        self._buffered = 0
        self.timer.clear()  # a paused task keeps no timer
        self.context.commit_requested = True
        self.log.error("Paused at %s offset %d; resume with KafkaStreams.resume(%s)", tp, raw.offset,
                       f"'{self.id}'")
        if self.on_pause is not None:
            self.on_pause(self)

    def _below_in_flight(self, tp: TopicPartition, offset: int) -> int:
        """``offset``, or lower while records below it are still in flight (a batch that has not
        finished): committing past them would lose them in a crash."""
        lowest = self.window.lowest_in_flight(tp) if self.window is not None else None
        return offset if lowest is None else min(offset, lowest)

    def first_buffered_offset(self, partition: TopicPartition) -> int | None:
        """The offset of the first fetched record waiting in ``partition``'s queue, if any."""
        queue = self._queues.get(partition)
        return queue[0].offset if queue else None

    def position(self, partition: TopicPartition) -> int | None:
        """The next offset to process on ``partition``, once one was processed (or failed)."""
        return self._next_offsets.get(partition)

    def resume(self, skip: bool) -> None:
        """Caller: ``TaskManager.resume`` after it seeked the partitions back."""
        if skip and self.paused_at is not None:
            tp, offset = self.paused_at
            self._next_offsets[tp] = self._below_in_flight(tp, offset + 1)
            self.context.commit_requested = True
        self.paused_at = None
        self.state.transition_to(TaskState.RUNNING)
        self._wakeup.set()

    @property
    def is_paused(self) -> bool:
        return self.state.state is TaskState.PAUSED

    @property
    def stores_restored(self) -> bool:
        """Whether its stores were brought up to their changelogs (it got past RESTORING): only
        then may a clean close checkpoint them. A task closed before that (a rebalance at
        start-up) holds empty or partial stores, and a checkpoint would make them final."""
        return self.state.state in (TaskState.RUNNING, TaskState.PAUSED)

    def committed_offsets(self) -> dict[TopicPartition, int]:
        """The last committed position per partition; a copy, safe to take from another thread."""
        own = {TopicPartition(*tp): offset for tp, offset in dict(self._committed).items()}
        return {**dict(self.group_committed), **own}

    async def _back_off(self, exc: BaseException, what: str, started: int) -> None:
        """Set this task aside for the back-off; the thread's other tasks run meanwhile."""
        self.timeouts += 1
        backoff = self.timer.on_timeout(exc, what, started)
        if self.exactly_once:
            # The record may have sent part of its output into the open transaction: retrying it
            # would send that part twice. The transaction is aborted and the task revived instead.
            raise TaskCorruptedError(self.id, f"{what} timed out") from exc
        try:
            await asyncio.wait_for(self._closed_event.wait(), backoff)
        except TimeoutError:
            pass

    async def maybe_punctuate_wall_clock(self) -> None:
        schedules = self.context.wall_clock_schedules
        if schedules.next_due() is not None:
            now = self._clock_ms()
            await self._punctuate(schedules.due(now), now)

    async def _punctuate(self, fired: list[Schedule], timestamp: int) -> None:
        ctx = self.context
        for entry in fired:
            ctx.topic = ctx.partition = ctx.offset = None
            ctx.headers = ()
            ctx.timestamp = timestamp
            try:
                result = entry.callback(ctx.timestamp)
                if result is not None and hasattr(result, "__await__"):
                    await result
                if ctx.forwarder.pending:
                    await ctx.forwarder.drain()
            except StreamsError:
                ctx.forwarder.reset()
                raise
            except Exception as exc:
                ctx.forwarder.reset()
                raise ProcessingError(self.id, entry.node_name, None, None, None, exc) from exc

    # -- records in flight (num.threads.per.task > 1); caller: InFlightWindow -----------
    @property
    def closing(self) -> bool:
        return self._closing

    def queues(self) -> dict[TopicPartition, deque[ConsumerRecord]]:
        return self._queues

    def take(self, tp: TopicPartition, index: int) -> ConsumerRecord:
        queue = self._queues[tp]
        if index == 0:
            raw = queue.popleft()
        else:
            raw = queue[index]
            del queue[index]
        self._buffered -= 1
        return raw

    def clear_wakeup(self) -> None:
        self._wakeup.clear()

    async def wait_for_wakeup(self) -> None:
        due = self.context.wall_clock_schedules.next_due()
        if due is None:
            await self._wakeup.wait()
            return
        try:
            await asyncio.wait_for(self._wakeup.wait(), max(0.0, (due - self._clock_ms()) / 1000.0))
        except TimeoutError:
            pass

    def wake(self) -> None:
        self._wakeup.set()

    async def flush_output(self) -> None:
        await self._send_buffered()  # type: ignore[misc]

    def advance_past(self, tp: TopicPartition, offset: int, lowest_in_flight: int | None) -> int:
        """``offset`` is done: the committable position becomes the contiguous watermark (returned)."""
        high = self._done_high.get(tp, -1)
        if offset > high:
            self._done_high[tp] = high = offset
        queue = self._queues[tp]
        bounds = [b for b in (lowest_in_flight, queue[0].offset if queue else None) if b is not None]
        watermark = min(bounds) if bounds else high + 1
        if self.paused_at is not None and self.paused_at[0] == tp:
            watermark = min(watermark, self.paused_at[1])
        self._next_offsets[tp] = watermark
        self.processed += 1
        return watermark

    async def process_in_flight(self, slot: RecordSlot) -> None:
        """One record's whole graph, on its own coroutine; timeouts retry it in place."""
        raw, ctx = slot.raw, self.context
        source = self.graph.sources[raw.topic]
        forwarder = ctx.forwarder
        began = time.perf_counter_ns()
        while True:
            started = self._monotonic_ms() if self.timer.deadline_ms is not None else 0
            what = "key"
            try:
                key = source.key_serde.deserialize(raw.key)
                what = "value"
                value = source.value_serde.deserialize(raw.value)
            except Exception as exc:  # noqa: BLE001 - any serde failure is a deserialization error
                await self._deserialization_failed(raw, what, exc)
                return
            record = Record(key, value, raw.timestamp, raw.headers)
            try:
                if forwarder.start(source, record):
                    await forwarder.drain()
            except Exception as exc:
                node = forwarder.node.name if forwarder.node is not None else source.name
                forwarder.reset()
                if is_timeout(exc):
                    slot.outputs.clear()  # this attempt's output was never released: no duplicate
                    self.timeouts += 1
                    backoff = self.timer.on_timeout(
                        exc, f"Processor '{node}' on {raw.topic}-{raw.partition} offset {raw.offset}", started)
                    await asyncio.sleep(backoff)
                    continue
                if isinstance(exc, StreamsError):
                    raise
                if self._paused_below(raw):
                    return
                await self._processing_failed(raw, node, record, exc)
                return
            if self.timer.deadline_ms is not None and self.timer.cleared_by_processing:
                self.timer.clear()
            self.meter.add(1, time.perf_counter_ns() - began)
            return

    def _paused_below(self, raw: ConsumerRecord) -> bool:
        """Whether the task is PAUSED at a lower offset of ``raw``'s partition.

        Records that fail together (a Spark batch) then ask the handler once: the records
        above the pause are read again on resume (their output is dropped and the commit
        stops at the paused record), and asked about then if they fail again.
        """
        paused = self.paused_at
        return (paused is not None and paused[0] == (raw.topic, raw.partition)
                and raw.offset > paused[1])

    # -- commit ----------------------------------------------------------------
    def committable_offsets(self) -> dict[TopicPartition, OffsetAndMetadata]:
        """Positions that moved since the last commit: the next offset to read per partition.

        With a record cache, only positions whose state updates went down (the last
        flush). With records in flight, the metadata lists offsets done above the watermark.
        """
        window = self.window
        if window is None:
            positions = self._next_offsets
            if self.state_manager is not None and self.state_manager.caching:
                positions = self._flushed_offsets
            return {
                TopicPartition(*tp): OffsetAndMetadata(offset)
                for tp, offset in positions.items()
                if self._committed.get(tp) != offset
            }
        # With records in flight the metadata may change while the watermark stays.
        with_meta = {
            TopicPartition(*tp): OffsetAndMetadata(offset, window.metadata(TopicPartition(*tp), offset))
            for tp, offset in self._next_offsets.items()
        }
        return {tp: om for tp, om in with_meta.items() if self._committed_meta.get(tp) != om}

    def mark_committed(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        for tp, om in offsets.items():
            if tp in self._queues:
                self._committed[tp] = om.offset
                self._committed_meta[tp] = om

    def commit_needed(self) -> bool:
        return self.context.commit_requested

    # -- closing --------------------------------------------------------------
    def close(self, clean: bool = False) -> None:
        """Close the processors and stores; idempotent. ``clean``: everything processed is committed."""
        if self.state.state is TaskState.CLOSED:
            return
        self.state.transition_to(TaskState.CLOSED)
        self.context.forwarder.reset()
        for queue in self._queues.values():
            queue.clear()
        self._buffered = 0
        try:
            self.graph.close()
        except Exception:  # noqa: BLE001 - a failing close must not stop the others closing
            self.log.exception("Error closing the processors")
        if self.state_manager is not None:
            self.state_manager.close(clean)


def _no_retry_timer(task_id: TaskId, log: LogContext) -> TaskTimer:
    """Without a configured timer (tests of the task alone) a timeout fails at once."""
    return TaskTimer(task_id, 0, 0, 0, lambda: 0, log)
