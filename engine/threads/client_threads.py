"""A client's stream threads: create, start, add, remove and replace them (KIP-663), follow
their states into the client's, apply the uncaught-exception handler's answer when one dies
(KIP-671, through ``Supervisor``) and shut them all down.

Every call into a stream thread goes through the thread's command channel or its state
machine, never by touching its loop; every call works from a user's thread and from inside
a stream thread (a processor or a handler) without deadlock: no lock is held while another
thread's loop is reached. Next stage: ``streamloop.threads.stream_thread.StreamThread``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping

import anyio.lowlevel

from streamloop import config as cfg
from streamloop.client_states import CLOSING_STATES, ClientState
from streamloop.clock import Clock
from streamloop.config import StreamsConfig
from streamloop.errors import StreamsTimeoutError
from streamloop.handlers.responses import StreamThreadExceptionResponse
from streamloop.lifecycle import StateMachine
from streamloop.logcontext import LogContext
from streamloop.spark.session import SparkSessions
from streamloop.state.metadata import StreamsMetadataState
from streamloop.state.restore import StateRestoreListener
from streamloop.state.store import StateStore
from streamloop.threads.rebalances import RebalanceWatch
from streamloop.threads.registry import ThreadRegistry
from streamloop.threads.states import StreamThreadState
from streamloop.threads.stream_thread import StreamThread
from streamloop.threads.supervisor import ReplacementBackoff, Supervisor
from streamloop.topology.topology import Topology
from streamloop.transport.base import Transport

_BACKOFF_CAP_S = 30.0


def _on_running_loop() -> bool:
    """Whether the caller runs on an event loop (a coroutine's or a plain processor's code)."""
    try:
        anyio.lowlevel.current_token()
    except RuntimeError:  # anyio's NoEventLoopError
        return False
    return True


class _ClosingSignal:
    """What the supervisor waits on before replacing a thread: the client's closing states."""

    def __init__(self, state: StateMachine[ClientState]) -> None:
        self._state = state

    def wait(self, timeout: float) -> bool:
        return self._state.wait_for(CLOSING_STATES, timeout)


