"""``StreamTask``: one sub-topology over one partition number: its lifecycle and what it exposes.

A task is complete when constructed: its graph, its context and everything the task manager
decided for it (``TaskSetup``: error handling, state stores, exactly-once, records in flight).
The stream thread buffers fetched records into its input (``PartitionGroup``); the task's
coroutine (``run``) first starts what the task needs, reading its partitions' committed offsets
once (``Committed``: exactly-once rewinds to them, partition and stream time restore from their
metadata, the stores restore against them, records in flight skip what they list as done), then
hands over to its run loop (``streamloop.tasks.loops``), which runs the records by the one per-record
path (``streamloop.tasks.processing``). The committable position of each partition advances only
past records whose whole graph has finished; the commit (``engine/commit/``) takes it from
``offsets_to_commit``.

A task with logged state stores first restores them (RESTORING). With a record cache, its
stores' updates go down when the task flushes them between records; a commit covers only the
positions of records whose updates went down.

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
from collections.abc import Awaitable, Callable, Iterable, Sequence
from enum import Enum
from typing import TYPE_CHECKING

import anyio
from anyio import CancelScope

from streamloop.completed_offsets import decode_metadata
from streamloop.errors import (
    IllegalStateError,
    ProducerFencedError,
    TaskCorruptedError,
    TaskMigratedError,
    TransportError,
)
from streamloop.ids import TaskId
from streamloop.lifecycle import StateMachine
from streamloop.logcontext import LogContext
from streamloop.processors.api import ObservesStreamTime
from streamloop.processors.context import TaskContext
from streamloop.processors.nodes import ProcessorNode
from streamloop.records import ConsumerRecord, TopicPartition
from streamloop.topology.specs import TaskGraph
from streamloop.transport.base import OffsetAndMetadata

from .loops import RunLoop, run_loop
from .partition_group import PartitionGroup
from .pause import PausePoint
from .positions import Positions
from .processing import failure
from .punctuation import Punctuations
from .setup import Committed, TaskSetup
from .timeouts import TaskTimer, is_timeout

if TYPE_CHECKING:
    from streamloop.collector import RecordCollector

log = logging.getLogger(__name__)

# How long a task whose start met a partition no longer assigned waits for the revocation's close.
REVOKED_PATIENCE_S = 30.0

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
        setup: TaskSetup | None = None,
        monotonic_ms: Callable[[], int] | None = None,
    ) -> None:
        setup = setup or TaskSetup()
        self.id = task_id
        self.partitions = frozenset(partitions)
        self.graph = graph
        self.context = context
        self.log = logger.child(f"task [{task_id}] ")
        self.state = StateMachine(f"task {task_id}", TaskState.CREATED, TASK_TRANSITIONS, self.log, logging.DEBUG)
        self._send_buffered = send_buffered
        self.clock_ms = clock_ms
        self.monotonic_ms = monotonic_ms or clock_ms
        # Replaced only when the task is revived (its predecessor's timer carries over).
        self.timer = setup.timer or _no_retry_timer(task_id, self.log)
        self.errors = setup.errors
        self.meter = setup.meter
        self.state_manager = setup.state
        self.tracing = setup.tracing
        self.collector: RecordCollector | None = setup.exactly_once.collector if setup.exactly_once else None
        self._setup = setup
        self.input = PartitionGroup(self.partitions, (topic for topic, source in graph.sources.items()
                                                      if source.timestamp_extractor is not None), setup.idle)
        self.positions = Positions(self.partitions, self.input.partition_time)
        self.punctuations = Punctuations(task_id, context, clock_ms)
        self.timeouts = 0
        self.processed = 0
        self.dropped = 0
        # RETRY answers of the processing handler that ran a record again, and those that could not
        # (its attempts ran out: processing.retry.exhausted.answer applied).
        self.retries = 0
        self.retries_exhausted = 0
        # What a wall-clock window close reads to tell whether the task's input went quiet.
        context.records_processed = lambda: self.processed
        # The (extracted) timestamp of the record last taken to process; -1 when it could not be read.
        self.record_time = -1
        # The group's committed offsets as read when the task started (and by the lag metric), for
        # partitions this task has not committed itself yet (what the console shows for a task just assigned).
        self.group_committed: dict[TopicPartition, int] = {}
        # Set once a close is requested (or the transaction failed): the run loop ends after its record.
        self._stop = anyio.Event()
        # Set when there is something to do; a fresh event replaces a set one (anyio's cannot be cleared).
        self._wakeup = anyio.Event()
        self.finished = anyio.Event()
        # Set by the thread that runs ``run``; cancelling it abandons a record that hangs.
        self.cancel_scope: CancelScope | None = None
        # Where a handler's PAUSE stopped the task (None: not paused).
        self.pause_point: PausePoint | None = None
        # The offset of the first record given per partition: where a task created again on it reads
        # from when this one committed nothing there (``restart_offsets``).
        self._first_given: dict[TopicPartition, int] = {}
        # Held while records run (a chunk, a wall-clock punctuation; under exactly-once, a record in
        # flight passing): a commit flushes the caches and takes positions only between records.
        # Fast: the sequential loop takes it once per chunk and must not yield to do so.
        self.processing = anyio.Lock(fast_acquire=True)
        self.flush_requested = False
        self.transaction_error: TaskCorruptedError | TaskMigratedError | None = None
        self.loop: RunLoop | None = None
        self._committed: dict[TopicPartition, OffsetAndMetadata | None] = {}

    def __repr__(self) -> str:
        return f"StreamTask({self.id}, {sorted(self.partitions)}, {self.state.state.name})"

    # -- input ----------------------------------------------------------------
    def add_records(self, partition: TopicPartition, records: Sequence[ConsumerRecord]) -> int:
        """Buffer fetched records; returns how many this partition now holds.

        A paused task drops them: they were fetched before its partitions were
        paused, and ``resume`` reads them again.
        """
        if records and partition not in self._first_given:
            self._first_given[partition] = records[0].offset
        if self.state.state is TaskState.PAUSED:
            return 0
        held = self.input.add(partition, records)
        self._wakeup.set()
        return held

    def buffered(self, partition: TopicPartition | None = None) -> int:
        return self.input.buffered(partition)

    @property
    def stream_time(self) -> int:
        return self.input.stream_time

    @property
    def partition_times(self) -> dict[tuple[str, int], int]:
        return self.input.partition_times

    @property
    def exactly_once(self) -> bool:
        return self._setup.exactly_once is not None

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
            if await self._start():
                await self._loop().run()
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

    async def drain(self) -> None:
        """Start the task if it is new, then process every buffered record by its run loop, until
        nothing is buffered or in flight. Caller: ``streamloop.testing.TopologyTestDriver``, which
        schedules tasks itself instead of running ``run``: the same start (restores included) and
        the same loop as ``run``; returns early when the task pauses or closes."""
        if self.state.state is TaskState.CREATED and not await self._start():
            return
        if self.is_running:
            await self._loop().drain()

    def _loop(self) -> RunLoop:
        if self.loop is None:
            self.loop = run_loop(self, self._setup.in_flight, self._skips, self._setup.spark_jobs,
                                 self._setup.executor_reads)
        return self.loop

    async def _start(self) -> bool:
        """Start the producer (exactly-once), read the committed positions once, restore time and
        stores; False when the task is closing (then a failure is expected: the thread may be
        closing the consumer a step uses)."""
        setup = self._setup
        try:
            if setup.exactly_once is not None and not self.closing:
                await setup.exactly_once.start()
            committed = await self._read_committed() if not self.closing else {}
            if setup.exactly_once is not None and not self.closing:
                setup.exactly_once.rewind(committed)
            self._restore_time(committed)
            if setup.restore is not None and not self.closing:
                self.state.transition_to(TaskState.RESTORING)
                await setup.restore(committed)
        except Exception as exc:
            if isinstance(exc, IllegalStateError) and not self.closing:
                # A partition of the task left the consumer's assignment while it started: a
                # cooperative rebalance installs the new assignment before the revocation callback
                # asks the task to close, and the start's read of a position can fail in between.
                # The close request follows on this loop; a real illegal state is raised after the wait.
                with anyio.move_on_after(REVOKED_PATIENCE_S):
                    await self._stop.wait()
            if not self.closing:
                raise
            self.log.info("Stopped starting: the task is closing (%r)", exc)
            return False
        if self.closing:
            return False
        self.state.transition_to(TaskState.RUNNING)
        return True

    async def _read_committed(self) -> dict[TopicPartition, OffsetAndMetadata | None]:
        read = self._setup.committed
        if read is None:
            return {}
        committed = {tp: await read(tp) for tp in sorted(self.partitions)}
        for tp, om in committed.items():
            if om is not None:
                self.group_committed[tp] = om.offset
        self._committed = committed
        return committed

    @property
    def _skips(self) -> dict[TopicPartition, frozenset[int]]:
        """Records in flight: the offsets a previous owner finished above its committed watermark
        (under exactly-once, in the transaction that committed their output)."""
        return {tp: decode_metadata(om.offset, om.metadata).completed
                for tp, om in self._committed.items() if om is not None and om.metadata}

    def transaction_failed(self, error: TaskCorruptedError | TaskMigratedError) -> None:
        """Exactly-once: the task's transaction must be aborted; the task manager revives or migrates it."""
        if self.transaction_error is None:
            self.transaction_error = error
            self.request_close()
            if self._setup.exactly_once is not None:
                self._setup.exactly_once.on_failed(self)

    # -- waiting -----------------------------------------------------------------------
    def clear_wakeup(self) -> None:
        """Forget past wake-ups; caller: a run loop, before it looks for work."""
        if self._wakeup.is_set():
            self._wakeup = anyio.Event()

    async def wait_for_wakeup(self, limit_ms: float | None = None) -> None:
        """Until records arrive, the task is asked to stop or a wall-clock punctuation is due (or
        ``limit_ms`` is over: a task waiting for a lagging partition looks again)."""
        wakeup = self._wakeup
        due = self.context.wall_clock_schedules.next_due()
        if due is not None:
            until_due = max(0.0, float(due - self.clock_ms()))
            limit_ms = until_due if limit_ms is None else min(limit_ms, until_due)
        if limit_ms is None:
            await wakeup.wait()
            return
        with anyio.move_on_after(limit_ms / 1000.0):
            await wakeup.wait()

    def wake(self) -> None:
        self._wakeup.set()

    async def back_off(self, exc: BaseException, what: str, started: int) -> None:
        """A record (or a batch) timed out: set this task aside for the back-off; the thread's other
        tasks run meanwhile, and a close ends the wait. The one back-off of every run loop."""
        self.timeouts += 1
        backoff = self.timer.on_timeout(exc, what, started)
        if self.exactly_once:
            # The record may have sent part of its output into the open transaction: retrying it
            # would send that part twice. The transaction is aborted and the task revived instead.
            raise TaskCorruptedError(self.id, f"{what} timed out") from exc
        await self.set_aside(backoff)

    async def set_aside(self, seconds: float) -> None:
        """Wait ``seconds`` (a back-off), or until a close is requested."""
        with anyio.move_on_after(seconds):
            await self._stop.wait()

    # -- output, state stores, punctuation ------------------------------------------------
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
            raise failure(self.id, forwarder, "cache flush", exc) from exc
        self.positions.flushed()

    async def punctuate_wall_clock(self, locked: bool = False) -> None:
        """Run the wall-clock punctuations due, between records (holding ``processing`` unless the
        caller does), as every run loop does."""
        if self.context.wall_clock_schedules.next_due() is None:
            return
        if locked:
            await self.punctuations.maybe_wall_clock()
            return
        async with self.processing:
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
        point = self.pause_point
        if point is not None:
            position = point.again(tp, raw.offset, next_offsets.get(tp))
            if position is not None:
                next_offsets[tp] = self._below_in_flight(tp, position)
            return
        self.state.transition_to(TaskState.PAUSED)
        self.pause_point = point = PausePoint(tp, raw.offset, self.input.queues())
        next_offsets[tp] = self._below_in_flight(tp, point.read_again_from(tp, raw.offset))
        for other, first in point.dropped.items():
            if other not in next_offsets:
                # Nothing processed here yet: the dropped records start where fetching began.
                next_offsets[other] = first
        self.input.clear()
        self.timer.clear()  # a paused task keeps no timer
        self.context.commit_requested = True
        self.log.error("Paused at %s offset %d; resume with KafkaStreams.resume(%s)", tp, raw.offset,
                       f"'{self.id}'")
        if self._setup.on_pause is not None:
            self._setup.on_pause(self)

    @property
    def paused_at(self) -> tuple[TopicPartition, int] | None:
        """The record a handler PAUSEd the task at (None: not paused)."""
        point = self.pause_point
        return None if point is None else point.at

    def paused_below(self, raw: ConsumerRecord) -> bool:
        """Whether the task is PAUSED at a lower offset of ``raw``'s partition."""
        point = self.pause_point
        return point is not None and point.below(raw)

    def paused_offset(self, tp: TopicPartition) -> int | None:
        """What the position of ``tp`` must not pass while paused (``PausePoint.cap``); None: not paused."""
        point = self.pause_point
        return None if point is None else point.cap(tp)

    def _below_in_flight(self, tp: TopicPartition, offset: int) -> int:
        """``offset``, or lower while records below it are still in flight (a batch that has not
        finished): committing past them would lose them in a crash."""
        lowest = self.loop.lowest_in_flight(tp) if self.loop is not None else None
        return offset if lowest is None else min(offset, lowest)

    def resume_offsets(self, skip: bool) -> dict[TopicPartition, int]:
        """Where the resume reads each partition again (``PausePoint.resume_offsets``)."""
        point = self.pause_point
        return {} if point is None else point.resume_offsets(skip)

    def resume(self, skip: bool) -> None:
        """Caller: ``TaskManager.resume`` after it seeked the partitions to ``resume_offsets``."""
        point = self.pause_point
        if point is not None:
            paused, offset = point.at
            for tp, start in point.resume_offsets(skip).items():
                if self.loop is not None:
                    self.loop.resumed(tp, start, offset if skip and tp == paused else None)
                self.positions.rewind(tp, start, self._below_in_flight(tp, start))
            if skip:
                self.context.commit_requested = True
        self.pause_point = None
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
    def _restore_time(self, committed: Committed) -> None:
        """Partition and stream time from the last commit (``PartitionGroup.restore``): records late
        before stay late, stream-time punctuations do not fire again for times already passed."""
        restored = self.input.restore(committed)
        if not restored:
            return
        stream_time = self.input.stream_time
        # Processors that keep the stream time they observed start from the restored one.
        for node in self.graph.nodes:
            if isinstance(node, ProcessorNode) and isinstance(node.processor, ObservesStreamTime):
                node.processor.observe_stream_time(stream_time)
        self.log.debug("Restored partition times %s from the commit: stream time %d", restored, stream_time)

    # -- positions and commit ------------------------------------------------------------
    def position(self, partition: TopicPartition) -> int | None:
        """The next offset to process on ``partition``, once one was processed (or failed)."""
        return self.positions.next.get(partition)

    def committed_offsets(self) -> dict[TopicPartition, int]:
        """The last committed position per partition; a copy, safe to take from another thread."""
        return {**dict(self.group_committed), **self.positions.committed_offsets()}

    def committable_offsets(self) -> dict[TopicPartition, OffsetAndMetadata]:
        """Positions of finished records that moved since the last commit: the next offset to read
        per partition. With a record cache, only positions whose state updates went down (the last
        flush). With records in flight, the metadata lists offsets done above the watermark."""
        metadata = getattr(self.loop, "metadata", None)
        if metadata is None:
            caching = self.state_manager is not None and self.state_manager.caching
            # One record at a time after an owner with records in flight: what that owner finished
            # above its commit and this loop has not reached yet stays listed.
            return self.positions.moved(flushed_only=caching, listed=getattr(self.loop, "listed", None))
        return self.positions.moved_with_metadata(metadata)

    def offsets_to_commit(self) -> dict[TopicPartition, OffsetAndMetadata]:
        """``committable_offsets``, taken by a commit: a processor's request to commit is answered."""
        self.context.commit_requested = False
        return self.committable_offsets()

    async def prepare_commit(self) -> None:
        """Before a commit: flush the caches now if no record is running, else after the current chunk."""
        if self.state_manager is None or not self.state_manager.caching or self._setup.in_flight is not None:
            return
        if self.processing.locked():
            self.flush_requested = True
            return
        async with self.processing:
            await self.flush_state()

    def mark_committed(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        """``offsets`` are committed (none moved: ``{}``): the positions move, and the persistent
        stores write to disk the updates the commit covers (``streamloop.state.uncommitted``)."""
        self.positions.mark_committed(offsets)
        if self.state_manager is not None:
            self.state_manager.commit(offsets)

    def restart_offsets(self) -> dict[TopicPartition, int]:
        """Where a task created again on these partitions reads them from, once this one is closed:
        its last commit (after a clean close, everything it processed), else the first record it was
        given (it committed nothing there). Not its consumer's position: the records it fetched but
        did not process lie below that. A partition it got no record of is left where it is."""
        starts = {**self._first_given, **self.committed_offsets()}  # a commit wins
        return {tp: starts[tp] for tp in self.partitions if tp in starts}

    def commit_needed(self) -> bool:
        return self.context.commit_requested

    # -- closing --------------------------------------------------------------
    def close(self, clean: bool = False) -> None:
        """Close the processors and stores; idempotent. ``clean``: everything processed is committed."""
        if self.state.state is TaskState.CLOSED:
            return
        self.state.transition_to(TaskState.CLOSED)
        self.context.forwarder.reset()
        self.input.clear()
        try:
            self.graph.close()
        except Exception:  # a failing close must not stop the others closing
            self.log.exception("Error closing the processors")
        if self.state_manager is not None:
            self.state_manager.close(clean)


def _no_retry_timer(task_id: TaskId, log: LogContext) -> TaskTimer:
    """Without a configured timer (tests of the task alone) a timeout fails at once."""
    return TaskTimer(task_id, 0, 0, 0, lambda: 0, log)
