"""``StreamThread``: an OS thread running its own asyncio loop, one consumer, one producer.

The loop polls, hands records to the tasks' coroutines, and commits on the
interval; each task runs as its own coroutine in the thread's task group, so an
async processor waiting on I/O in one task does not hold up the others. The
rebalance listener (on the same loop) revokes and assigns tasks.

States, as in Kafka Streams::

    CREATED ──> STARTING ──> PARTITIONS_REVOKED <──> PARTITIONS_ASSIGNED ──> RUNNING
       │            │               │                       │     ^            │
       │            │               │                       │     └────────────┤ (rebalance)
       └────────────┴───────────────┴───────────> PENDING_SHUTDOWN <───────────┘
                                                        │
                                                        v
                                                      DEAD
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

import anyio
import anyio.abc
from anyio import CancelScope, create_task_group

from engine import config as cfg
from engine.clock import SYSTEM_CLOCK, Clock
from engine.collector import RecordCollector
from engine.commit import Committer
from engine.config import StreamsConfig, load_handler
from engine.errors import MissingSinkTopicError, MissingSourceTopicError
from engine.lifecycle import StateMachine
from engine.logcontext import LogContext, thread_log
from engine.metrics import SensorSettings, ThreadSensors
from engine.records import TopicPartition
from engine.serdes import BytesSerde, Serde, as_serde
from engine.state.cache import ThreadCache
from engine.state.restore import StateRestoreListener
from engine.state.store import StateStore
from engine.state.task_state import StateSettings
from engine.tasks.assignor import AssignorError, StreamsAssignor
from engine.tasks.manager import ExactlyOnce, TaskManager
from engine.tasks.task import StreamTask, TaskState
from engine.tasks.task_id import TaskId
from engine.tasks.error_handling import ErrorHandling
from engine.tasks.timeouts import StartupDeadline, TaskTimer
from engine.threads.commands import CommandChannel, CommandRejected
from engine.topology.topology import Topology
from engine.commit import EOS_TRANSACTION_TIMEOUT_MS, TransactionalCommitter, transactional_id
from engine.transport.base import ConsumerSettings, Producer, ProducerSettings, Transport

if TYPE_CHECKING:
    from engine.spark.session import SparkSessions


class StreamThreadState(Enum):
    CREATED = "CREATED"
    STARTING = "STARTING"
    PARTITIONS_REVOKED = "PARTITIONS_REVOKED"
    PARTITIONS_ASSIGNED = "PARTITIONS_ASSIGNED"
    RUNNING = "RUNNING"
    PENDING_SHUTDOWN = "PENDING_SHUTDOWN"
    DEAD = "DEAD"

    def is_alive(self) -> bool:
        return self not in (StreamThreadState.PENDING_SHUTDOWN, StreamThreadState.DEAD)


_T = StreamThreadState
# How often a thread reads its partitions' log end for the records-lag metric.
LAG_REFRESH_MS = 1_000
THREAD_TRANSITIONS: dict[StreamThreadState, frozenset[StreamThreadState]] = {
    _T.CREATED: frozenset({_T.STARTING, _T.PENDING_SHUTDOWN}),
    _T.STARTING: frozenset({_T.PARTITIONS_REVOKED, _T.PARTITIONS_ASSIGNED, _T.PENDING_SHUTDOWN}),
    _T.PARTITIONS_REVOKED: frozenset({_T.PARTITIONS_REVOKED, _T.PARTITIONS_ASSIGNED, _T.PENDING_SHUTDOWN}),
    _T.PARTITIONS_ASSIGNED: frozenset({_T.PARTITIONS_REVOKED, _T.PARTITIONS_ASSIGNED, _T.RUNNING, _T.PENDING_SHUTDOWN}),
    _T.RUNNING: frozenset({_T.PARTITIONS_REVOKED, _T.PARTITIONS_ASSIGNED, _T.PENDING_SHUTDOWN}),
    _T.PENDING_SHUTDOWN: frozenset({_T.DEAD}),
    _T.DEAD: frozenset(),
}


@dataclass(frozen=True)
class TaskMetadata:
    """A task as seen from outside its thread."""

    task_id: TaskId
    topic_partitions: frozenset[TopicPartition]
    is_running: bool = True
    """False while the task is PAUSED by an error handler."""


class TaskRunState(Enum):
    """What a task is doing, as the console shows it."""

    RUNNING = "running"
    PAUSED = "paused"
    RETRYING = "retrying"
    """Set aside by a timeout (KIP-572), retrying until its deadline."""
    RESTORING = "restoring"
    """Rebuilding its state stores from their changelogs before it processes."""


@dataclass(frozen=True)
class TaskDetails:
    """A task as the console shows it: a snapshot taken from another thread."""

    task_id: TaskId
    thread_name: str
    topic_partitions: frozenset[TopicPartition]
    state: TaskRunState
    committed: dict[TopicPartition, int]
    """The last committed position per partition (partitions not committed yet are absent)."""
    lag: int | None
    """Log end minus next offset to process, summed over the partitions; None until measured."""
    timeout_deadline_in_ms: int | None
    """While retrying: milliseconds left until task.timeout.ms runs out (negative once past)."""
    paused_at: tuple[TopicPartition, int] | None
    """While paused: the partition and offset of the record the handler paused on."""
    records_processed: int
    records_dropped: int
    timeout_retries: int


@dataclass(frozen=True)
class ThreadMetadata:
    thread_name: str
    thread_state: StreamThreadState
    active_tasks: frozenset[TaskMetadata]
    consumer_client_id: str
    producer_client_id: str
    cache_size_bytes: int


StateListener = Callable[["StreamThread", StreamThreadState, StreamThreadState], None]
FailureHandler = Callable[["StreamThread", BaseException], None]


class StreamThread:
    """Caller: ``KafkaStreams`` creates, starts and shuts it down; everything else runs on its loop."""

    def __init__(
        self,
        *,
        index: int,
        client_id: str,
        process_id: str,
        config: StreamsConfig,
        topology: Topology,
        transport: Transport,
        cache_size: int,
        on_state_change: StateListener,
        on_failure: FailureHandler,
        on_shutdown_requested: Callable[[StreamThread], None] = lambda _thread: None,
        clock: Clock = SYSTEM_CLOCK,
        restore_listener: StateRestoreListener | None = None,
        spark: SparkSessions | None = None,
        on_first_join: Callable[[StreamThread], None] | None = None,
    ) -> None:
        self.index = index
        # Called right before this thread's first JoinGroup (a thread added at runtime): the
        # client asks its other threads to rejoin now, not at their next heartbeat.
        self._on_first_join = on_first_join
        self._spark = spark
        self.name = f"{client_id}-StreamThread-{index}"
        self._config = config
        self._topology = topology
        self._transport = transport
        self._clock = clock
        self._process_id = process_id
        self.log = thread_log(__name__, self.name)
        self.state = StateMachine(f"stream-thread [{self.name}]", StreamThreadState.CREATED,
                                  THREAD_TRANSITIONS, self.log, logging.DEBUG)
        self.state.add_listener(lambda old, new: on_state_change(self, old, new))
        self._on_failure = on_failure
        self._on_shutdown_requested = on_shutdown_requested
        self._consumer: object | None = None
        self.commands = CommandChannel(f"stream thread {self.name}")
        self._os_thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self._shutdown_requested = threading.Event()
        self._leave_group = True
        self._poll_scope: CancelScope | None = None
        self.cache_size = cache_size
        # The record cache of this thread's tasks' stores: its share of cache.max.bytes.buffering.
        self.cache = ThreadCache(cache_size)
        self._restore_listener = restore_listener
        self.error: BaseException | None = None
        self.assignor = StreamsAssignor(topology, process_id, self.name)
        self.consumer_client_id = f"{self.name}-consumer"
        self.producer_client_id = f"{self.name}-producer"
        self._active: frozenset[TaskMetadata] = frozenset()
        self.records_polled = 0
        self.polls = 0
        self._manager: TaskManager | None = None
        # The tasks as of the last change, for readers on other threads (metrics).
        self._tasks_view: tuple[StreamTask, ...] = ()
        self.errors: ErrorHandling | None = None
        self._task_failure: BaseException | None = None
        self._body_error: BaseException | None = None
        self._failure_reported = False
        self._carry_shutdown = False
        self._failed_member = False
        # Log end offsets of the tasks' partitions, read at most once a second (see task_lags).
        self._log_ends: dict[TopicPartition, int] = {}
        self._next_lag_ms = 0
        self.sensors = ThreadSensors(
            SensorSettings(config[cfg.METRICS_SAMPLE_WINDOW_MS], config[cfg.METRICS_NUM_SAMPLES]),
            clock.monotonic_ms)

    # -- control, from any thread -------------------------------------------------
    def start(self) -> None:
        self.state.transition_to(StreamThreadState.STARTING)
        self._os_thread.start()

    def shutdown(self, leave_group: bool = True) -> None:
        """Ask the thread to finish its records, commit, close its tasks and leave the group."""
        self._leave_group = leave_group
        self.state.maybe_transition_to(StreamThreadState.PENDING_SHUTDOWN)
        self._shutdown_requested.set()
        try:
            self.commands.submit(self._wake)
        except CommandRejected:
            pass  # not looping yet, or already past the loop: it sees the flag

    async def _wake(self) -> None:
        if self._poll_scope is not None:
            self._poll_scope.cancel()

    def request_application_shutdown(self) -> None:
        """Carry a SHUTDOWN_APPLICATION request to the group leader (KIP-671).

        The flag goes into this member's subscription; the rejoin makes the
        leader see it and answer every member of every instance with the error.
        """
        self.assignor.shutdown_requested = AssignorError.SHUTDOWN_REQUESTED
        try:
            self.commands.submit(self._rejoin)
        except CommandRejected:
            pass  # its first join carries the flag

    def can_carry_shutdown_request(self) -> bool:
        """Whether this (failing) thread's consumer is in the group and its loop still runs."""
        return self._consumer is not None and self.commands.on_loop_thread

    def carry_shutdown_request_on_exit(self) -> None:
        self.assignor.shutdown_requested = AssignorError.SHUTDOWN_REQUESTED
        self._carry_shutdown = True

    async def _carry_shutdown_request(self, consumer: object) -> None:
        """Rejoin with the SHUTDOWN_APPLICATION request and wait for the leader's answer.

        Caller: this thread's clean-up after a failure. Its tasks are closed dirty if
        revoked meanwhile; the answer makes every instance shut down.
        """
        self._failed_member = True
        consumer.request_rejoin()  # type: ignore[attr-defined]
        deadline = self._clock.monotonic_ms() + self._config[cfg.ERROR_SHUTDOWN_TIMEOUT_MS]
        while (self.assignor.error_code is not AssignorError.SHUTDOWN_REQUESTED
               and self._clock.monotonic_ms() < deadline):
            try:
                await consumer.poll(100, 1)  # type: ignore[attr-defined]
            except Exception as exc:  # noqa: BLE001 - the request is best effort on a dying thread
                self.log.warning("Could not carry the shutdown request: %r", exc)
                return

    async def _rejoin(self) -> None:
        if self._consumer is not None:
            self._consumer.request_rejoin()  # type: ignore[attr-defined]

    def rejoin(self) -> None:
        """Make this thread rejoin its group soon (from any thread; never waits)."""
        try:
            self.commands.submit(self._rejoin)
        except CommandRejected:
            pass  # not polling yet (it joins anyway) or stopped

    def join(self, timeout: float | None = None) -> bool:
        if self._os_thread.ident is None:
            return True
        if threading.current_thread() is self._os_thread:
            return False
        self._os_thread.join(timeout)
        return not self._os_thread.is_alive()

    @property
    def is_alive(self) -> bool:
        return self.state.state.is_alive()

    @property
    def is_current(self) -> bool:
        return threading.current_thread() is self._os_thread

    def resize_cache(self, size: int) -> None:
        """This thread's share of ``cache.max.bytes.buffering``; an atomic attribute swap, safe from
        any thread. (The record cache that will use it comes with state stores; today the share is
        reported in the thread's metadata and metrics.)"""
        self.cache_size = size
        self.cache.resize(size)

    def local_stores(self, name: str) -> list[StateStore]:
        """This thread's running tasks' instances of store ``name`` (for interactive queries)."""
        stores = []
        for task in self._tasks_view:
            manager = task.state_manager
            if manager is not None and name in manager.stores and task.state.state is TaskState.RUNNING:
                stores.append(manager.stores[name])
        return stores

    def counters(self) -> dict[str, float]:
        """Running totals for metrics; safe to read from any thread (plain int reads)."""
        manager = self._manager
        tasks = self._tasks_view
        closed_processed = manager.closed_processed if manager is not None else 0
        closed_timeouts = manager.closed_timeouts if manager is not None else 0
        return {
            "records-polled-total": float(self.records_polled),
            "poll-total": float(self.polls),
            "process-total": float(closed_processed + sum(t.processed for t in tasks)),
            "commit-total": float(manager.commits if manager is not None else 0),
            "timeout-retries-total": float(closed_timeouts + sum(t.timeouts for t in tasks)),
            # Tasks paused now (a PAUSE answer not yet resumed), not pause events (pause-total).
            "paused-tasks-total": float(sum(t.is_paused for t in tasks)),
            "record-cache-bytes": float(self.cache.size_bytes),
            "record-cache-evictions-total": float(self.cache.evictions),
        }

    def task_counters(self) -> list[tuple[TaskId, dict[str, float]]]:
        return [(t.id, {"records-processed-total": float(t.processed),
                        "dropped-records-total": float(t.dropped),
                        "timeout-retries-total": float(t.timeouts),
                        "paused": float(t.is_paused),
                        "restore-records-total": float(t.state_manager.restored if t.state_manager else 0)})
                for t in self._tasks_view]

    def task_details(self) -> list[TaskDetails]:
        """Each active task's state, offsets, lag and timeout deadline; safe from any thread
        (attribute reads and dict copies of the task's own fields, no lock, no loop call)."""
        now = self._clock.monotonic_ms()
        lag = self.task_lags()
        result = []
        for task in self._tasks_view:
            deadline = task.timer.deadline_ms
            if task.is_paused:
                state = TaskRunState.PAUSED
            elif task.state.state in (TaskState.CREATED, TaskState.RESTORING) and task.state_manager is not None:
                state = TaskRunState.RESTORING
            elif deadline is not None:
                state = TaskRunState.RETRYING
            else:
                state = TaskRunState.RUNNING
            result.append(TaskDetails(
                task.id, self.name, task.partitions, state, task.committed_offsets(), lag.get(task.id),
                None if deadline is None else deadline - now, task.paused_at, task.processed, task.dropped,
                task.timeouts))
        return sorted(result, key=lambda d: d.task_id)

    def metadata(self) -> ThreadMetadata:
        return ThreadMetadata(self.name, self.state.state, self._active, self.consumer_client_id,
                              self.producer_client_id, self.cache_size)

    # -- the OS thread ------------------------------------------------------------
    def _main(self) -> None:
        try:
            anyio.run(self._run, backend="asyncio")
        except BaseException as exc:  # noqa: BLE001 - every death is reported to the client
            self.error = _unwrap(exc)
        if self.error is not None and not self._failure_reported:
            # Failed before its loop could report it (e.g. the loop itself broke).
            self._report_failure(self.error)
        self.state.maybe_transition_to(StreamThreadState.PENDING_SHUTDOWN)
        self.state.transition_to(StreamThreadState.DEAD)
        self.log.info("Shutdown complete")

    def _report_failure(self, error: BaseException) -> None:
        """Log the death and let the client's uncaught-exception handler decide (once)."""
        self._failure_reported = True
        # The one log of a failed record's traceback: handlers answering FAIL and the supervisor do not repeat it.
        self.log.error("Encountered the following exception during processing and the thread is "
                       "going to shut down: %s", error, exc_info=error)
        self.state.maybe_transition_to(StreamThreadState.PENDING_SHUTDOWN)
        try:
            self._on_failure(self, error)
        except BaseException:  # noqa: BLE001
            self.log.exception("The failure handler raised")

    async def _run(self) -> None:
        config = self._config
        exactly_once = config[cfg.PROCESSING_GUARANTEE] == cfg.EXACTLY_ONCE_V2
        consumer = self._transport.consumer(ConsumerSettings(
            group_id=config[cfg.APPLICATION_ID],
            client_id=self.consumer_client_id,
            assignor=self.assignor,
            group_instance_id=(f"{config[cfg.GROUP_INSTANCE_ID]}-{self.index}"
                               if config[cfg.GROUP_INSTANCE_ID] else None),
            auto_offset_reset=config[cfg.AUTO_OFFSET_RESET],
            max_poll_interval_ms=config[cfg.MAX_POLL_INTERVAL_MS],
            session_timeout_ms=config[cfg.SESSION_TIMEOUT_MS],
            heartbeat_interval_ms=config[cfg.HEARTBEAT_INTERVAL_MS],
            request_timeout_ms=config[cfg.REQUEST_TIMEOUT_MS],
            retry_backoff_ms=config[cfg.RETRY_BACKOFF_MS],
            isolation_level="read_committed" if exactly_once else "read_uncommitted",
            extra=config.with_prefix("consumer."),
        ))
        self._producer_settings = ProducerSettings(
            client_id=self.producer_client_id,
            acks=config[cfg.ACKS],
            linger_ms=config[cfg.LINGER_MS],
            batch_size=config[cfg.BATCH_SIZE],
            request_timeout_ms=config[cfg.REQUEST_TIMEOUT_MS],
            retry_backoff_ms=config[cfg.RETRY_BACKOFF_MS],
            extra=config.with_prefix("producer."),
        )
        producer = self._producer = self._transport.producer(self._producer_settings)
        admin = self._transport.admin(f"{self.name}-admin")
        started: list[object] = []
        clean = False
        async with create_task_group() as group:
            self.commands.open(group)
            try:
                # Start-up rides out an unreachable broker too, under one task.timeout.ms deadline.
                startup = StartupDeadline(self.name, config[cfg.TASK_TIMEOUT_MS], config[cfg.RETRY_BACKOFF_MS],
                                          config[cfg.RETRY_BACKOFF_MAX_MS], self.log)
                await startup.run(admin.start, "Starting the admin client")
                started.append(admin)
                sink_partitions = await self._check_topics(admin, startup)
                await startup.run(producer.start, "Starting the producer")
                started.append(producer)
                collector = self._collector = RecordCollector(
                    producer, sink_partitions, lambda t: self._lookup(admin, t))
                committer_type = TransactionalCommitter if exactly_once else Committer
                committer = committer_type(consumer, collector, config[cfg.COMMIT_INTERVAL_MS],
                                           self._clock.monotonic_ms, self.log)
                if isinstance(committer, TransactionalCommitter):
                    committer.group_id = config[cfg.APPLICATION_ID]
                self._manager = manager = TaskManager(
                    config[cfg.APPLICATION_ID], self._topology, consumer, collector, committer,
                    lambda task: self._spawn(group, task),
                    self.log, self._clock.wall_ms,
                    _serde(config[cfg.DEFAULT_KEY_SERDE], "default.key.serde"),
                    _serde(config[cfg.DEFAULT_VALUE_SERDE], "default.value.serde"),
                    config[cfg.BUFFERED_RECORDS_PER_PARTITION],
                    timer_factory=self._timer,
                    monotonic_ms=self._clock.monotonic_ms,
                    errors=self.errors if self.errors is not None else self._error_handling(collector),
                    on_tasks_changed=self._refresh_metadata,
                    threads_per_task=config[cfg.NUM_THREADS_PER_TASK],
                    ordering=config[cfg.PROCESSING_ORDERING],
                    state=StateSettings(
                        config[cfg.STATE_DIR], config[cfg.DEFAULT_DSL_STORE] == "rocksDB", self.cache,
                        lambda: self._transport.reader(f"{self.name}-restore-consumer", read_committed=exactly_once),
                        self._restore_listener),
                    config=config,
                    spark=self._spark,
                    exactly_once=ExactlyOnce(self._task_producer) if exactly_once else None,
                )
                if exactly_once and self.errors is not None:
                    self.errors.collector_of = manager.collector_of
                consumer.subscribe(self._topology.source_topics, self)
                self._consumer = consumer
                await startup.run(consumer.start, "Starting the consumer")
                started.append(consumer)
                await self._poll_loop(consumer, manager)
                clean = True
            except BaseException as exc:
                self._body_error = exc
                raise
            finally:
                with CancelScope(shield=True):
                    failure = self._task_failure or _real_error(self._body_error)
                    if failure is not None:
                        # As in Kafka Streams the handler runs on the failing thread before the
                        # shutdown completes: this member still owns its tasks, so no one else
                        # takes the failed record over meanwhile. It blocks this loop, which only
                        # has a dying thread's clean-up left to do.
                        self._report_failure(failure)
                        if self._carry_shutdown and consumer in started:
                            await self._carry_shutdown_request(consumer)
                    if producer in started and self._producer is not producer:
                        started[started.index(producer)] = self._producer
                        producer = self._producer
                    await self._close(consumer, producer, admin, started, clean)
                    self.commands.close()
                group.cancel_scope.cancel()

    def _error_handling(self, collector: RecordCollector) -> ErrorHandling:
        config = self._config
        self.errors = ErrorHandling(
            load_handler(config, cfg.DEFAULT_DESERIALIZATION_EXCEPTION_HANDLER),
            load_handler(config, cfg.PROCESSING_EXCEPTION_HANDLER),
            config[cfg.ERRORS_DEAD_LETTER_QUEUE_TOPIC_NAME],
            collector,
        )
        return self.errors

    def resume_task(self, task_id: TaskId, skip: bool) -> bool:
        """Resume a PAUSED task of this thread (loop-safe). From this thread's own loop the
        resume is scheduled and the answer is whether the task was paused."""
        if not any(t.task_id == task_id and not t.is_running for t in self._active):
            return False
        if self.commands.on_loop_thread:
            self.commands.submit(self._resume, task_id, skip)
            return True
        try:
            return self.commands.call(self._resume, task_id, skip)
        except CommandRejected:
            return False

    async def _resume(self, task_id: TaskId, skip: bool) -> bool:
        return self._manager is not None and await self._manager.resume(task_id, skip)

    def _timer(self, task_id: TaskId, log: LogContext) -> TaskTimer:
        config = self._config
        return TaskTimer(task_id, config[cfg.TASK_TIMEOUT_MS], config[cfg.RETRY_BACKOFF_MS],
                         config[cfg.RETRY_BACKOFF_MAX_MS], self._clock.monotonic_ms, log)

    async def _check_topics(self, admin: object, startup: StartupDeadline) -> dict[str, int]:
        counts = await startup.run(
            lambda: admin.partition_counts(  # type: ignore[attr-defined]
                self._topology.source_topics + self._topology.sink_topics),
            "Fetching topic metadata")
        missing = [t for t in self._topology.source_topics if t not in counts]
        if missing:
            raise MissingSourceTopicError(missing)
        missing = [t for t in self._topology.sink_topics if t not in counts]
        if missing:
            raise MissingSinkTopicError(missing)
        return {t: counts[t] for t in self._topology.sink_topics}

    @staticmethod
    async def _lookup(admin: object, topic: str) -> int | None:
        counts = await admin.partition_counts([topic])  # type: ignore[attr-defined]
        return counts.get(topic)

    async def _poll_loop(self, consumer: object, manager: TaskManager) -> None:
        poll_ms = self._config[cfg.POLL_MS]
        max_records = self._config[cfg.MAX_POLL_RECORDS]
        while not self._shutdown_requested.is_set():
            with CancelScope() as scope:
                self._poll_scope = scope
                if self._shutdown_requested.is_set():
                    break
                records = await consumer.poll(poll_ms, max_records)  # type: ignore[attr-defined]
                if records:
                    self.records_polled += manager.add_records(records)
                self.polls += 1
            self._poll_scope = None
            await manager.maybe_commit()
            self.sensors.sample(manager.meter, self.polls, manager.commits)
            if manager.failed_transactions:
                await manager.handle_failed_transactions(self._config.seconds(cfg.REQUEST_TIMEOUT_MS))
            if manager.producer_failed is not None:
                await manager.revive_all(self._replace_producer, self._config.seconds(cfg.REQUEST_TIMEOUT_MS))
            if self.assignor.error_code is AssignorError.SHUTDOWN_REQUESTED:
                break
            await self._maybe_measure_lag(consumer, manager)

    async def _maybe_measure_lag(self, consumer: object, manager: TaskManager) -> None:
        """Read the log end of the tasks' partitions, at most once a second.

        The lag itself is computed when read (``task_lags``) from these ends and the tasks' live
        positions, so it follows processing at once and does not wait for a commit interval.
        A paused task's lag keeps growing, which is how operators see it.
        """
        now = self._clock.monotonic_ms()
        if now < self._next_lag_ms or not manager.tasks:
            return
        self._next_lag_ms = now + LAG_REFRESH_MS
        tasks = list(manager.tasks.values())
        partitions = [tp for task in tasks for tp in task.partitions]
        try:
            ends = await consumer.end_offsets(partitions)  # type: ignore[attr-defined]
            for task in tasks:
                for tp in task.partitions:
                    if task.position(tp) is None and tp not in task.group_committed:
                        committed = await consumer.committed(tp)  # type: ignore[attr-defined]
                        if committed is not None:
                            task.group_committed[tp] = committed.offset
        except Exception as exc:  # noqa: BLE001 - a metric must never fail the thread
            self.log.debug("Could not read end offsets for the lag metric: %r", exc)
            return
        self._log_ends = ends

    def task_lags(self) -> dict[TaskId, int]:
        """Each task's lag: last known log end minus the next offset to process, summed over its
        partitions (a task not measured yet has none). Safe from any thread (plain reads)."""
        ends = self._log_ends
        lags: dict[TaskId, int] = {}
        for task in self._tasks_view:
            if not all(tp in ends for tp in task.partitions):
                continue
            total = 0
            for tp in task.partitions:
                position = task.position(tp)
                if position is None:
                    position = task.group_committed.get(tp, 0)
                total += max(0, ends[tp] - position)
            lags[task.id] = total
        return lags

    def _task_producer(self, task_id: TaskId) -> Producer:
        """Exactly-once: a task's own transactional producer (not started)."""
        return self._transport.producer(dataclasses.replace(
            self._producer_settings,
            client_id=f"{self.name}-{task_id}-producer",
            transactional_id=transactional_id(self._config[cfg.APPLICATION_ID], task_id),
            transaction_timeout_ms=EOS_TRANSACTION_TIMEOUT_MS,
        ))

    async def _replace_producer(self) -> None:
        """Swap in a fresh producer; the failed one's unsent records are given up (they are re-made)."""
        collector = self._collector
        old = collector.producer
        new = self._transport.producer(self._producer_settings)
        try:
            await new.start()
        except BaseException:
            await new.close()
            raise
        collector.producer = new
        self._producer = new
        # Shielded: from here on only this call knows the old producer, so a cancellation (the
        # thread failing meanwhile) must not skip its close and leave its connections open.
        # (asyncio.wait_for cancelled at once never starts the close at all.)
        try:
            with anyio.move_on_after(self._config.seconds(cfg.REQUEST_TIMEOUT_MS), shield=True) as scope:
                await old.close()
            if scope.cancelled_caught:
                self.log.warning("Closing the failed producer did not finish within request.timeout.ms")
        except Exception:  # noqa: BLE001 - the old producer failed already; its close may too
            self.log.warning("Closing the failed producer did not finish cleanly", exc_info=True)

    def _spawn(self, group: anyio.abc.TaskGroup, task: StreamTask) -> None:
        group.start_soon(self._run_task, task, name=f"{self.name} task {task.id}")

    async def _run_task(self, task: StreamTask) -> None:
        with CancelScope() as scope:
            task.cancel_scope = scope
            try:
                await task.run()
            except Exception as exc:
                if self._task_failure is None:
                    # Records in flight fail inside the task's task group: the handler gets the
                    # first real error, not the group (a failed batch fails all of its records).
                    self._task_failure = _unwrap(exc)
                raise

    async def _close(self, consumer: object, producer: object, admin: object,
                     started: list[object], clean: bool) -> None:
        self.state.maybe_transition_to(StreamThreadState.PENDING_SHUTDOWN)
        manager = self._manager
        timeout = self._config.seconds(cfg.REQUEST_TIMEOUT_MS)
        if manager is not None:
            try:
                await manager.shutdown(clean=clean, timeout=timeout)
            except Exception:  # noqa: BLE001 - closing must go on
                self.log.exception("Failed to close the tasks cleanly")
        self._active = frozenset()
        interrupted: BaseException | None = None
        for client in (consumer, producer, admin):
            if client not in started:
                continue
            try:
                if client is consumer:
                    await consumer.close(leave_group=self._leave_group)  # type: ignore[attr-defined]
                else:
                    await client.close()  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001
                self.log.exception("Failed to close %s", type(client).__name__)
            except BaseException as exc:  # noqa: BLE001 - close the other clients first, then re-raise
                # aiokafka's consumer stop can end in a CancelledError of its own tasks after an outage.
                self.log.warning("Closing %s was interrupted: %r", type(client).__name__, exc)
                interrupted = interrupted or exc
        if interrupted is not None:
            raise interrupted

    # -- rebalance listener (on this thread's loop) ------------------------------------
    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        first_join = self.state.state is StreamThreadState.STARTING
        self.state.maybe_transition_to(StreamThreadState.PARTITIONS_REVOKED)
        if first_join and self._on_first_join is not None:
            self._on_first_join(self)
        if self._manager is not None and revoked:
            self.log.debug("Partitions revoked: %s", sorted(str(tp) for tp in revoked))
            if self._failed_member:
                # A failed thread still in the group (carrying a shutdown request): no commit.
                await self._manager.shutdown(clean=False, timeout=0)
            else:
                await self._manager.handle_revocation(revoked, self._config.seconds(cfg.REQUEST_TIMEOUT_MS))
            self._refresh_metadata()

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.state.maybe_transition_to(StreamThreadState.PARTITIONS_ASSIGNED)
        if self.assignor.error_code is AssignorError.SHUTDOWN_REQUESTED:
            self.log.error("The application is shutting down on request of one of its instances")
            self._shutdown_requested.set()
            self._on_shutdown_requested(self)
            return
        if not self.state.state.is_alive() or self._shutdown_requested.is_set():
            # As Kafka Streams: a thread on its way out (its consumer may be closing, which can still
            # complete a rebalance) creates no tasks; they would restore through a closed consumer.
            self.log.debug("Skipping task creation: the thread is shutting down")
            return
        if self._manager is not None:
            self.log.debug("Partitions assigned: %s", sorted(str(tp) for tp in assigned))
            self._manager.handle_assignment(assigned)
            self.assignor.owned_tasks = sorted(self._manager.tasks)
            self._refresh_metadata()
        self.state.maybe_transition_to(StreamThreadState.RUNNING)

    def _refresh_metadata(self) -> None:
        manager = self._manager
        if manager is not None:
            self._active = frozenset(TaskMetadata(t.id, t.partitions, not t.is_paused)
                                     for t in manager.tasks.values())
            self._tasks_view = tuple(manager.tasks.values())
            self.assignor.owned_tasks = sorted(manager.tasks)


def _serde(value: object, key: str) -> Serde:
    return BytesSerde() if value is None else as_serde(value, key)


def _real_error(exc: BaseException | None) -> BaseException | None:
    """The error that ended the loop, unless it was only cancellation (a task's failure or a shutdown)."""
    if exc is None:
        return None
    exc = _unwrap(exc)
    return None if isinstance(exc, asyncio.CancelledError) else exc


def _unwrap(exc: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups from the task group."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        inner = [e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)]
        exc = inner[0] if inner else exc.exceptions[0]
    return exc
