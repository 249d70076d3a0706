"""``StreamThread``: an OS thread running its own event loop, one consumer, one producer.

This module is the thread's lifecycle: its state machine (``states``), start,
shutdown, join, and the commands other threads send it (rejoin, resume, carry a
shutdown request). What runs on the thread's loop (poll, process, commit, the
rebalance listener) is ``streamloop.threads.loop.ThreadLoop``; what other threads read
about it (metadata, counters, lags) is ``streamloop.threads.view.ThreadView``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import anyio

from streamloop import config as cfg
from streamloop.clock import SYSTEM_CLOCK, Clock
from streamloop.config import StreamsConfig
from streamloop.ids import TaskId
from streamloop.lifecycle import StateMachine
from streamloop.logcontext import thread_log
from streamloop.metrics import SensorSettings, ThreadSensors
from streamloop.state.cache import ThreadCache
from streamloop.state.metadata import StreamsMetadataState
from streamloop.state.restore import StateRestoreListener
from streamloop.state.store import StateStore
from streamloop.state.uncommitted import UncommittedBudget
from streamloop.tasks.assignor import ShutdownRequest, StreamsAssignor
from streamloop.tasks.error_handling import ErrorHandling
from streamloop.tasks.membership import Membership
from streamloop.tasks.standby import replicated
from streamloop.threads.commands import CommandChannel, CommandRejected
from streamloop.threads.loop import LAG_REFRESH_MS, ThreadLoop, unwrap
from streamloop.threads.rebalances import ThreadRebalances
from streamloop.threads.states import THREAD_TRANSITIONS, StreamThreadState
from streamloop.threads.view import TaskDetails, TaskMetadata, TaskRunState, ThreadMetadata, ThreadView
from streamloop.topology.topology import Topology
from streamloop.transport import lost_connections
from streamloop.transport.base import Transport

if TYPE_CHECKING:
    from streamloop.spark.session import SparkSessions

__all__ = [
    "LAG_REFRESH_MS",
    "THREAD_TRANSITIONS",
    "FailureHandler",
    "StateListener",
    "StreamThread",
    "StreamThreadState",
    "TaskDetails",
    "TaskMetadata",
    "TaskRunState",
    "ThreadMetadata",
]

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
        siblings: Callable[[], list[StreamThread]] = list,
        on_membership_change: Callable[[StreamThread], None] = lambda _thread: None,
        watch_rebalancing: Callable[[], None] = lambda: None,
        metadata: StreamsMetadataState | None = None,
    ) -> None:
        self.index = index
        self.name = f"{client_id}-StreamThread-{index}"
        # This thread as its siblings see it in the group (``streamloop.tasks.membership``).
        self.membership = Membership(self.name)
        # The client's threads (this one included), and whom to tell when this thread starts a
        # join or leaves the group: its siblings then look whether their generation is stale.
        self.siblings = siblings
        self.on_membership_change = on_membership_change
        # Called on every loop turn: the client's warning when it stays REBALANCING too long.
        self.watch_rebalancing = watch_rebalancing
        self.rebalances = ThreadRebalances(self.name, clock.monotonic_ms)
        self.on_shutdown_requested = on_shutdown_requested
        self.spark = spark
        self.config = config
        self.topology = topology
        self.transport = transport
        self.clock = clock
        self.process_id = process_id
        self.restore_listener = restore_listener
        # The client's global tables' stores, read by every task (set by ClientThreads before start).
        self.global_stores: Mapping[str, StateStore] = {}
        self.log = thread_log(__name__, self.name)
        self.state = StateMachine(f"stream-thread [{self.name}]", StreamThreadState.CREATED,
                                  THREAD_TRANSITIONS, self.log, logging.DEBUG)
        self.state.add_listener(lambda old, new: on_state_change(self, old, new))
        self._on_failure = on_failure
        self.commands = CommandChannel(f"stream thread {self.name}")
        self._os_thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self.leave_group = True
        self.cache_size = cache_size
        # The record cache of this thread's tasks' stores: its share of cache.max.bytes.buffering.
        self.cache = ThreadCache(cache_size)
        # Its share of statestore.uncommitted.max.bytes (set with the cache's, ``resize_caches``).
        self.uncommitted = UncommittedBudget(config[cfg.STATESTORE_UNCOMMITTED_MAX_BYTES])
        self.error: BaseException | None = None
        # The client's metadata of queries across instances: each assignment updates it.
        self.assignor = StreamsAssignor(
            topology, process_id, self.name, config[cfg.APPLICATION_SERVER], metadata,
            config[cfg.NUM_STANDBY_REPLICAS], replicated(topology, config[cfg.DEFAULT_DSL_STORE] == "rocksDB"),
            cooperative=config[cfg.REBALANCE_PROTOCOL] == cfg.COOPERATIVE, membership=self.membership)
        self.consumer_client_id = f"{self.name}-consumer"
        self.producer_client_id = f"{self.name}-producer"
        self.view = ThreadView(self.name)
        self._failure_reported = False
        self.sensors = ThreadSensors(
            SensorSettings(config[cfg.METRICS_SAMPLE_WINDOW_MS], config[cfg.METRICS_NUM_SAMPLES]),
            clock.monotonic_ms)
        self._loop = ThreadLoop(self)

    # -- control, from any thread -------------------------------------------------
    def start(self) -> None:
        self.state.transition_to(StreamThreadState.STARTING)
        self._os_thread.start()

    def shutdown(self, leave_group: bool = True) -> None:
        """Ask the thread to finish its records, commit, close its tasks and leave the group."""
        self.leave_group = leave_group
        # The state is the request: the loop stops once it sees PENDING_SHUTDOWN (a thread removed
        # by the client is there already). The wake only cuts a poll in progress short.
        self.state.maybe_transition_to(StreamThreadState.PENDING_SHUTDOWN)
        # Rejected when not looping yet, or already past the loop: it sees the state.
        with contextlib.suppress(CommandRejected):
            self.commands.submit(self._loop.wake)

    def request_application_shutdown(self) -> None:
        """Carry a SHUTDOWN_APPLICATION request to the group leader (KIP-671).

        The flag goes into this member's subscription; the rejoin makes the
        leader see it and answer every member of every instance with the error.
        """
        self.assignor.shutdown = ShutdownRequest.ASKED
        with contextlib.suppress(CommandRejected):  # not running yet: its first join carries the flag
            self.commands.submit(self._loop.rejoin, "to carry the application shutdown request")

    def can_carry_shutdown_request(self) -> bool:
        """Whether this (failing) thread's consumer is in the group and its loop still runs."""
        return self._loop.consumer is not None and self.commands.on_loop_thread

    def carry_shutdown_request_on_exit(self) -> None:
        """Set by the client, from this failing thread's handler: it rejoins with the request before it leaves."""
        self.assignor.shutdown = ShutdownRequest.CARRIED_ON_EXIT

    def check_generation(self) -> None:
        """A sibling started a join or left the group: rejoin if that makes this thread's generation
        stale (from any thread; never waits)."""
        with contextlib.suppress(CommandRejected):  # not polling yet (it joins anyway) or stopped
            self.commands.submit(self._loop.check_generation)

    def resume_task(self, task_id: TaskId, skip: bool) -> bool:
        """Resume a PAUSED task of this thread (loop-safe). From this thread's own loop the
        resume is scheduled and the answer is whether the task was paused."""
        if not any(t.task_id == task_id and not t.is_running for t in self.view.active):
            return False
        if self.commands.on_loop_thread:
            self.commands.submit(self._loop.resume, task_id, skip)
            return True
        try:
            return self.commands.call(self._loop.resume, task_id, skip)
        except CommandRejected:
            return False

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

    # -- read from any thread (see ThreadView) ---------------------------------------------
    @property
    def errors(self) -> ErrorHandling | None:
        """The thread's error handling (its dropped/paused counts), once its loop has started."""
        return self._loop.errors

    def local_stores(self, name: str) -> list[StateStore]:
        """This thread's running tasks' instances of store ``name`` (for interactive queries)."""
        return self.view.local_stores(name)

    def counters(self) -> dict[str, float]:
        """Running totals for metrics; safe to read from any thread (plain int reads)."""
        return self.view.counters(self.cache.size_bytes, self.cache.evictions)

    def task_counters(self) -> list[tuple[TaskId, dict[str, float]]]:
        return self.view.task_counters()

    def task_lags(self) -> dict[TaskId, int]:
        return self.view.task_lags()

    def task_details(self) -> list[TaskDetails]:
        return self.view.task_details(self.clock.monotonic_ms())

    def metadata(self) -> ThreadMetadata:
        return ThreadMetadata(self.name, self.state.state, self.view.active, self.consumer_client_id,
                              self.producer_client_id, self.cache_size, self.view.standby)

    # -- the OS thread ------------------------------------------------------------
    def _main(self) -> None:
        try:
            anyio.run(self._run, backend="asyncio")
        except BaseException as exc:  # every death is reported to the client
            if self.error is None:
                self.error = exc  # the loop itself broke (``_run`` unwraps what the body raised)
        if self.error is not None and not self._failure_reported:
            # Failed before its loop could report it (e.g. the loop itself broke).
            self.report_failure(self.error)
        self.state.maybe_transition_to(StreamThreadState.PENDING_SHUTDOWN)
        self.state.transition_to(StreamThreadState.DEAD)
        self.log.info("Shutdown complete")

    async def _run(self) -> None:
        try:
            await self._loop.run()
        except BaseException as exc:
            # Unwrapped here, on the loop, where anyio knows which exception is cancellation.
            self.error = unwrap(exc)
            raise
        finally:
            # A connection its client lost track of (a failed start or request) is collected
            # while this loop still runs, so that it closes its socket; only if there may be one.
            lost_connections.collect()

    def report_failure(self, error: BaseException) -> None:
        """Log the death and let the client's uncaught-exception handler decide (once).

        Caller: the loop's clean-up (on this thread, before the clients close), or ``_main``."""
        self._failure_reported = True
        # The one log of a failed record's traceback: handlers answering FAIL and the supervisor do not repeat it.
        self.log.error("Encountered the following exception during processing and the thread is "
                       "going to shut down: %s", error, exc_info=error)
        self.state.maybe_transition_to(StreamThreadState.PENDING_SHUTDOWN)
        try:
            self._on_failure(self, error)
        except BaseException:
            self.log.exception("The failure handler raised")
