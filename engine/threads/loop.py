"""A stream thread's body, on its own event loop: poll, hand records to the tasks, commit.

``ThreadLoop.run`` opens the thread's clients (admin, producer, consumer), wires the
task manager, then loops: poll, add the records to their tasks, commit on the
interval, revive a failed producer, refresh the lag metric. Each task runs as its
own coroutine in the thread's task group, so an async processor waiting on I/O in
one task does not hold up the others. The consumer calls the rebalance listener
(``streamloop.threads.listener.GroupListener``, on this loop) to revoke and create
tasks. Next stage: ``streamloop.tasks.manager.TaskManager``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

import anyio
import anyio.abc
from anyio import CancelScope, create_task_group

from streamloop import config as cfg
from streamloop.collector import RecordCollector
from streamloop.commit import EOS_TRANSACTION_TIMEOUT_MS, Committer, TransactionalCommitter, transactional_id
from streamloop.errors import MissingSinkTopicError, MissingSourceTopicError
from streamloop.ids import TaskId
from streamloop.recovery import RecoveryInbox, ShutdownRequested
from streamloop.stray_cancel import StrayCancellationError, bounded, fail_stray, reraise_stray
from streamloop.tasks import wiring
from streamloop.tasks.assignor import ShutdownRequest
from streamloop.tasks.error_handling import ErrorHandling
from streamloop.tasks.manager import ExactlyOnce, TaskManager
from streamloop.tasks.standby import StandbyTask, StandbyTasks
from streamloop.tasks.task import StreamTask
from streamloop.tasks.timeouts import StartupDeadline
from streamloop.threads.beside import BesideJob
from streamloop.threads.listener import GroupListener
from streamloop.threads.states import StreamThreadState
from streamloop.transport.base import Admin, Consumer, ConsumerSettings, Producer, ProducerSettings

if TYPE_CHECKING:
    from streamloop.threads.stream_thread import StreamThread

# How often a thread reads its partitions' log end for the records-lag metric.
LAG_REFRESH_MS = 1_000


class ThreadLoop:
    """Caller: ``StreamThread`` runs ``run`` on its OS thread and sends commands (``wake``,
    ``rejoin``, ``resume``) through its command channel; all of it runs on this loop."""

    def __init__(self, thread: StreamThread) -> None:
        self._thread = thread
        self._config = thread.config
        self._log = thread.log
        self.consumer: Consumer | None = None
        """Set once subscribed: the thread is a group member from then on."""
        self.errors: ErrorHandling | None = None
        self._poll_scope: CancelScope | None = None
        self._task_failure: BaseException | None = None
        # What the poll loop must act on between polls, reported by the tasks, the commits and the
        # rebalance listener (``streamloop.recovery``).
        self.recovery = RecoveryInbox()
        self._next_lag_ms = 0
        config = self._config
        # Called by the consumer in a rebalance; keeps the generation and the joins of this thread.
        self.listener = GroupListener(self, thread)
        self._group: anyio.abc.TaskGroup | None = None
        self.standbys: StandbyTasks | None = None
        self._producer_settings = ProducerSettings(
            client_id=thread.producer_client_id,
            acks=config[cfg.ACKS],
            linger_ms=config[cfg.LINGER_MS],
            batch_size=config[cfg.BATCH_SIZE],
            request_timeout_ms=config[cfg.REQUEST_TIMEOUT_MS],
            retry_backoff_ms=config[cfg.RETRY_BACKOFF_MS],
            extra=config.with_prefix("producer."),
        )

    @property
    def asked_to_stop(self) -> bool:
        return not self._thread.state.state.is_alive()

    # -- commands (run on this loop) ---------------------------------------------------
    async def wake(self) -> None:
        """Cut a poll short: the loop then sees the thread's PENDING_SHUTDOWN."""
        if self._poll_scope is not None:
            self._poll_scope.cancel()

    async def rejoin(self, reason: str) -> None:
        self.listener.request_rejoin(reason)

    async def check_generation(self) -> None:
        """A sibling started a join or left the group (see ``streamloop.tasks.membership``)."""
        self.listener.rejoin_if_stale()

    async def resume(self, task_id: TaskId, skip: bool) -> bool:
        manager = self._thread.view.manager
        return manager is not None and await manager.resume(task_id, skip)

    # -- the run ---------------------------------------------------------------------
    async def run(self) -> None:
        thread = self._thread
        config = self._config
        exactly_once = config[cfg.PROCESSING_GUARANTEE] == cfg.EXACTLY_ONCE_V2
        transport = thread.transport
        consumer = transport.consumer(ConsumerSettings(
            group_id=config[cfg.APPLICATION_ID],
            client_id=thread.consumer_client_id,
            assignor=thread.assignor,
            group_instance_id=(f"{config[cfg.GROUP_INSTANCE_ID]}-{thread.index}"
                               if config[cfg.GROUP_INSTANCE_ID] else None),
            auto_offset_reset=config[cfg.AUTO_OFFSET_RESET],
            max_poll_interval_ms=config[cfg.MAX_POLL_INTERVAL_MS],
            session_timeout_ms=config[cfg.SESSION_TIMEOUT_MS],
            heartbeat_interval_ms=config[cfg.HEARTBEAT_INTERVAL_MS],
            request_timeout_ms=config[cfg.REQUEST_TIMEOUT_MS],
            retry_backoff_ms=config[cfg.RETRY_BACKOFF_MS],
            isolation_level="read_committed" if exactly_once else "read_uncommitted",
            cooperative=config[cfg.REBALANCE_PROTOCOL] == cfg.COOPERATIVE,
            extra=config.with_prefix("consumer."),
        ))
        producer = self._producer = transport.producer(self._producer_settings)
        admin = transport.admin(f"{thread.name}-admin")
        started: list[Consumer | Producer | Admin] = []
        clean = False
        body_error: BaseException | None = None
        async with create_task_group() as group:
            self._group = group
            thread.commands.open(group)
            try:
                # Start-up rides out an unreachable broker too, under one task.timeout.ms deadline.
                startup = StartupDeadline(thread.name, config[cfg.TASK_TIMEOUT_MS], config[cfg.RETRY_BACKOFF_MS],
                                          config[cfg.RETRY_BACKOFF_MAX_MS], self._log)
                await startup.run(admin.start, "Starting the admin client")
                started.append(admin)
                sink_partitions = await self._check_topics(admin, startup)
                await startup.run(producer.start, "Starting the producer")
                started.append(producer)
                manager = self._task_manager(consumer, producer, admin, sink_partitions, group, exactly_once)
                topology = thread.topology
                if topology.has_patterns:
                    # One pattern for all sources (streamloop.topology.patterns): new matching topics
                    # come with the consumer's metadata refresh and a rebalance.
                    consumer.subscribe_pattern(topology.subscription_pattern(), self.listener)
                else:
                    consumer.subscribe(topology.source_topics, self.listener)
                self.consumer = consumer
                thread.rebalances.started(0, "first join")
                await startup.run(consumer.start, "Starting the consumer")
                started.append(consumer)
                await self._poll_loop(consumer, manager)
                clean = True
            except BaseException as exc:
                body_error = exc
                raise
            finally:
                with CancelScope(shield=True):
                    failure = self._task_failure or real_error(body_error)
                    if failure is not None:
                        # As in Kafka Streams the handler runs on the failing thread before the
                        # shutdown completes: this member still owns its tasks, so no one else
                        # takes the failed record over meanwhile. It blocks this loop, which only
                        # has a dying thread's clean-up left to do.
                        thread.report_failure(failure)
                        if thread.assignor.shutdown is ShutdownRequest.CARRIED_ON_EXIT and consumer in started:
                            await self._carry_shutdown_request(consumer)
                    if producer in started and self._producer is not producer:
                        started[started.index(producer)] = self._producer
                        producer = self._producer
                    await self._close(consumer, producer, admin, started, clean)
                    thread.commands.close()
                group.cancel_scope.cancel()

    def _task_manager(self, consumer: Consumer, producer: Producer, admin: Admin, sink_partitions: dict[str, int],
                      group: anyio.abc.TaskGroup, exactly_once: bool) -> TaskManager:
        thread = self._thread
        config = self._config
        clock = thread.clock
        collector = self._collector = RecordCollector(producer, sink_partitions, lambda t: self._lookup(admin, t))
        committer_type = TransactionalCommitter if exactly_once else Committer
        committer = committer_type(consumer, collector, config[cfg.COMMIT_INTERVAL_MS], clock.monotonic_ms, self._log,
                                   self.recovery)
        if isinstance(committer, TransactionalCommitter):
            committer.group_id = config[cfg.APPLICATION_ID]
        if self.errors is None:
            self.errors = wiring.error_handling(config, collector)
        errors = self.errors
        state = wiring.state_settings(
            config, config[cfg.STATE_DIR], thread.cache,
            lambda: thread.transport.reader(f"{thread.name}-restore-consumer", read_committed=exactly_once),
            thread.restore_listener, thread.global_stores, thread.uncommitted)
        self.standbys = StandbyTasks(
            config[cfg.APPLICATION_ID], thread.topology, state,
            wiring.default_serde(config, cfg.DEFAULT_KEY_SERDE), wiring.default_serde(config, cfg.DEFAULT_VALUE_SERDE),
            consumer.committed, lambda task: self._spawn_standby(group, task),
            config[cfg.COMMIT_INTERVAL_MS], self._log)
        manager = wiring.task_manager(
            config, thread.topology, consumer, collector, committer,
            spawn=lambda task: self._spawn(group, task),
            logger=self._log, clock_ms=clock.wall_ms, monotonic_ms=clock.monotonic_ms,
            errors=errors,
            state=state,
            on_tasks_changed=self.listener.publish_tasks,
            spark=thread.spark,
            exactly_once=ExactlyOnce(self._task_producer) if exactly_once else None,
        )
        thread.view.manager = manager
        if exactly_once:
            errors.collector_of = manager.collector_of
        return manager

    async def _check_topics(self, admin: Admin, startup: StartupDeadline) -> dict[str, int]:
        topology = self._thread.topology
        counts = await startup.run(
            lambda: admin.partition_counts(topology.required_source_topics + topology.sink_topics),
            "Fetching topic metadata")
        missing = [t for t in topology.required_source_topics if t not in counts]
        if missing:
            raise MissingSourceTopicError(missing)
        missing = [t for t in topology.sink_topics if t not in counts]
        if missing:
            raise MissingSinkTopicError(missing)
        return {t: counts[t] for t in topology.sink_topics}

    @staticmethod
    async def _lookup(admin: Admin, topic: str) -> int | None:
        counts = await admin.partition_counts([topic])
        return counts.get(topic)

    async def _poll_loop(self, consumer: Consumer, manager: TaskManager) -> None:
        poll_ms = self._config[cfg.POLL_MS]
        max_records = self._config[cfg.MAX_POLL_RECORDS]
        view = self._thread.view
        sensors = self._thread.sensors
        assignor = self._thread.assignor
        group = self._group
        assert group is not None
        # Beside the polls (``streamloop.threads.beside``): a commit waits for acks, the group and
        # the changelogs' ends; the lag metric for log ends; a follow-up check for the coordinator.
        commits = BesideJob(functools.partial(self._commit, manager), "commits")
        lags = BesideJob(functools.partial(self._measure_lag, consumer, manager), "lag lookups")
        checks = BesideJob(functools.partial(self._check_group, consumer), "group checks")
        for job in (commits, lags, checks):
            group.start_soon(job.serve, name=f"{self._thread.name} {job.what}")
        while not self.asked_to_stop:
            with CancelScope() as scope:
                self._poll_scope = scope
                # Checked again inside the scope: a shutdown between the two checks cancels it (wake).
                if self.asked_to_stop:
                    break
                records = await consumer.poll(poll_ms, max_records)
                if records:
                    view.records_polled += manager.add_records(records)
                view.polls += 1
            self._poll_scope = None
            self._thread.watch_rebalancing()
            if self.listener.follow_up.due(self._thread.clock.monotonic_ms()):
                checks.request()
            sensors.sample(manager.meter, view.polls, manager.commits)
            if self.recovery and not commits.busy:
                # Recovery closes and reopens tasks and may replace the producer: never under a commit.
                events = self.recovery.drain()
                if any(isinstance(event, ShutdownRequested) for event in events):
                    break
                await manager.revival.recover(events, self._replace_producer,
                                              self._config.seconds(cfg.REQUEST_TIMEOUT_MS))
            if not commits.busy and not self.recovery and manager.commit_due():
                # Records that arrive while the commit waits are fetched and processed meanwhile (the
                # tasks ran beside it already; the poll loop waiting on it held back only what was
                # still to fetch). Not before a pending recovery: its tasks start again from their
                # last commit.
                commits.request()
            if assignor.rejoin_for_endpoint:
                assignor.rejoin_for_endpoint = False
                self._log.info("The group's assignment lacks this instance's application.server: rejoining "
                               "so that every instance learns it")
                self.listener.request_rejoin("so that every instance learns this one's application.server")
            now = self._thread.clock.monotonic_ms()
            if now >= self._next_lag_ms and manager.tasks and lags.request():
                self._next_lag_ms = now + LAG_REFRESH_MS

    async def _commit(self, manager: TaskManager) -> None:
        try:
            await manager.maybe_commit()
        except Exception as exc:
            if self._task_failure is None:
                self._task_failure = unwrap(exc)  # a processor failing in a cache flush, TaskTimeoutError
            raise

    async def _check_group(self, consumer: Consumer) -> None:
        follow_up = self.listener.follow_up
        follow_up.in_flight = True
        try:
            await consumer.check_group()
        finally:
            follow_up.in_flight = False

    async def _measure_lag(self, consumer: Consumer, manager: TaskManager) -> None:
        """Read the log end of the tasks' partitions (at most once a second, beside the polls).

        The lag itself is computed when read (``ThreadView.task_lags``) from these ends and the
        tasks' live positions, so it follows processing at once and does not wait for a commit
        interval. A paused task's lag keeps growing, which is how operators see it.
        """
        # A metric must never hold the loop: the broker answers a ListOffsets request after the
        # fetch in flight on its connection, and under the cooperative protocol a committed-offset
        # request queues behind this member's JoinGroup until the rebalance ends. So it runs beside
        # the polls, one lookup at a time, and gives up after the request timeout.
        tasks = list(manager.tasks.values())
        partitions = [tp for task in tasks for tp in task.partitions]
        try:
            with bounded(self._config.seconds(cfg.REQUEST_TIMEOUT_MS), "the lag metric's lookup") as scope:
                ends = await consumer.end_offsets(partitions)
                for task in tasks:
                    for tp in task.partitions:
                        if task.position(tp) is None and tp not in task.group_committed:
                            committed = await consumer.committed(tp)
                            if committed is not None:
                                task.group_committed[tp] = committed.offset
            if scope.cancelled_caught:
                self._log.debug("The lag metric's offsets did not come within the request timeout; "
                                "read again later")
                return
            self._thread.view.log_ends = ends
        except Exception as exc:  # a metric must never fail the thread
            self._log.debug("Could not read end offsets for the lag metric: %r", exc)

    def _task_producer(self, task_id: TaskId) -> Producer:
        """Exactly-once: a task's own transactional producer (not started)."""
        return self._thread.transport.producer(dataclasses.replace(
            self._producer_settings,
            client_id=f"{self._thread.name}-{task_id}-producer",
            transactional_id=transactional_id(self._config[cfg.APPLICATION_ID], task_id),
            transaction_timeout_ms=EOS_TRANSACTION_TIMEOUT_MS,
        ))

    async def _replace_producer(self) -> None:
        """Swap in a fresh producer; the failed one's unsent records are given up (they are re-made)."""
        collector = self._collector
        old = collector.producer
        new = self._thread.transport.producer(self._producer_settings)
        try:
            await new.start()
        except BaseException:
            await new.close()
            raise
        collector.producer = new
        self._producer = new
        # Shielded: from here on only this call knows the old producer, so a cancellation (the
        # thread failing meanwhile) must not skip its close and leave its connections open.
        try:
            with bounded(self._config.seconds(cfg.REQUEST_TIMEOUT_MS), "closing the failed producer",
                         shield=True) as scope:
                await old.close()
            if scope.cancelled_caught:
                self._log.warning("Closing the failed producer did not finish within request.timeout.ms")
        except Exception:  # the old producer failed already; its close may too
            self._log.warning("Closing the failed producer did not finish cleanly", exc_info=True)

    def _spawn(self, group: anyio.abc.TaskGroup, task: StreamTask) -> None:
        group.start_soon(self._run_task, task, name=f"{self._thread.name} task {task.id}")

    def _spawn_standby(self, group: anyio.abc.TaskGroup, task: StandbyTask) -> None:
        group.start_soon(fail_stray, f"standby task {task.id}", task.run, name=f"{self._thread.name} standby {task.id}")

    async def _run_task(self, task: StreamTask) -> None:
        with CancelScope() as scope:
            task.cancel_scope = scope
            try:
                # A cancellation no scope asked for (a library's own) fails the task, and with it the
                # thread, with its handler asked: never a silent end (streamloop.stray_cancel).
                with reraise_stray(lambda exc: StrayCancellationError(f"task {task.id} was cancelled from inside")):
                    await task.run()
            except Exception as exc:
                if self._task_failure is None:
                    # Records in flight fail inside the task's task group: the handler gets the
                    # first real error, not the group (a failed batch fails all of its records).
                    self._task_failure = unwrap(exc)
                raise

    # -- the end -----------------------------------------------------------------------
    async def _carry_shutdown_request(self, consumer: Consumer) -> None:
        """Rejoin with the SHUTDOWN_APPLICATION request and wait for the leader's answer.

        Caller: this thread's clean-up after a failure. Its tasks are closed dirty if
        revoked meanwhile; the answer makes every instance shut down.
        """
        self.listener.request_rejoin("to carry the application shutdown request")
        clock = self._thread.clock
        deadline = clock.monotonic_ms() + self._config[cfg.ERROR_SHUTDOWN_TIMEOUT_MS]
        while (self._thread.assignor.shutdown is not ShutdownRequest.ANSWERED
               and clock.monotonic_ms() < deadline):
            try:
                await consumer.poll(100, 1)
            except Exception as exc:  # the request is best effort on a dying thread
                self._log.warning("Could not carry the shutdown request: %r", exc)
                return

    async def _close(self, consumer: Consumer, producer: Producer, admin: Admin,
                     started: list[Consumer | Producer | Admin], clean: bool) -> None:
        self._thread.state.maybe_transition_to(StreamThreadState.PENDING_SHUTDOWN)
        manager = self._thread.view.manager
        timeout = self._config.seconds(cfg.REQUEST_TIMEOUT_MS)
        if manager is not None:
            try:
                await manager.shutdown(clean=clean, timeout=timeout)
            except Exception:  # closing must go on
                self._log.exception("Failed to close the tasks cleanly")
        if self.standbys is not None:
            await self.standbys.shutdown()
        self._thread.view.clear_tasks()
        interrupted: BaseException | None = None
        for client in (consumer, producer, admin):
            if client not in started:
                continue
            try:
                if client is consumer:
                    await consumer.close(leave_group=self._thread.leave_group)
                    if self._thread.leave_group:
                        # The siblings whose generation still counts this thread rejoin now.
                        self._thread.membership.left = True
                        self._thread.on_membership_change(self._thread)
                else:
                    await client.close()
            except Exception:
                self._log.exception("Failed to close %s", type(client).__name__)
            except BaseException as exc:  # close the other clients first, then re-raise
                # aiokafka's consumer stop can end in a CancelledError of its own tasks after an outage.
                self._log.warning("Closing %s was interrupted: %r", type(client).__name__, exc)
                interrupted = interrupted or exc
        if interrupted is not None:
            raise interrupted


def real_error(exc: BaseException | None) -> BaseException | None:
    """The error that ended the loop, unless it was only cancellation (a task's failure or a shutdown)."""
    if exc is None:
        return None
    exc = unwrap(exc)
    return None if isinstance(exc, anyio.get_cancelled_exc_class()) else exc


def unwrap(exc: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups from the task group."""
    cancelled = anyio.get_cancelled_exc_class()
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        inner = [e for e in exc.exceptions if not isinstance(e, cancelled)]
        exc = inner[0] if inner else exc.exceptions[0]
    return exc
