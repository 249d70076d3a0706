"""``KafkaStreams``: the client. It owns the stream threads and the client state.

Client states, as in Kafka Streams::

            +--------------+
    +<----- | CREATED      |
    |       +------+-------+
    |              v
    |       +--------------+ <-----+
    +<----- | REBALANCING  |       |
    |       +------+-------+ ------+
    |              v ^
    |       +--------------+
    +<----- | RUNNING      | ---> PENDING_ERROR ---> ERROR
    |       +--------------+
    v
    PENDING_SHUTDOWN ---> NOT_RUNNING

Every call into a stream thread goes through the thread's command channel or a
thread-safe flag, never by touching its loop; every call works from a user's
thread, from a service's event loop (the ``*_async`` forms), and from inside a
stream thread (a processor or a handler) without deadlock.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
from anyio.from_thread import start_blocking_portal

from engine import config as cfg
from engine.clock import SYSTEM_CLOCK, Clock
from engine.config import StreamsConfig, load_handler
from engine.errors import (
    IllegalStateError,
    InternalTopicError,
    InvalidStateStoreError,
    MissingSinkTopicError,
    MissingSourceTopicError,
    StreamsTimeoutError,
)
from engine.ids import TaskId
from engine.lifecycle import StateMachine
from engine.logcontext import LogContext
from engine.spark.session import SparkSessions
from engine.state.bytes_stores import require_rocksdict
from engine.state.cleaner import StateDirCleaner
from engine.state.directory import StateDirectoryLock
from engine.state.query import ReadOnlyKeyValueStore, ReadOnlyWindowStore
from engine.state.restore import StateRestoreListener
from engine.state.store import StateStore
from engine.state.stores import StoreType
from engine.threads.registry import ThreadRegistry
from engine.threads.stream_thread import (
    StreamThread,
    StreamThreadState,
    TaskDetails,
    TaskMetadata,
    ThreadMetadata,
)
from engine.threads.supervisor import ReplacementBackoff, Supervisor
from engine.topology.topology import Topology
from engine.transport import open_transport
from handlers.responses import StreamThreadExceptionResponse

if TYPE_CHECKING:
    from engine.prometheus import PrometheusExporter


def _on_running_loop() -> bool:
    """Whether the caller runs on an event loop (a coroutine's or a plain processor's code)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class ClientState(Enum):
    CREATED = "CREATED"
    REBALANCING = "REBALANCING"
    RUNNING = "RUNNING"
    PENDING_SHUTDOWN = "PENDING_SHUTDOWN"
    NOT_RUNNING = "NOT_RUNNING"
    PENDING_ERROR = "PENDING_ERROR"
    ERROR = "ERROR"

    def is_running_or_rebalancing(self) -> bool:
        return self in (ClientState.RUNNING, ClientState.REBALANCING)


_C = ClientState
CLIENT_TRANSITIONS: dict[ClientState, frozenset[ClientState]] = {
    _C.CREATED: frozenset({_C.REBALANCING, _C.PENDING_SHUTDOWN}),
    _C.REBALANCING: frozenset({_C.RUNNING, _C.PENDING_SHUTDOWN, _C.PENDING_ERROR}),
    _C.RUNNING: frozenset({_C.REBALANCING, _C.PENDING_SHUTDOWN, _C.PENDING_ERROR}),
    _C.PENDING_SHUTDOWN: frozenset({_C.NOT_RUNNING}),
    _C.NOT_RUNNING: frozenset(),
    _C.PENDING_ERROR: frozenset({_C.ERROR}),
    _C.ERROR: frozenset(),
}


@dataclass(frozen=True)
class Metric:
    """One metric in Kafka's shape."""

    group: str
    name: str
    tags: Mapping[str, str]
    value: float


StateListener = Callable[[ClientState, ClientState], None]

_BACKOFF_CAP_S = 30.0


