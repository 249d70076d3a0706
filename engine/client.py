"""``KafkaStreams``: the client, the one object a user holds. Read a record's way from here.

This module is the facade: configuration checks, start (topics, state directory,
the optional Prometheus endpoint), close, pause/resume, interactive queries and
inspection. The client's state machine is ``streamloop.client_states``; its stream
threads (add, remove, replace, the uncaught-exception handler) are
``streamloop.threads.client_threads.ClientThreads``, the next stage; its metrics are
gathered by ``streamloop.client_metrics``.

Every call works from a user's thread, from a service's event loop (the
``*_async`` forms, which never block the loop), and from inside a stream thread
(a processor or a handler) without deadlock.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
import weakref
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
from anyio.from_thread import start_blocking_portal

from streamloop import config as cfg
from streamloop import redaction
from streamloop.client_metrics import Metric, client_metrics
from streamloop.client_states import CLIENT_TRANSITIONS, ClientState
from streamloop.clock import SYSTEM_CLOCK, Clock
from streamloop.config import StreamsConfig, load_handler
from streamloop.errors import (
    IllegalStateError,
    InternalTopicError,
    InvalidStateStoreError,
    MissingSinkTopicError,
    MissingSourceTopicError,
)
from streamloop.handlers.responses import StreamThreadExceptionResponse
from streamloop.health import Health
from streamloop.ids import TaskId
from streamloop.lifecycle import StateMachine
from streamloop.logcontext import LogContext
from streamloop.serdes import Serde
from streamloop.spark.kafka_source import check_spark_reads
from streamloop.spark.session import SparkSessions
from streamloop.state.bytes_stores import require_rocksdict
from streamloop.state.cleaner import StateDirCleaner
from streamloop.state.directory import StateDirectoryLock
from streamloop.state.metadata import KeyQueryMetadata, StreamsMetadata, StreamsMetadataState
from streamloop.state.query import ReadOnlyKeyValueStore, ReadOnlyWindowStore
from streamloop.state.restore import StateRestoreListener
from streamloop.state.session_windows import ReadOnlySessionStore
from streamloop.state.store import StateStore
from streamloop.state.stores import StoreType
from streamloop.threads.client_threads import ClientThreads
from streamloop.threads.global_thread import GLOBAL_DIR, GlobalTables
from streamloop.threads.states import StreamThreadState
from streamloop.threads.view import TaskDetails, TaskMetadata, ThreadMetadata
from streamloop.timestamps import load_timestamp_extractor
from streamloop.topology.copartition import check_copartition_groups
from streamloop.topology.patterns import pattern_topics
from streamloop.topology.topology import Topology
from streamloop.transport import open_transport

if TYPE_CHECKING:
    from streamloop.prometheus import PrometheusExporter

__all__ = ["CLIENT_TRANSITIONS", "ClientState", "KafkaStreams", "Metric", "StateListener"]

StateListener = Callable[[ClientState, ClientState], None]


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
        load_timestamp_extractor(self.config)
        topology.validate()
        check_spark_reads(topology.spark_reads, self.config)  # read="executors" where it cannot: now
        topology.check_sink_serdes(self.config[cfg.DEFAULT_KEY_SERDE], self.config[cfg.DEFAULT_VALUE_SERDE])
        topology.set_application_id(self.config[cfg.APPLICATION_ID])
        default_persistent = self.config[cfg.DEFAULT_DSL_STORE] == "rocksDB"
        for name in topology.store_names:
            if topology.store_builder(name).is_persistent(default_persistent):
                require_rocksdict(name)  # now, not at the first task's start on a stream thread
        for spec in topology.global_stores.values():
            if spec.builder.is_persistent(default_persistent):
                require_rocksdict(spec.name)
        self.topology = topology
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
        # Which instance owns which part of each store, from the assignments (queries across instances).
        self._metadata = StreamsMetadataState.for_topology(self.config[cfg.APPLICATION_SERVER], topology)
        self._threads = ClientThreads(
            config=self.config, client_id=self.client_id, process_id=self.process_id, topology=topology,
            transport=self._transport, clock=clock, spark=self._spark, state=self._state, log=self.log,
            close_to_error=self._close_to_error, metadata=self._metadata)
        self.health = Health(state=lambda: self.state, threads=self._threads.snapshot,
                             dead_threads=lambda: self._threads.dead_threads,
                             task_timeout_ms=self.config[cfg.TASK_TIMEOUT_MS], monotonic_ms=clock.monotonic_ms)
        """Liveness and readiness for an orchestrator's probes: ``health.live()``, ``health.ready(max_lag)``."""
        # The global tables' stores and the thread that fills them (started by start()).
        self._global = GlobalTables(self.config, topology, self._transport, self.client_id)
        self._user_listener: StateListener | None = None
        self._shutdown_thread: threading.Thread | None = None
        self._state.add_listener(self._notify_user)
        self._state.add_listener(self._stop_cleaner_when_done)
        self._state.add_listener(self._forget_secrets_when_done)
        # A client dropped without close() must not keep its secrets registered (and the log
        # record factory installed) for the rest of the process.
        weakref.finalize(self, redaction.unregister_id, id(self))
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
            except Exception:  # a user listener must not break a transition
                self.log.exception("The state listener raised")

    def wait_for_state(self, *states: ClientState, timeout: float | None = None) -> bool:
        """Block until the client is in one of ``states``; False when ``timeout`` passes first."""
        return self._state.wait_for(states, timeout)

    async def wait_for_state_async(self, *states: ClientState, timeout: float | None = None) -> bool:  # noqa: ASYNC109 - mirrors the blocking form
        return await self._state.wait_for_async(states, timeout)

    def set_global_state_restore_listener(self, listener: StateRestoreListener | None) -> None:
        """Told when each task's stores start, progress and end restoring; only allowed in CREATED."""
        if self.state is not ClientState.CREATED:
            raise IllegalStateError(
                f"The restore listener can only be set in state CREATED, not {self.state.name}")
        self._threads.restore_listener = listener

    # -- interactive queries -------------------------------------------------------------
    def store(self, name: str) -> ReadOnlyKeyValueStore | ReadOnlyWindowStore | ReadOnlySessionStore:
        """A read-only view of store ``name`` over all of this client's tasks (safe from any thread).

        Raises ``InvalidStateStoreError`` for a name the topology lacks or a client
        that is not running; a view's reads see only tasks that are running now.
        """
        if name not in self.topology.store_names and name not in self.topology.global_stores:
            stores = self.topology.store_names + list(self.topology.global_stores)
            raise InvalidStateStoreError(name, f"is not in the topology (stores: {stores})")
        if not self.state.is_running_or_rebalancing():
            raise InvalidStateStoreError(name, f"cannot be queried while the client is {self.state.name}")
        if name in self.topology.global_stores:
            # One full copy per client, not spread over tasks.
            return ReadOnlyKeyValueStore(name, lambda: self._global.instances(name))
        if self.topology.store_builder(name).type is StoreType.WINDOW:
            return ReadOnlyWindowStore(name, lambda: self._local_stores(name))
        if self.topology.store_builder(name).type is StoreType.SESSION:
            return ReadOnlySessionStore(name, lambda: self._local_stores(name))
        return ReadOnlyKeyValueStore(name, lambda: self._local_stores(name))

    def query_metadata_for_key(self, store_name: str, key: Any, key_serde: Serde) -> KeyQueryMetadata | None:
        """Which instance's ``application.server`` to ask for ``key`` of store ``store_name``.

        The key's partition is the default partitioner's on ``key_serde``'s bytes (where the producer
        writes it), whether or not the store holds the key. ``KeyQueryMetadata.NOT_AVAILABLE`` until
        this client's first assignment names an endpoint; None for a store the topology lacks.
        Raises ``IllegalStateError`` unless RUNNING or REBALANCING. Safe from any thread.
        """
        self._check_queryable()
        return self._metadata.key_query_metadata_for_key(store_name, key, key_serde)

    def metadata_for_all_clients(self) -> list[StreamsMetadata]:
        """Every instance of the application that set ``application.server``: its endpoint, stores, partitions."""
        self._check_queryable()
        return self._metadata.all_metadata()

    def metadata_for_store(self, store_name: str) -> list[StreamsMetadata]:
        """The instances that hold a part of ``store_name`` (empty for a store the topology lacks)."""
        self._check_queryable()
        return self._metadata.all_metadata_for_store(store_name)

    # Kafka Streams' current names.
    metadata_for_all_streams_clients = metadata_for_all_clients
    streams_metadata_for_store = metadata_for_store

    def _check_queryable(self) -> None:
        if self.state is ClientState.CREATED:
            raise IllegalStateError("KafkaStreams has not been started, you can retry after calling start()")
        if not self.state.is_running_or_rebalancing():
            raise IllegalStateError(f"KafkaStreams is not running. State is {self.state.name}.")

    def store_instances(self, name: str) -> list[StateStore]:
        """This client's instances of store ``name``: the global copy of a global store, else one
        per task of this client's alive threads that has it (what a view of ``store`` reads; its
        serdes and window size are what an endpoint that serves it needs)."""
        if name in self.topology.global_stores:
            return list(self._global.instances(name))
        return self._local_stores(name)

    def _local_stores(self, name: str) -> list[StateStore]:
        return [s for t in self._threads.snapshot() if t.is_alive for s in t.local_stores(name)]

    @property
    def _app_state_dir(self) -> str:
        return os.path.join(str(self.config[cfg.STATE_DIR]), str(self.config[cfg.APPLICATION_ID]))

    def _owned_task_dirs(self) -> set[str] | None:
        threads = [t for t in self._threads.snapshot() if t.is_alive]
        if not threads:
            return None
        # A standby's directory is owned too: it holds the warm copy.
        owned = {str(task.task_id) for t in threads for m in [t.metadata()]
                 for task in (*m.active_tasks, *m.standby_tasks)}
        # The global stores' directory is the client's, never a task's to clean up.
        return owned | {GLOBAL_DIR} if self.topology.global_stores else owned

    def _stop_cleaner_when_done(self, _old: ClientState, new: ClientState) -> None:
        if new not in (ClientState.NOT_RUNNING, ClientState.ERROR):
            return
        if self._cleaner is not None:
            self._cleaner.stop()
        if self._state_lock is not None:
            self._state_lock.release()

    def _forget_secrets_when_done(self, _old: ClientState, new: ClientState) -> None:
        if new in (ClientState.NOT_RUNNING, ClientState.ERROR):
            redaction.unregister(self)

    def set_uncaught_exception_handler(
        self, handler: Callable[[BaseException], StreamThreadExceptionResponse]
    ) -> None:
        """Decide what a stream thread's death does (KIP-671); only allowed in CREATED."""
        if handler is None:
            raise TypeError("The uncaught exception handler must not be None")
        if self.state is not ClientState.CREATED:
            raise IllegalStateError(
                f"The uncaught exception handler can only be set in state CREATED, not {self.state.name}")
        self._threads.supervisor.handler = handler

    # -- start ---------------------------------------------------------------------
    def start(self) -> None:
        """Check the topics, start the stream threads; returns once they run (not once RUNNING).

        Raises ``IllegalStateError`` unless CREATED, ``MissingSourceTopicError`` /
        ``MissingSinkTopicError`` when topics are missing.
        """
        if self.state is not ClientState.CREATED:
            raise IllegalStateError(f"start() is only allowed in state CREATED, not {self.state.name}")
        # Before the first client connects: aiokafka logs its login at DEBUG, password included.
        redaction.register(self, redaction.config_secrets(self.config))
        # DEBUG: start-up stays a few INFO lines; the values are there when asked for (secrets hidden).
        self.log.debug("%s", self.config.describe())
        self._check_topics()
        if self.topology.store_names or self.topology.global_stores:
            lock = StateDirectoryLock(self.config[cfg.STATE_DIR], self.config[cfg.APPLICATION_ID])
            lock.acquire()
            self._state_lock = lock
        self._start_prometheus()
        if not self._state.maybe_transition_to(ClientState.REBALANCING):
            self._stop_prometheus()
            if self._state_lock is not None:
                self._state_lock.release()
            raise IllegalStateError(f"start() is only allowed in state CREATED, not {self.state.name}")
        if self.topology.global_stores:
            # In REBALANCING and before any stream thread, as Kafka Streams' global thread: their
            # first records must find the global tables whole.
            try:
                self._threads.global_stores = self._global.start(self._app_state_dir, self._close_to_error)
            except BaseException:
                if self._begin_shutdown(ClientState.ERROR):
                    raise
                return  # closed meanwhile, which ended the bootstrap
        self.log.info("Starting %d stream threads", self.config[cfg.NUM_STREAM_THREADS])
        if not self._threads.start_all(self.config[cfg.NUM_STREAM_THREADS]):
            return
        if self.topology.store_names:
            self._cleaner = StateDirCleaner(self._app_state_dir, self.config[cfg.STATE_CLEANUP_DELAY_MS],
                                            self._owned_task_dirs)
            self._cleaner.start(f"{self.client_id}-CleanupThread")
        self._threads.resize_caches()
        self._threads.maybe_set_running()

    def _start_prometheus(self) -> None:
        port = self.config[cfg.METRICS_PROMETHEUS_PORT]
        if port is None:
            return
        # Imported here: prometheus-client belongs to the optional 'monitor' extra.
        from streamloop.prometheus import PrometheusExporter

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
        source = [t for t in self.topology.required_source_topics if t not in internal] + self.topology.global_topics
        sink = [t for t in self.topology.sink_topics if t not in internal]
        replication = self.config[cfg.REPLICATION_FACTOR]

        async def counts() -> dict[str, int]:
            admin = self._transport.admin(f"{self.client_id}-admin")
            await admin.start()
            try:
                existing = await admin.partition_counts(source + sink)
                if self.topology.has_patterns:
                    # The internal topics are sized by the topics the patterns match now.
                    everything = await admin.all_partition_counts()
                    self.topology.resolve_patterns(everything)
                    existing.update({t: everything[t] for t in pattern_topics(self.topology)})
                check_copartition_groups(self.topology, existing)  # before creating anything for it
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

    # -- threads at runtime (KIP-663) -------------------------------------------------
    def add_stream_thread(self) -> str | None:
        """Start one more stream thread and return its name.

        Threads can only be added in RUNNING or REBALANCING; returns None otherwise.
        """
        return self._threads.add()

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
        return self._threads.remove(timeout)

    async def remove_stream_thread_async(self, timeout: float | None = None) -> str | None:  # noqa: ASYNC109 - mirrors the blocking form
        return await anyio.to_thread.run_sync(self.remove_stream_thread, timeout)

    # -- close -----------------------------------------------------------------------
    def _begin_shutdown(self, target: ClientState) -> bool:
        """Start shutting every thread down on a helper thread; False if already closing."""
        pending = ClientState.PENDING_ERROR if target is ClientState.ERROR else ClientState.PENDING_SHUTDOWN
        if not self._state.maybe_transition_to(pending):
            return False

        # A handler-caused shutdown is bounded by error.shutdown.timeout.ms.
        limit = self.config.seconds(cfg.ERROR_SHUTDOWN_TIMEOUT_MS) if target is ClientState.ERROR else None

        # A static member (group.instance.id) stays in the group until its session
        # times out, so a restart within session.timeout.ms gets its tasks back
        # without a rebalance (as in Kafka Streams). remove_stream_thread() does leave.
        leave_group = not self.config[cfg.GROUP_INSTANCE_ID]
        # Every thread is asked now, before this call returns: when a failed thread's handler
        # answered SHUTDOWN_CLIENT, that thread leaves the group next, and a sibling not yet asked
        # could take its tasks over in the rebalance and process the failed record again.
        self._threads.request_shutdown_all(leave_group)

        def shut_down() -> None:
            self._threads.shut_down_all(leave_group, limit)
            self._global.shut_down()
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
        except Exception:  # closing goes on
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

    async def close_async(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109 - mirrors the blocking form
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
        return any(thread.is_alive and thread.resume_task(task_id, skip) for thread in self._threads.snapshot())

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
        processed and dropped, ``records-lag``, ``paused``, timeout retries, RETRY answers run and exhausted.
        """
        return client_metrics(self.client_id, self.state, self._threads.snapshot(), self._threads.failed_threads)

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