class ClientThreads:
    """Caller: ``KafkaStreams``; the ``_on_thread_*`` callbacks run on the stream threads."""

    def __init__(self, *, config: StreamsConfig, client_id: str, process_id: str, topology: Topology,
                 transport: Transport, clock: Clock, spark: SparkSessions, state: StateMachine[ClientState],
                 log: LogContext, close_to_error: Callable[[], None],
                 metadata: StreamsMetadataState | None = None) -> None:
        self._config = config
        self._metadata = metadata
        self._client_id = client_id
        self._process_id = process_id
        self._topology = topology
        self._transport = transport
        self._clock = clock
        self._spark = spark
        self._state = state
        self._log = log
        self._close_to_error = close_to_error
        self._registry = ThreadRegistry()
        # A client that stays REBALANCING past three session timeouts says so, once, at WARNING.
        self.rebalance_watch = RebalanceWatch(3 * config[cfg.SESSION_TIMEOUT_MS], clock.monotonic_ms,
                                              lambda: [t.rebalances for t in self._registry.snapshot()], log)
        state.add_listener(self.rebalance_watch.state_changed)
        self.restore_listener: StateRestoreListener | None = None
        # Threads that died and that the uncaught-exception handler did not replace (it answered
        # SHUTDOWN_THREAD): (name, error), for the client's liveness. Appended on the dying thread.
        self.dead_threads: list[tuple[str, str]] = []
        # The global tables' stores (set by KafkaStreams when it opens them), handed to every thread.
        self.global_stores: Mapping[str, StateStore] = {}
        self.supervisor = Supervisor(
            handler=None,
            replace=lambda _failed: self.add(),
            shutdown_thread=self._on_thread_shut_down_by_handler,
            shutdown_client=close_to_error,
            shutdown_application=self._request_application_shutdown,
            closing=_ClosingSignal(state),
            backoff=ReplacementBackoff(config.seconds(cfg.RETRY_BACKOFF_MS) or 0.1, _BACKOFF_CAP_S),
        )

    # -- reading (any thread, no lock) -----------------------------------------------------
    def snapshot(self) -> list[StreamThread]:
        return self._registry.snapshot()

    def __iter__(self) -> Iterator[StreamThread]:
        return iter(self._registry)

    def alive(self) -> list[StreamThread]:
        return self._registry.alive()

    def current(self) -> StreamThread | None:
        """The stream thread the caller runs on, if any."""
        return self._registry.current()

    @property
    def failed_threads(self) -> int:
        return self._registry.failed_threads

    def resize_caches(self) -> int:
        """Split ``cache.max.bytes.buffering`` over the alive threads; returns the share."""
        return self._registry.resize_caches(self._config[cfg.CACHE_MAX_BYTES_BUFFERING],
                                            self._config[cfg.STATESTORE_UNCOMMITTED_MAX_BYTES])

    # -- start -------------------------------------------------------------------------
    def create(self) -> StreamThread:
        with self._registry.lock:
            thread = StreamThread(
                index=self._registry.next_index(),
                client_id=self._client_id,
                process_id=self._process_id,
                config=self._config,
                topology=self._topology,
                transport=self._transport,
                cache_size=0,
                on_state_change=self._on_thread_state,
                on_failure=self._on_thread_failure,
                on_shutdown_requested=lambda _thread: self._close_to_error(),
                clock=self._clock,
                restore_listener=self.restore_listener,
                spark=self._spark,
                siblings=self._registry.snapshot,
                on_membership_change=self._on_membership_change,
                watch_rebalancing=self.rebalance_watch.check,
                metadata=self._metadata,
            )
            thread.global_stores = self.global_stores
            self._registry.add(thread)
        return thread

    def start_all(self, count: int) -> bool:
        """Create ``count`` threads, then start them unless the client closed meanwhile."""
        # Create every thread before starting any, so the client cannot look RUNNING with only the first.
        threads = [self.create() for _ in range(count)]
        with self._state.lock:
            if self._state.state is not ClientState.REBALANCING:
                # Closed meanwhile (a state listener or another thread called close()).
                for thread in threads:
                    self._registry.remove(thread)
                return False
            for thread in threads:
                thread.start()
        return True

    # -- threads at runtime (KIP-663) -------------------------------------------------
    def add(self) -> str | None:
        """Start one more stream thread and return its name (None unless RUNNING or REBALANCING)."""
        with self._registry.lock:
            if not self._state.state.is_running_or_rebalancing():
                self._log.warning("Cannot add a stream thread in state %s", self._state.state.name)
                return None
            thread = self.create()
            share = self.resize_caches()
            self._log.info("Adding %s; %d live threads, cache size per thread %d",
                           thread.name, len(self._registry.alive()), share)
        with self._state.lock:
            # close() changes the state under this lock before it lists the threads
            # to shut down, so a thread started here is always on that list.
            if self._state.state.is_running_or_rebalancing():
                thread.start()
                return thread.name
        # The client stopped meanwhile: take the thread back out.
        self._registry.remove(thread)
        self.resize_caches()
        return None

    def _on_membership_change(self, changed: StreamThread) -> None:
        """A thread started a join or left the group: each other thread looks, on its own loop,
        whether that makes its generation stale (``streamloop.tasks.membership``), and rejoins now
        rather than at its next heartbeat. Never waits for their loops."""
        for thread in self._registry.alive():
            if thread is not changed:
                thread.check_generation()

    def remove(self, timeout: float | None) -> str | None:
        """Shut down one alive stream thread; see ``KafkaStreams.remove_stream_thread``."""
        if not self._state.state.is_running_or_rebalancing():
            self._log.warning("Cannot remove a stream thread in state %s", self._state.state.name)
            return None
        started = time.monotonic()
        current = self._registry.current()
        # The choice is the victim's own state machine: moving it to PENDING_SHUTDOWN claims it,
        # so two removals never pick the same thread, and no registry lock is held while the
        # victim's loop is reached (that loop may be waiting for the registry itself).
        started_threads = [t for t in self._registry.alive() if t.state.state is not StreamThreadState.CREATED]
        candidates = [t for t in started_threads if t is not current] + [t for t in started_threads if t is current]
        victim = next((t for t in candidates if t.state.maybe_transition_to(StreamThreadState.PENDING_SHUTDOWN)),
                      None)
        if victim is None:
            return None
        victim.shutdown(leave_group=True)  # never waits for the victim's loop
        self._log.info("Removing %s; cache size per thread %d", victim.name, self.resize_caches())
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
        self._registry.remove(victim)
        return victim.name

    # -- shut down ----------------------------------------------------------------------
    def request_shutdown_all(self, leave_group: bool) -> list[StreamThread]:
        """Ask every thread to stop (never waits); the threads asked."""
        threads = self._registry.snapshot()
        for thread in threads:
            thread.shutdown(leave_group=leave_group)
        return threads

    def shut_down_all(self, leave_group: bool, limit: float | None) -> None:
        """Ask every thread to stop, then wait for each (at most ``limit`` s in all)."""
        deadline = None if limit is None else time.monotonic() + limit
        threads = self.request_shutdown_all(leave_group)
        for thread in threads:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not thread.join(remaining) and not thread.is_current:
                self._log.warning("%s did not stop within error.shutdown.timeout.ms", thread.name)
        self._registry.trim_dead()

    # -- thread callbacks (run on stream threads) ---------------------------------------
    def _on_thread_state(self, thread: StreamThread, old: StreamThreadState, new: StreamThreadState) -> None:
        if new in (StreamThreadState.PARTITIONS_REVOKED, StreamThreadState.PARTITIONS_ASSIGNED):
            if self._state.state is ClientState.RUNNING:
                self._state.maybe_transition_to(ClientState.REBALANCING)
        elif new in (StreamThreadState.RUNNING, StreamThreadState.DEAD, StreamThreadState.PENDING_SHUTDOWN):
            if new is StreamThreadState.DEAD:
                self._registry.remove(thread)
            elif new is StreamThreadState.PENDING_SHUTDOWN and not self._state.state.is_closing():
                # A thread on its way out (removed, or failed whatever the handler answers)
                # gives its cache share to the alive ones: they always split the total.
                self.resize_caches()
            self.maybe_set_running()

    def maybe_set_running(self) -> None:
        """RUNNING once every thread runs or is dead (a thread shutting down is fine if another runs)."""
        with self._state.lock:
            if self._state.state is not ClientState.REBALANCING:
                return
            states = [t.state.state for t in self._registry.snapshot()]
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
        with self._registry.lock:
            self._registry.failed_threads += 1
        if isinstance(exc, (KeyboardInterrupt, SystemExit)) or self._state.state.is_closing():
            return
        response = self.supervisor.on_failure(thread, exc)
        if response is StreamThreadExceptionResponse.SHUTDOWN_THREAD:
            self.dead_threads.append((thread.name, f"{type(exc).__name__}: {exc}"))

    def _on_thread_shut_down_by_handler(self, thread: StreamThread) -> None:
        if not any(t.is_alive for t in self._registry.snapshot() if t is not thread):
            self._log.error("All stream threads have died. The instance will be in error state")
            self._close_to_error()

    def _request_application_shutdown(self, thread: StreamThread) -> None:
        """Ask every instance to shut down through the group protocol (the assignor's error code).

        Someone has to rejoin to carry the request: with no other live thread, add one.
        """
        carriers = [t for t in self._registry.alive() if t is not thread]
        if not carriers and thread.can_carry_shutdown_request():
            # The failing thread is still a member: it rejoins with the request itself before it
            # leaves, so no rebalance can hand its task to another instance in between.
            thread.carry_shutdown_request_on_exit()
            return
        if not carriers:
            # As add(), but flagged before it starts: a first join without the
            # request could win an ordinary assignment, the failed task included.
            with self._registry.lock:
                carrier = self.create() if self._state.state.is_running_or_rebalancing() else None
                if carrier is not None:
                    carrier.request_application_shutdown()
                    self.resize_caches()
                    self._log.info("Adding %s to carry the application shutdown request", carrier.name)
            if carrier is not None and self._state.state.is_running_or_rebalancing():
                carrier.start()
                return
            if carrier is not None:
                self._registry.remove(carrier)
                self.resize_caches()
        if not carriers:
            self._log.error("No stream thread can carry the application shutdown request; shutting down this client")
            self._close_to_error()
            return
        for carrier in carriers:
            carrier.request_application_shutdown()
