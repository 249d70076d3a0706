"""``StreamTask``: one sub-topology over one partition number: its lifecycle and what it exposes.

The stream thread buffers fetched records into the task; the task's coroutine
(``run``) first starts what the task needs (exactly-once: its producer; logged
stores: RESTORING), then hands over to its run loop, which processes the records
(``processing.py``: the per-record path and the sequential chunk loop;
``in_flight.py``: records concurrently). The committable position of each
partition advances only after a record's whole graph has finished; the commit
(``engine/commit/``) takes it from ``offsets_to_commit``.

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

A close is asked for (``request_close``) before it happens (``close``): in between the
task finishes its record and its run loop returns. That request is the ``stop`` event,
not a state: a task asked to stop is still RESTORING, RUNNING or PAUSED, which is what
its closing needs to know (whether its stores were restored, whether a handler paused it).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from enum import Enum
from typing import TYPE_CHECKING

import anyio
from anyio import CancelScope

from engine.completed_offsets import decode_metadata
from engine.errors import (
    ProcessingError,
    ProducerFencedError,
    StreamsError,
    TaskCorruptedError,
    TaskMigratedError,
    TransportError,
)
from engine.ids import TaskId
from engine.lifecycle import StateMachine
from engine.logcontext import LogContext
from engine.metrics import ProcessMeter
from engine.processors.api import ObservesStreamTime
from engine.processors.context import TaskContext
from engine.processors.nodes import ProcessorNode
from engine.records import ConsumerRecord, TopicPartition
from engine.topology.specs import TaskGraph
from engine.transport.base import OffsetAndMetadata

from .bulk import BatchWindow, bulk_window
from .bulk_jobs import StageJobs
from .error_handling import ErrorHandling
from .positions import Positions
from .processing import ChunkLoop
from .punctuation import Punctuations
from .timeouts import TaskTimer, is_timeout

if TYPE_CHECKING:
    from engine.collector import RecordCollector
    from engine.state.task_state import TaskStateManager

    from .in_flight import InFlightWindow

log = logging.getLogger(__name__)


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
        send_buffered: Callable[[], Awaitable[object]],
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
        self.monotonic_ms = monotonic_ms or clock_ms
        self.timer = (timer_factory or _no_retry_timer)(task_id, self.log)
        self.timeouts = 0
        # Set once a close is requested (or the transaction failed): the run loop ends after its record.
        self._stop = anyio.Event()
        self._queues: dict[TopicPartition, deque[ConsumerRecord]] = {tp: deque() for tp in self.partitions}
        # Set when there is something to do; a fresh event replaces a set one (anyio's cannot be cleared).
        self._wakeup = anyio.Event()
        self.positions = Positions(self.partitions, self.partition_time)
        # The group's committed offsets as last read for the lag metric, for partitions this
        # task has not committed itself yet (what the console shows for a task just assigned).
        self.group_committed: dict[TopicPartition, int] = {}
        self.stream_time = -1
        # The (extracted) timestamp of the record last taken to process; -1 when it could not be read.
        self.record_time = -1
        # Sources with timestamp extractors: each partition's time (the largest timestamp taken from
        # it), and the heads' timestamps extracted to choose among them (offset, timestamp).
        self.partition_times: dict[tuple[str, int], int] = {}
        self.head_stamps: dict[tuple[str, int], tuple[int, int]] = {}
        # Set when a source has an extractor: orders the partitions' heads (else their own timestamps).
        self.head_time: Callable[[ConsumerRecord], int] | None = None
        self.processed = 0
        self.dropped = 0
        # The thread's meter (its manager sets a shared one); the task's own when run alone.
        self.meter = ProcessMeter()
        self.finished = anyio.Event()
        # Set by the thread that runs ``run``; cancelling it abandons a record that hangs.
        self.cancel_scope: CancelScope | None = None
        self.errors: ErrorHandling | None = None
        # Set by the manager when num.threads.per.task > 1: records then run concurrently.
        self.window: InFlightWindow | BatchWindow | None = None
        # The Spark jobs the bulk path shares with the thread's other tasks, by stage (task manager).
        self.spark_jobs: dict[str, StageJobs] | None = None
        self.on_pause: Callable[[StreamTask], None] | None = None
        self.paused_at: tuple[TopicPartition, int] | None = None
        self.punctuations = Punctuations(task_id, context, clock_ms)
        # State stores (set by the manager when the sub-topology has any) and how to restore them.
        self.state_manager: TaskStateManager | None = None
        self.restore: Callable[[], Awaitable[object]] | None = None
        # Held while a chunk of records runs: a commit flushes the caches only between records.
        # Fast: the chunk loop takes it once per chunk and must not yield to do so.
        self.processing = anyio.Lock(fast_acquire=True)
        self.flush_requested = False
        # Exactly-once: the task's own collector (over its transactional producer), what starts the
        # producer before anything else, and the failure that ends the task's transaction.
        self.exactly_once = False
        self.collector: RecordCollector | None = None
        self.initialize: Callable[[], Awaitable[object]] | None = None
        self.transaction_error: TaskCorruptedError | TaskMigratedError | None = None
        self.on_transaction_failed: Callable[[StreamTask], None] | None = None
        # The group's committed offset of a partition (set by the manager): the partition times
        # a previous owner committed are restored from it before the first record.
        self.committed: Callable[[TopicPartition], Awaitable[OffsetAndMetadata | None]] | None = None

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
        self._wakeup.set()
        return len(queue)

    def buffered(self, partition: TopicPartition | None = None) -> int:
        if partition is None:
            # Counted from the queues, not kept beside them: the chunk loop pops records without
            # bookkeeping, and a PAUSE or a close empties the queues.
            return sum(len(queue) for queue in self._queues.values())
        return len(self._queues[partition])

    @property
    def partition_count(self) -> int:
        return len(self._queues)

    def next_queue(self) -> deque[ConsumerRecord] | None:
        """The partition whose head has the lowest timestamp (Kafka Streams' choice)."""
        best: deque[ConsumerRecord] | None = None
        head_time = self.head_time
        if head_time is not None and len(self._queues) > 1:
            best_time = 0
            for queue in self._queues.values():
                if queue:
                    time = head_time(queue[0])
                    if best is None or time < best_time:
                        best, best_time = queue, time
            return best
        for queue in self._queues.values():
            if queue and (best is None or queue[0].timestamp < best[0].timestamp):
                best = queue
        return best

    def queues(self) -> dict[TopicPartition, deque[ConsumerRecord]]:
        return self._queues

    def take(self, tp: TopicPartition, index: int) -> ConsumerRecord:
        """Take a buffered record out of its queue to run it in flight. Caller: ``InFlightWindow``."""
        queue = self._queues[tp]
        if index == 0:
            raw = queue.popleft()
        else:
            raw = queue[index]
            del queue[index]
        return raw

    def discard_buffered(self, partition: TopicPartition) -> None:
        """Drop the records fetched from ``partition`` (it was seeked to its committed offset)."""
        self._queues[partition].clear()

    def first_buffered_offset(self, partition: TopicPartition) -> int | None:
        """The offset of the first fetched record waiting in ``partition``'s queue, if any."""
        queue = self._queues.get(partition)
        return queue[0].offset if queue else None

    # -- the task's coroutine -------------------------------------------------------
    @property
    def closing(self) -> bool:
        """A close was requested (or the transaction failed): no new record starts."""
        return self._stop.is_set()

    @property
    def closed(self) -> bool:
        return self.state.state is TaskState.CLOSED

    @property
    def is_running(self) -> bool:
        return self.state.state is TaskState.RUNNING

    def request_close(self) -> None:
        """Stop after the record in progress (if any); ``finished`` is set when ``run`` returns."""
        self._stop.set()
        self._wakeup.set()

    async def run(self) -> None:
        started = self.monotonic_ms()
        try:
            await self._run()
        except (TaskCorruptedError, TaskMigratedError, ProducerFencedError) as exc:
            if not self.exactly_once:
                raise
            if isinstance(exc, ProducerFencedError):
                migrated = TaskMigratedError(self.id, str(exc))
                migrated.__cause__ = exc
                self.transaction_failed(migrated)
            else:
                self.transaction_failed(exc)
        except TransportError as exc:
            if not (self.exactly_once and is_timeout(exc)):
                raise
            # Starting the producer or restoring timed out: start over (the timer is kept). An attempt
            # that started past task.timeout.ms is the last one (a revived task keeps its timer).
            self.timer.on_timeout(exc, "Initialising", started, cleared_by_processing=False)
            corrupted = TaskCorruptedError(self.id, f"initialising timed out: {exc}")
            corrupted.__cause__ = exc
            self.transaction_failed(corrupted)
        finally:
            self.finished.set()

    async def _run(self) -> None:
        if self.initialize is not None and not await self._prepare(self.initialize, "initialising"):
            return
        if self.committed is not None and not await self._prepare(self.restore_time, "reading the partition times"):
            return
        if self.restore is not None:
            if self.closing:
                return
            self.state.transition_to(TaskState.RESTORING)
            if not await self._prepare(self.restore, "restoring"):
                return
        self.state.transition_to(TaskState.RUNNING)
        # The one place that picks how the task's records run (a new kind of run loop goes here).
        if self.window is not None:
            # A Spark stage right after the source takes its records in bulk: one entry per batch.
            self.window = bulk_window(self) or self.window
            await self.window.run()
        else:
            await ChunkLoop(self).run()

    async def _prepare(self, step: Callable[[], Awaitable[object]], what: str) -> bool:
        """Run a step before processing; False when the task is closing (then a failure is expected:
        the thread may be closing the consumer the step uses)."""
        if self.closing:
            return False
        try:
            await step()
        except Exception as exc:
            if not self.closing:
                raise
            self.log.info("Stopped %s: the task is closing (%r)", what, exc)
            return False
        return not self.closing

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
        await ChunkLoop(self).process_buffered()

    def transaction_failed(self, error: TaskCorruptedError | TaskMigratedError) -> None:
        """Exactly-once: the task's transaction must be aborted; the task manager revives or migrates it."""
        if self.transaction_error is None:
            self.transaction_error = error
            self.request_close()
            if self.on_transaction_failed is not None:
                self.on_transaction_failed(self)

    # -- waiting -----------------------------------------------------------------------
    def clear_wakeup(self) -> None:
        """Forget past wake-ups; caller: a run loop, before it looks for work."""
        if self._wakeup.is_set():
            self._wakeup = anyio.Event()

    async def wait_for_wakeup(self) -> None:
        """Until records arrive, the task is asked to stop or a wall-clock punctuation is due."""
        wakeup = self._wakeup
        due = self.context.wall_clock_schedules.next_due()
        if due is None:
            await wakeup.wait()
            return
        with anyio.move_on_after(max(0.0, (due - self._clock_ms()) / 1000.0)):
            await wakeup.wait()

    def wake(self) -> None:
        self._wakeup.set()

    async def back_off(self, exc: BaseException, what: str, started: int) -> None:
        """A record timed out: set this task aside for the back-off; the thread's other tasks run meanwhile."""
        self.timeouts += 1
        backoff = self.timer.on_timeout(exc, what, started)
        if self.exactly_once:
            # The record may have sent part of its output into the open transaction: retrying it
            # would send that part twice. The transaction is aborted and the task revived instead.
            raise TaskCorruptedError(self.id, f"{what} timed out") from exc
        with anyio.move_on_after(backoff):
            await self._stop.wait()

    # -- output and state stores ---------------------------------------------------------
    async def flush_output(self) -> None:
        """Hand the output buffered since the last call on (one batch per partition)."""
        await self._send_buffered()

    async def flush_state(self) -> None:
        """Send the caches' updates down (forwarding them) and remember the positions they cover.

        Caller: this task's coroutine or the committer, holding ``processing``.
        """
        self.flush_requested = False
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
        self.positions.flushed()

    async def maybe_punctuate_wall_clock(self) -> None:
        await self.punctuations.maybe_wall_clock()

    # -- PAUSE ------------------------------------------------------------------
    def pause(self, raw: ConsumerRecord) -> None:
        """A handler said PAUSE: nothing more of this task is processed until ``resume``.

        The failed record's offset becomes the partition's committable position, so
        the commit that follows leaves the group at exactly that record (once the
        records below it still in flight are done). Buffered records are dropped;
        ``resume`` seeks back to them.
        """
        tp = TopicPartition(raw.topic, raw.partition)
        next_offsets = self.positions.next
        if self.paused_at is not None and self.paused_at[0] == tp:
            # Records in flight that failed together, a higher one asked first: pause lower.
            if raw.offset < self.paused_at[1]:
                self.paused_at = (tp, raw.offset)
                next_offsets[tp] = self._below_in_flight(tp, raw.offset)
            return
        self.state.transition_to(TaskState.PAUSED)
        self.paused_at = (tp, raw.offset)
        next_offsets[tp] = self._below_in_flight(tp, raw.offset)
        for other, queue in self._queues.items():
            if queue and other not in next_offsets:
                # Nothing processed here yet: the dropped records start where fetching began.
                next_offsets[other] = queue[0].offset
            queue.clear()
        self.timer.clear()  # a paused task keeps no timer
        self.context.commit_requested = True
        self.log.error("Paused at %s offset %d; resume with KafkaStreams.resume(%s)", tp, raw.offset,
                       f"'{self.id}'")
        if self.on_pause is not None:
            self.on_pause(self)

    def paused_below(self, raw: ConsumerRecord) -> bool:
        """Whether the task is PAUSED at a lower offset of ``raw``'s partition."""
        paused = self.paused_at
        return paused is not None and paused[0] == (raw.topic, raw.partition) and raw.offset > paused[1]

    def _below_in_flight(self, tp: TopicPartition, offset: int) -> int:
        """``offset``, or lower while records below it are still in flight (a batch that has not
        finished): committing past them would lose them in a crash."""
        lowest = self.window.lowest_in_flight(tp) if self.window is not None else None
        return offset if lowest is None else min(offset, lowest)

    def resume(self, skip: bool) -> None:
        """Caller: ``TaskManager.resume`` after it seeked the partitions back."""
        if skip and self.paused_at is not None:
            tp, offset = self.paused_at
            self.positions.next[tp] = self._below_in_flight(tp, offset + 1)
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

    # -- time --------------------------------------------------------------------------
    def _tracks_partition_time(self, topic: str) -> bool:
        """Whether the run loops keep ``topic``'s partition times: sources with an extractor (it is
        given the partition time); the hot path of the others keeps only the task's stream time."""
        source = self.graph.sources.get(topic)
        return source is not None and source.timestamp_extractor is not None

    def partition_time(self, tp: TopicPartition) -> int:
        """The time committed with ``tp``'s position: the partition's own where it is tracked, else
        the task's stream time, which is never below it and is what a restart needs (stream time
        is the largest of the restored times)."""
        if self._tracks_partition_time(tp[0]):
            return self.partition_times.get((tp[0], tp[1]), -1)
        return self.stream_time

    async def restore_time(self) -> None:
        """Kafka Streams' ``StreamTask.initializeTaskTime``: each partition's time and the task's
        stream time (the largest of them) start from what the last commit of its partitions says,
        so stream time does not fall back to -1 after a restart or a move: records late before
        stay late, stream-time punctuations do not fire again for times already passed."""
        assert self.committed is not None
        restored = {}
        for tp in sorted(self.partitions):
            committed = await self.committed(tp)
            if committed is None or not committed.metadata:
                continue
            time = decode_metadata(committed.offset, committed.metadata).partition_time
            if time >= 0:
                restored[(tp.topic, tp.partition)] = time
        if not restored:
            return
        for key, time in restored.items():
            if self._tracks_partition_time(key[0]):
                self.partition_times[key] = max(self.partition_times.get(key, -1), time)
        self.stream_time = max(self.stream_time, *restored.values())
        self._seed_observed_time(self.stream_time)
        self.log.debug("Restored partition times %s from the commit: stream time %d", restored, self.stream_time)

    def _seed_observed_time(self, stream_time: int) -> None:
        """Processors that keep the stream time they observed start from the restored one."""
        for node in self.graph.nodes:
            if isinstance(node, ProcessorNode) and isinstance(node.processor, ObservesStreamTime):
                node.processor.observe_stream_time(stream_time)

    # -- positions and commit ------------------------------------------------------------
    def position(self, partition: TopicPartition) -> int | None:
        """The next offset to process on ``partition``, once one was processed (or failed)."""
        return self.positions.next.get(partition)

    def committed_offsets(self) -> dict[TopicPartition, int]:
        """The last committed position per partition; a copy, safe to take from another thread."""
        return {**dict(self.group_committed), **self.positions.committed_offsets()}

    def advance_past(self, tp: TopicPartition, offset: int, lowest_in_flight: int | None) -> int:
        """``offset`` is done in flight: the committable position becomes the contiguous watermark
        (returned), never past a record still in flight, still buffered or paused at."""
        queue = self._queues[tp]
        bounds = [b for b in (lowest_in_flight, queue[0].offset if queue else None) if b is not None]
        paused = self.paused_at
        self.processed += 1
        return self.positions.advance_past(tp, offset, bounds, paused[1] if paused is not None and paused[0] == tp
                                           else None)

    def committable_offsets(self) -> dict[TopicPartition, OffsetAndMetadata]:
        """Positions of finished records that moved since the last commit: the next offset to read
        per partition. With a record cache, only positions whose state updates went down (the last
        flush). With records in flight, the metadata lists offsets done above the watermark."""
        window = self.window
        if window is None:
            caching = self.state_manager is not None and self.state_manager.caching
            return self.positions.moved(flushed_only=caching)
        return self.positions.moved_with_metadata(window.metadata)

    def offsets_to_commit(self) -> dict[TopicPartition, OffsetAndMetadata]:
        """``committable_offsets``, taken by a commit: a processor's request to commit is answered."""
        self.context.commit_requested = False
        return self.committable_offsets()

    async def prepare_commit(self) -> None:
        """Before a commit: flush the caches now if no record is running, else after the current chunk."""
        if self.state_manager is None or not self.state_manager.caching or self.window is not None:
            return
        if self.processing.locked():
            self.flush_requested = True
            return
        async with self.processing:
            await self.flush_state()

    def mark_committed(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        self.positions.mark_committed(offsets)

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
        try:
            self.graph.close()
        except Exception:  # a failing close must not stop the others closing
            self.log.exception("Error closing the processors")
        if self.state_manager is not None:
            self.state_manager.close(clean)


def _no_retry_timer(task_id: TaskId, log: LogContext) -> TaskTimer:
    """Without a configured timer (tests of the task alone) a timeout fails at once."""
    return TaskTimer(task_id, 0, 0, 0, lambda: 0, log)