class KafkaStreams:
    """A Kafka Streams client: runs ``topology`` with ``num.stream.threads`` stream threads.

    Use it blocking (``start()`` / ``close()``) from a plain thread, or from an
    event loop as ``async with KafkaStreams(...) as streams:`` (or
    ``await start_async()`` / ``await close_async()``), which never blocks the loop.
    """

    def __init__(self, topology: Topology, config: Mapping[str, Any], *, clock: Clock = SYSTEM_CLOCK) -> None:
        if not isinstance(topology, Topology):
            raise TypeError(f"KafkaStreams needs a Topology (StreamsBuilder().build()), got {type(topology).__name__}")
        self.config = StreamsConfig(config)
        # Load the handlers once here so a bad one is a ConfigError now, not a thread death later.
        for key in (cfg.DEFAULT_DESERIALIZATION_EXCEPTION_HANDLER, cfg.PROCESSING_EXCEPTION_HANDLER):
            load_handler(self.config, key)
        topology.validate()
        topology.check_sink_serdes(self.config[cfg.DEFAULT_KEY_SERDE], self.config[cfg.DEFAULT_VALUE_SERDE])
        topology.set_application_id(self.config[cfg.APPLICATION_ID])
        default_persistent = self.config[cfg.DEFAULT_DSL_STORE] == "rocksDB"
        for name in topology.store_names:
            if topology.store_builder(name).is_persistent(default_persistent):
                require_rocksdict(name)  # now, not at the first task's start on a stream thread
        self.topology = topology
        self._restore_listener: StateRestoreListener | None = None
        self._cleaner: StateDirCleaner | None = None
        self._state_lock: StateDirectoryLock | None = None
        self._clock = clock
        self.client_id: str = self.config[cfg.CLIENT_ID]
        self.process_id = str(uuid.uuid4())
        self.log = LogContext(logging.getLogger(__name__), f"stream-client [{self.client_id}] ")
        self._transport = open_transport(self.config)
        # Spark stages share one SparkSession per client, started by the first batch.
        self._spark = SparkSessions(self.config, self.config[cfg.APPLICATION_ID])
        self._state = StateMachine(f"stream-client [{self.client_id}]", ClientState.CREATED,
                                   CLIENT_TRANSITIONS, self.log)
        self._threads = ThreadRegistry()
        self._user_listener: StateListener | None = None
        self._closing = threading.Event()
        self._shutdown_thread: threading.Thread | None = None
        self._supervisor = Supervisor(
            handler=None,
            replace=self._replace_thread,
            shutdown_thread=self._on_thread_shut_down_by_handler,
            shutdown_client=self._close_to_error,
            shutdown_application=self._request_application_shutdown,
            closing=self._closing,
            backoff=ReplacementBackoff(self.config.seconds(cfg.RETRY_BACKOFF_MS) or 0.1, _BACKOFF_CAP_S),
        )
        self._state.add_listener(self._notify_user)
        self._state.add_listener(self._stop_cleaner_when_done)
        self.prometheus: PrometheusExporter | None = None
        """The Prometheus endpoint while running, when ``metrics.prometheus.port`` is set."""

    # -- state -------------------------------------------------------------------
    @property
    def state(self) -> ClientState:
        return self._state.state

    def set_state_listener(self, listener: StateListener | None) -> None:
        """``listener(new_state, old_state)`` on every client state change (Kafka's argument order)."""
        self._user_listener = listener

    def _notify_user(self, old: ClientState, new: ClientState) -> None:
        listener = self._user_listener
        if listener is not None:
            try:
                listener(new, old)
            except Exception:  # noqa: BLE001 - a user listener must not break a transition
                self.log.exception("The state listener raised")

    def wait_for_state(self, *states: ClientState, timeout: float | None = None) -> bool:
        """Block until the client is in one of ``states``; False when ``timeout`` passes first."""
        return self._state.wait_for(states, timeout)

    async def wait_for_state_async(self, *states: ClientState, timeout: float | None = None) -> bool:
        return await self._state.wait_for_async(states, timeout)

    def set_global_state_restore_listener(self, listener: StateRestoreListener | None) -> None:
        """Told when each task's stores start, progress and end restoring; only allowed in CREATED."""
        if self.state is not ClientState.CREATED:
            raise IllegalStateError(
                f"The restore listener can only be set in state CREATED, not {self.state.name}")
        self._restore_listener = listener

    # -- interactive queries -------------------------------------------------------------
    def store(self, name: str) -> ReadOnlyKeyValueStore | ReadOnlyWindowStore:
        """A read-only view of store ``name`` over all of this client's tasks (safe from any thread).

        Raises ``InvalidStateStoreError`` for a name the topology lacks or a client
        that is not running; a view's reads see only tasks that are running now.
        """
        if name not in self.topology.store_names:
            raise InvalidStateStoreError(name, f"is not in the topology (stores: {self.topology.store_names})")
        if not self.state.is_running_or_rebalancing():
            raise InvalidStateStoreError(name, f"cannot be queried while the client is {self.state.name}")
        if self.topology.store_builder(name).type is StoreType.WINDOW:
            return ReadOnlyWindowStore(name, lambda: self._local_stores(name))
        return ReadOnlyKeyValueStore(name, lambda: self._local_stores(name))

    def _local_stores(self, name: str) -> list[StateStore]:
        return [s for t in self._threads.snapshot() if t.is_alive for s in t.local_stores(name)]

    @property
    def _app_state_dir(self) -> str:
        return os.path.join(self.config[cfg.STATE_DIR], self.config[cfg.APPLICATION_ID])

    def _owned_task_dirs(self) -> set[str] | None:
        threads = [t for t in self._threads.snapshot() if t.is_alive]
        if not threads:
            return None
        return {str(task.task_id) for t in threads for task in t.metadata().active_tasks}

    def _stop_cleaner_when_done(self, _old: ClientState, new: ClientState) -> None:
        if new not in (ClientState.NOT_RUNNING, ClientState.ERROR):
            return
        if self._cleaner is not None:
            self._cleaner.stop()
        if self._state_lock is not None:
            self._state_lock.release()

    def set_uncaught_exception_handler(
        self, handler: Callable[[BaseException], StreamThreadExceptionResponse]
    ) -> None:
        """Decide what a stream thread's death does (KIP-671); only allowed in CREATED."""
        if handler is None:
            raise TypeError("The uncaught exception handler must not be None")
        if self.state is not ClientState.CREATED:
            raise IllegalStateError(
                f"The uncaught exception handler can only be set in state CREATED, not {self.state.name}")
        self._supervisor.handler = handler

    # -- start ---------------------------------------------------------------------
    def start(self) -> None:
        """Check the topics, start the stream threads; returns once they run (not once RUNNING).

        Raises ``IllegalStateError`` unless CREATED, ``MissingSourceTopicError`` /
        ``MissingSinkTopicError`` when topics are missing.
        """
        if self.state is not ClientState.CREATED:
            raise IllegalStateError(f"start() is only allowed in state CREATED, not {self.state.name}")
        # DEBUG: start-up stays a few INFO lines; the values are there when asked for (secrets hidden).
        self.log.debug("%s", self.config.describe())
        self._check_topics()
        if self.topology.store_names:
            lock = StateDirectoryLock(self.config[cfg.STATE_DIR], self.config[cfg.APPLICATION_ID])
            lock.acquire()
            self._state_lock = lock
        self._start_prometheus()
        if not self._state.maybe_transition_to(ClientState.REBALANCING):
            self._stop_prometheus()
            if self._state_lock is not None:
                self._state_lock.release()
            raise IllegalStateError(f"start() is only allowed in state CREATED, not {self.state.name}")
        self.log.info("Starting %d stream threads", self.config[cfg.NUM_STREAM_THREADS])
        # Create every thread before starting any, so the client cannot look RUNNING with only the first.
        threads = [self._create_thread() for _ in range(self.config[cfg.NUM_STREAM_THREADS])]
        with self._state.lock:
            if self.state is not ClientState.REBALANCING:
                # Closed meanwhile (a state listener or another thread called close()).
                for thread in threads:
                    self._threads.remove(thread)
                return
            for thread in threads:
                thread.start()
        if self.topology.store_names:
            self._cleaner = StateDirCleaner(self._app_state_dir, self.config[cfg.STATE_CLEANUP_DELAY_MS],
                                            self._owned_task_dirs)
            self._cleaner.start(f"{self.client_id}-CleanupThread")
        self._threads.resize_caches(self.config[cfg.CACHE_MAX_BYTES_BUFFERING])
        self._maybe_set_running()

    def _start_prometheus(self) -> None:
        port = self.config[cfg.METRICS_PROMETHEUS_PORT]
        if port is None:
            return
        # Imported here: prometheus-client belongs to the optional 'monitor' extra.
        from engine.prometheus import PrometheusExporter

        self.prometheus = PrometheusExporter(self.metrics, self.config[cfg.METRICS_PROMETHEUS_HOST], port)

    def _stop_prometheus(self) -> None:
        exporter, self.prometheus = self.prometheus, None
        if exporter is not None:
            exporter.close()

    async def start_async(self) -> None:
        """``start()`` without blocking the caller's event loop."""
        await anyio.to_thread.run_sync(self.start)

    def _check_topics(self) -> None:
        """Check the user's topics exist and create the internal ones (repartition, changelog)."""
        internal = set(self.topology.repartition_topics())
        source = [t for t in self.topology.source_topics if t not in internal]
        sink = [t for t in self.topology.sink_topics if t not in internal]
        replication = self.config[cfg.REPLICATION_FACTOR]

        async def counts() -> dict[str, int]:
            admin = self._transport.admin(f"{self.client_id}-admin")
            await admin.start()
            try:
                existing = await admin.partition_counts(source + sink)
                if all(t in existing for t in source) and (internal or self.topology.store_names):
                    wanted = self.topology.internal_topics(existing)
                    # aiokafka cannot ask for the broker's default (-1): unset means 1.
                    await admin.create_topics({t: n for t, (n, _) in wanted.items()},
                                              replication if replication > 0 else 1,
                                              configs={t: c for t, (_, c) in wanted.items()})
                    found = await admin.partition_counts(list(wanted))
                    wrong = {t: (n, found.get(t)) for t, (n, _) in wanted.items() if found.get(t) != n}
                    if wrong:
                        raise InternalTopicError(wrong)
                return existing
            finally:
                await admin.close()

        with start_blocking_portal() as portal:
            existing = portal.call(counts)
        missing = [t for t in source if t not in existing]
        if missing:
            raise MissingSourceTopicError(missing)
        missing = [t for t in sink if t not in existing]
        if missing:
            raise MissingSinkTopicError(missing)

    def _create_thread(self, at_runtime: bool = False) -> StreamThread:
        with self._threads.lock:
            thread = StreamThread(
                index=self._threads.next_index(),
                client_id=self.client_id,
                process_id=self.process_id,
                config=self.config,
                topology=self.topology,
                transport=self._transport,
                cache_size=0,
                on_state_change=self._on_thread_state,
                on_failure=self._on_thread_failure,
                on_shutdown_requested=lambda _thread: self._close_to_error(),
                clock=self._clock,
                restore_listener=self._restore_listener,
                spark=self._spark,
                on_first_join=self._rejoin_others if at_runtime else None,
            )
            self._threads.add(thread)
        return thread

    # -- threads at runtime (KIP-663) -------------------------------------------------
    def add_stream_thread(self) -> str | None:
        """Start one more stream thread and return its name.

        Threads can only be added in RUNNING or REBALANCING; returns None otherwise.
        """
        with self._threads.lock:
            if not self.state.is_running_or_rebalancing():
                self.log.warning("Cannot add a stream thread in state %s", self.state.name)
                return None
            thread = self._create_thread(at_runtime=True)
            share = self._threads.resize_caches(self.config[cfg.CACHE_MAX_BYTES_BUFFERING])
            self.log.info("Adding %s; %d live threads, cache size per thread %d",
                          thread.name, len(self._threads.alive()), share)
        with self._state.lock:
            # close() changes the state under this lock before it lists the threads
            # to shut down, so a thread started here is always on that list.
            if self.state.is_running_or_rebalancing():
                thread.start()
                return thread.name
        # The client stopped meanwhile: take the thread back out.
        self._threads.remove(thread)
        self._threads.resize_caches(self.config[cfg.CACHE_MAX_BYTES_BUFFERING])
        return None

    def _rejoin_others(self, joining: StreamThread) -> None:
        """A thread added at runtime is about to join: the others rejoin now, so the rebalance
        that gives it tasks completes at once instead of at their next heartbeat
        (``heartbeat.interval.ms``, when the coordinator tells them)."""
        for thread in self._threads.alive():
            if thread is not joining and thread.state.state is not StreamThreadState.CREATED:
                thread.rejoin()

    async def add_stream_thread_async(self) -> str | None:
        return await anyio.to_thread.run_sync(self.add_stream_thread)

    def remove_stream_thread(self, timeout: float | None = None) -> str | None:
        """Shut down one alive stream thread gracefully and return its name.

        Returns None when no thread is alive. A thread may remove itself (from a
        processor or handler); then the call returns without waiting. Called on a
        stream thread's running loop (a plain processor, or an uncaught-exception
        handler, which runs on the failing thread's loop), it does not wait either:
        it returns once the shutdown has started, and the removed thread keeps its
        index until it is DEAD (``remove_stream_thread_async`` waits without blocking).
        Otherwise raises ``StreamsTimeoutError`` if the thread is not dead within
        ``timeout`` seconds: the call never waits longer, whatever the thread is doing
        (a long record, a loop blocked on the client); the thread goes on shutting down.
        """
        if not self.state.is_running_or_rebalancing():
            self.log.warning("Cannot remove a stream thread in state %s", self.state.name)
            return None
        started = time.monotonic()
        current = self._threads.current()
        # The choice is the victim's own state machine: moving it to PENDING_SHUTDOWN claims it,
        # so two removals never pick the same thread, and no registry lock is held while the
        # victim's loop is reached (that loop may be waiting for the registry itself).
        started_threads = [t for t in self._threads.alive() if t.state.state is not StreamThreadState.CREATED]
        candidates = [t for t in started_threads if t is not current] + [t for t in started_threads if t is current]
        victim = next((t for t in candidates if t.state.maybe_transition_to(StreamThreadState.PENDING_SHUTDOWN)),
                      None)
        if victim is None:
            return None
        victim.shutdown(leave_group=True)  # never waits for the victim's loop
        self.log.info("Removing %s; cache size per thread %d", victim.name,
                      self._threads.resize_caches(self.config[cfg.CACHE_MAX_BYTES_BUFFERING]))
        if victim is current:
            return victim.name  # waiting for ourselves would deadlock
        if current is not None and _on_running_loop():
            # Waiting would block this stream thread's loop, and the victim may only be
            # able to leave once this thread has rejoined a rebalance in progress (its
            # consumer's close waits for its JoinGroup): it would hang until this thread
            # is evicted from the group.
            return victim.name
        remaining = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
        if not victim.join(remaining):
            raise StreamsTimeoutError(
                f"Thread {victim.name} was asked to shut down and is still shutting down after {timeout} s "
                "(it finishes its current records, commits and leaves the group in the background; its "
                "cache share already went to the other threads, and its index is free once it is DEAD)")
        self._threads.remove(victim)
        return victim.name

    async def remove_stream_thread_async(self, timeout: float | None = None) -> str | None:
        return await anyio.to_thread.run_sync(self.remove_stream_thread, timeout)

    # -- thread callbacks (run on stream threads) ---------------------------------------
    def _on_thread_state(self, thread: StreamThread, old: StreamThreadState, new: StreamThreadState) -> None:
        if new in (StreamThreadState.PARTITIONS_REVOKED, StreamThreadState.PARTITIONS_ASSIGNED):
            if self.state is ClientState.RUNNING:
                self._state.maybe_transition_to(ClientState.REBALANCING)
        elif new in (StreamThreadState.RUNNING, StreamThreadState.DEAD, StreamThreadState.PENDING_SHUTDOWN):
            if new is StreamThreadState.DEAD:
                self._threads.remove(thread)
            elif new is StreamThreadState.PENDING_SHUTDOWN and not self._closing.is_set():
                # A thread on its way out (removed, or failed whatever the handler answers)
                # gives its cache share to the alive ones: they always split the total.
                self._threads.resize_caches(self.config[cfg.CACHE_MAX_BYTES_BUFFERING])
            self._maybe_set_running()

    def _maybe_set_running(self) -> None:
        """RUNNING once every thread runs or is dead (a thread shutting down is fine if another runs)."""
        with self._state.lock:
            if self.state is not ClientState.REBALANCING:
                return
            states = [t.state.state for t in self._threads.snapshot()]
            running = StreamThreadState.RUNNING
            some_running = running in states
            for state in states:
                if state is StreamThreadState.DEAD or state is running:
                    continue
                if state is StreamThreadState.PENDING_SHUTDOWN and some_running:
                    continue
                if state is StreamThreadState.PENDING_SHUTDOWN and not any(
                        s.is_alive() for s in states):
                    continue
                return
            self._state.transition_to(ClientState.RUNNING)

    def _on_thread_failure(self, thread: StreamThread, exc: BaseException) -> None:
        with self._threads.lock:
            self._threads.failed_threads += 1
        if isinstance(exc, (KeyboardInterrupt, SystemExit)) or self._closing.is_set():
            return
        self._supervisor.on_failure(thread, exc)

    def _replace_thread(self, failed: StreamThread) -> str | None:
        return self.add_stream_thread()

    def _on_thread_shut_down_by_handler(self, thread: StreamThread) -> None:
        if not any(t.is_alive for t in self._threads.snapshot() if t is not thread):
            self.log.error("All stream threads have died. The instance will be in error state")
            self._close_to_error()

    def _request_application_shutdown(self, thread: StreamThread) -> None:
        """Ask every instance to shut down through the group protocol (the assignor's error code).

        Someone has to rejoin to carry the request: with no other live thread, add one.
        """
        carriers = [t for t in self._threads.alive() if t is not thread]
        if not carriers and thread.can_carry_shutdown_request():
            # The failing thread is still a member: it rejoins with the request itself before it
            # leaves, so no rebalance can hand its task to another instance in between.
            thread.carry_shutdown_request_on_exit()
            return
        if not carriers:
            # As add_stream_thread, but flagged before it starts: a first join without the
            # request could win an ordinary assignment, the failed task included.
            with self._threads.lock:
                carrier = self._create_thread() if self.state.is_running_or_rebalancing() else None
                if carrier is not None:
                    carrier.request_application_shutdown()
                    self._threads.resize_caches(self.config[cfg.CACHE_MAX_BYTES_BUFFERING])
                    self.log.info("Adding %s to carry the application shutdown request", carrier.name)
            if carrier is not None and self.state.is_running_or_rebalancing():
                carrier.start()
                return
            if carrier is not None:
                self._threads.remove(carrier)
                self._threads.resize_caches(self.config[cfg.CACHE_MAX_BYTES_BUFFERING])
        if not carriers:
            self.log.error("No stream thread can carry the application shutdown request; shutting down this client")
            self._close_to_error()
            return
        for carrier in carriers:
            carrier.request_application_shutdown()

    # -- close -----------------------------------------------------------------------
    def _begin_shutdown(self, target: ClientState) -> bool:
        """Start shutting every thread down on a helper thread; False if already closing."""
        pending = ClientState.PENDING_ERROR if target is ClientState.ERROR else ClientState.PENDING_SHUTDOWN
        with self._state.lock:
            if not self._state.maybe_transition_to(pending):
                return False
            self._closing.set()

        # A handler-caused shutdown is bounded by error.shutdown.timeout.ms.
        limit = self.config.seconds(cfg.ERROR_SHUTDOWN_TIMEOUT_MS) if target is ClientState.ERROR else None

        # A static member (group.instance.id) stays in the group until its session
        # times out, so a restart within session.timeout.ms gets its tasks back
        # without a rebalance (as in Kafka Streams). remove_stream_thread() does leave.
        leave_group = not self.config[cfg.GROUP_INSTANCE_ID]

        def shut_down() -> None:
            deadline = None if limit is None else time.monotonic() + limit
            threads = self._threads.snapshot()
            for thread in threads:
                thread.shutdown(leave_group=leave_group)
            for thread in threads:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not thread.join(remaining) and not thread.is_current:
                    self.log.warning("%s did not stop within error.shutdown.timeout.ms", thread.name)
            self._threads.trim_dead()
            self._stop_prometheus()
            # After the threads: a batch still running on a thread that did not stop in time
            # is cut off here, and its records were not committed.
            self._stop_spark()
            self._state.transition_to(target)

        self._shutdown_thread = threading.Thread(target=shut_down, name=f"{self.client_id}-CloseThread",
                                                 daemon=True)
        self._shutdown_thread.start()
        return True

    def _stop_spark(self) -> None:
        try:
            self._spark.stop()
        except Exception:  # noqa: BLE001 - closing goes on
            self.log.exception("Failed to stop the SparkSession")

    def _close_to_error(self) -> None:
        self._begin_shutdown(ClientState.ERROR)

    def close(self, timeout: float | None = None) -> bool:
        """Shut down every thread (finish, commit, leave the group); True if done within ``timeout`` s.

        With ``group.instance.id`` set the threads' static members do not leave the group.

        From inside a stream thread it only starts the shutdown and returns False.
        """
        if self.state is ClientState.CREATED:
            self._state.transition_to(ClientState.PENDING_SHUTDOWN)
            self._state.transition_to(ClientState.NOT_RUNNING)
            return True
        self._begin_shutdown(ClientState.NOT_RUNNING)
        if self._threads.current() is not None:
            return False
        done = self._state.wait_for((ClientState.NOT_RUNNING, ClientState.ERROR), timeout)
        if not done:
            self.log.warning("Streams did not shut down within %s s", timeout)
        return done

    async def close_async(self, timeout: float | None = None) -> bool:
        return await anyio.to_thread.run_sync(self.close, timeout)

    async def __aenter__(self) -> KafkaStreams:
        await self.start_async()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close_async()

    def __enter__(self) -> KafkaStreams:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- paused tasks ---------------------------------------------------------------
    def resume(self, task_id: TaskId | str, skip: bool = False) -> bool:
        """Resume a task that an error handler PAUSED, from the record that failed.

        With ``skip=True`` the task goes on after that record (its offset + 1 is
        committed). Returns False, doing nothing, when the task is not paused here.
        Works from any thread, from a service's loop, and from a stream thread.
        """
        if isinstance(task_id, str):
            task_id = TaskId.parse(task_id)
        for thread in self._threads.snapshot():
            if thread.is_alive and thread.resume_task(task_id, skip):
                return True
        return False

    async def resume_async(self, task_id: TaskId | str, skip: bool = False) -> bool:
        return await anyio.to_thread.run_sync(self.resume, task_id, skip)

    def paused_local_tasks(self) -> set[TaskMetadata]:
        """The tasks of this client's threads that are PAUSED (``is_running`` False)."""
        return {t for m in self.metadata_for_local_threads() for t in m.active_tasks if not t.is_running}

    # -- inspection ------------------------------------------------------------------
    def metadata_for_local_threads(self) -> list[ThreadMetadata]:
        """Name, state, active tasks and cache size of each thread that is not DEAD."""
        return [t.metadata() for t in self._threads.snapshot() if t.state.state is not StreamThreadState.DEAD]

    def metrics(self) -> list[Metric]:
        """Every metric in Kafka Streams' shape; safe from any thread, never waits for a stream thread.

        ``stream-metrics`` (client): ``alive-stream-threads``, ``failed-stream-threads`` and
        ``client-state`` (1.0, the state name in its ``state`` tag). ``stream-thread-metrics``:
        totals, the windowed ``process-rate``, ``process-latency-avg``/``-max`` (ms per record),
        ``poll-rate``, ``commit-rate`` and the cache share. ``stream-task-metrics``: records
        processed and dropped, ``records-lag``, ``paused``, timeout retries.
        """
        tags = {"client-id": self.client_id}
        threads = self._threads.snapshot()
        result = [
            Metric("stream-metrics", "alive-stream-threads", tags, float(sum(t.is_alive for t in threads))),
            Metric("stream-metrics", "failed-stream-threads", tags, float(self._threads.failed_threads)),
            Metric("stream-metrics", "client-state", {**tags, "state": self.state.name}, 1.0),
        ]
        for thread in threads:
            if thread.state.state is StreamThreadState.DEAD:
                continue
            thread_tags = {"thread-id": thread.name}
            for name, value in thread.counters().items():
                result.append(Metric("stream-thread-metrics", name, thread_tags, value))
            for name, value in thread.sensors.values().items():
                result.append(Metric("stream-thread-metrics", name, thread_tags, value))
            for task_id, values in thread.task_counters():
                task_tags = {**thread_tags, "task-id": str(task_id)}
                for name, value in values.items():
                    result.append(Metric("stream-task-metrics", name, task_tags, value))
            result.append(Metric("stream-thread-metrics", "cache-size-bytes", thread_tags,
                                 float(thread.cache_size)))
            for task_id, lag in thread.task_lags().items():
                result.append(Metric("stream-task-metrics", "records-lag", {**thread_tags, "task-id": str(task_id)},
                                     float(lag)))
            if thread.errors is not None:
                result.append(Metric("stream-thread-metrics", "dropped-records-total", thread_tags,
                                     float(thread.errors.dropped)))
                # Pauses so far; how many tasks are paused now is paused-tasks-total (the thread's counters).
                result.append(Metric("stream-thread-metrics", "pause-total", thread_tags,
                                     float(thread.errors.paused)))
        return result

    def local_task_details(self) -> list[TaskDetails]:
        """Every active task of this client's threads: state (running/paused/retrying), committed
        offsets, lag and timeout deadline. Safe from any thread; never waits for a stream thread."""
        return [d for t in self._threads.snapshot() if t.state.state is not StreamThreadState.DEAD
                for d in t.task_details()]

    def metric(self, name: str) -> float:
        """The client-level metric ``name`` (e.g. ``failed-stream-threads``)."""
        for metric in self.metrics():
            if metric.name == name and metric.group == "stream-metrics":
                return metric.value
        raise KeyError(name)
