"""``TaskManager``: turns assignments into running tasks and revocations into closed ones.

It owns the maps from task id and from partition to task, feeds fetched records
to their task, applies back-pressure per partition (fetching from a partition
pauses while its task holds ``buffered.records.per.partition`` records), and
closes tasks cleanly (finish the record in flight, flush, commit) or dirtily
(no commit, after a failure). Starting tasks again from their last commit after a
failure is ``streamloop.tasks.revival``, built on these open and close steps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from streamloop import config as cfg
from streamloop.collector import RecordCollector
from streamloop.commit import CommitProtocol, CommitResult, CommitStatus
from streamloop.errors import ProduceError, TaskCorruptedError, TaskMigratedError
from streamloop.ids import TaskId
from streamloop.logcontext import LogContext
from streamloop.metrics import ProcessMeter
from streamloop.processors.context import TaskContext
from streamloop.records import ConsumerRecord, TopicPartition
from streamloop.recovery import ProducerLost, TaskCorrupted, TaskMigrated
from streamloop.serdes import Serde
from streamloop.spark.kafka_source import executor_options
from streamloop.state.task_state import StateSettings
from streamloop.stray_cancel import bounded
from streamloop.timestamps import TimestampExtractor
from streamloop.topology.topology import Topology
from streamloop.transport.base import Consumer, Producer

from .backpressure import BackPressure
from .bulk_exec import ExecutorReads
from .bulk_jobs import StageJobs
from .error_handling import ErrorHandling
from .expiry import schedule_expiry
from .loops import InFlightPlan
from .partition_group import IdleRule
from .range_jobs import RangeJobs
from .record_slots import ContextualForwarder, HeldCollector
from .revival import TaskRevival
from .setup import Committed, ExactlyOnceTask, TaskSetup, task_state
from .task import StreamTask
from .timeouts import TaskTimer, is_timeout

if TYPE_CHECKING:
    from streamloop.spark.session import SparkSessions

    from .tracing import Tracing


@dataclass(frozen=True)
class ExactlyOnce:
    """What the task manager needs under exactly-once: a (not started) transactional producer per task."""

    producer: Callable[[TaskId], Producer]


class TaskManager:
    """Caller: the stream thread's loop only (poll loop and rebalance listener)."""

    def __init__(
        self,
        application_id: str,
        topology: Topology,
        consumer: Consumer,
        collector: RecordCollector,
        committer: CommitProtocol,
        spawn: Callable[[StreamTask], None],
        logger: LogContext,
        clock_ms: Callable[[], int],
        key_serde: Serde,
        value_serde: Serde,
        buffered_per_partition: int,
        timer_factory: Callable[[TaskId, LogContext], TaskTimer] | None = None,
        monotonic_ms: Callable[[], int] | None = None,
        errors: ErrorHandling | None = None,
        on_tasks_changed: Callable[[], None] = lambda: None,
        threads_per_task: int = 1,
        ordering: str = "partition",
        state: StateSettings | None = None,
        config: Mapping[str, Any] | None = None,
        spark: SparkSessions | None = None,
        exactly_once: ExactlyOnce | None = None,
        timestamp_extractor: TimestampExtractor | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self._application_id = application_id
        self._topology = topology
        self._consumer = consumer
        self._collector = collector
        self._committer = committer
        # One commit at a time, and none while tasks close: the poll loop commits beside its polls
        # (``ThreadLoop``), and a revocation or a shutdown closes tasks meanwhile.
        self._commit_lock = anyio.Lock()
        self._spawn = spawn
        self._log = logger
        self._clock_ms = clock_ms
        self._key_serde = key_serde
        self._value_serde = value_serde
        self._timestamp_extractor = timestamp_extractor
        self._timer_factory = timer_factory
        self._errors = errors
        self._threads_per_task = threads_per_task
        self._ordering = ordering
        self._on_tasks_changed = on_tasks_changed
        self._last_logged: list[str] = []
        self._config = config
        self._spark = spark
        self._monotonic_ms = monotonic_ms
        self._state = state
        self._eos = exactly_once
        self._tracing = tracing
        # What the thread must recover from (a failed transaction, lost output), found here or in a
        # commit; the poll loop drains it between polls (``TaskRevival.recover``).
        self.recovery = committer.recovery
        self.tasks: dict[TaskId, StreamTask] = {}
        # Counts of tasks already closed, so the thread's totals survive rebalances.
        self.closed_processed = 0
        self.closed_timeouts = 0
        # Shared by every task of the thread (they all run on its loop): the windowed metrics' input.
        self.meter = ProcessMeter()
        # Spark jobs by stage, shared by the thread's tasks on the bulk path (streamloop.tasks.bulk_jobs).
        self.spark_jobs: dict[str, StageJobs] = {}
        self.range_jobs: dict[str, RangeJobs] = {}  # the same for stages reading on the executors
        self._by_partition: dict[TopicPartition, StreamTask] = {}
        self._pressure = BackPressure(consumer, buffered_per_partition, self._by_partition.get)
        self.shut_down = False
        # Starts tasks again from their last commit after lost output or a failed transaction: the poll
        # loop calls it between polls (streamloop.tasks.revival).
        self.revival = TaskRevival(self, consumer, logger, monotonic_ms, on_tasks_changed)

    # -- assignment -------------------------------------------------------------
    def task_id_of(self, tp: TopicPartition) -> TaskId:
        return TaskId(self._topology.subtopology_of(tp.topic).id, tp.partition)

    def handle_assignment(self, partitions: Iterable[TopicPartition],
                          timers: Mapping[TaskId, TaskTimer] | None = None) -> list[StreamTask]:
        """Create and start a task for each newly assigned group of partitions; ``timers``: the
        KIP-572 timers of revived tasks, which carry over to the tasks created again."""
        if self.shut_down:
            # The consumer's close may finish a rebalance and report an assignment: the
            # thread is past its tasks' shutdown, so they would start on a closed consumer.
            self._log.debug("Ignoring an assignment after shutdown: %s", sorted(map(str, partitions)))
            return []
        grouped: dict[TaskId, list[TopicPartition]] = {}
        for tp in partitions:
            tp = TopicPartition(tp.topic, tp.partition)
            if tp in self._by_partition:
                continue
            grouped.setdefault(self.task_id_of(tp), []).append(tp)
        created = []
        for task_id, tps in sorted(grouped.items()):
            if task_id in self.tasks:
                raise RuntimeError(f"Task {task_id} got partitions {tps} it did not have before")
            task = self._create(task_id, tps, (timers or {}).get(task_id))
            self.tasks[task_id] = task
            for tp in tps:
                self._by_partition[tp] = task
            created.append(task)
            # A partition kept through a cooperative rebalance may still be paused from a task closed
            # before it (``TaskRevival._hold_at_commit``); a new task fetches it.
            held = self._consumer.paused().intersection(tps)
            if held:
                self._consumer.resume(*held)
            self._spawn(task)
        if created:
            self._log.debug("Created tasks %s", [str(t.id) for t in created])
        # The one INFO line of a rebalance on this thread, when its tasks changed (a cooperative
        # rebalance often leaves them as they were, and a task moves in two rebalances).
        assigned = [str(task_id) for task_id in sorted(self.tasks)]
        level = logging.INFO if assigned != self._last_logged else logging.DEBUG
        self._last_logged = assigned
        self._log.log(level, "Assigned tasks %s", assigned)
        return created

    def _create(self, task_id: TaskId, partitions: Sequence[TopicPartition],
                timer: TaskTimer | None = None) -> StreamTask:
        """The task, complete: its graph and everything decided for it here (``TaskSetup``)."""
        context = TaskContext(self._application_id, task_id, self._clock_ms, self._spark)
        if self._state is not None:
            context.global_stores = self._state.global_stores
        own = self._collector
        if self._eos is not None:
            # The task's own transactional producer: its output, changelog writes and offsets
            # commit together (streamloop.commit.exactly_once).
            own = self._collector.sibling(self._eos.producer(task_id))
        collector: RecordCollector | HeldCollector = own
        concurrency, ordering = self._topology.concurrency_of(task_id.subtopology, self._config)
        limit = self._threads_per_task if concurrency is None else concurrency
        in_flight = None
        if limit > 1:
            # Each record in flight gets its own forwarding state, journal and held output (under
            # exactly-once its changelog updates and dead letters too, until the commit's watermark
            # covers it: streamloop.tasks.in_flight).
            context.forwarder = ContextualForwarder()
            collector = HeldCollector(own, hold_all=self._eos is not None)
            in_flight = InFlightPlan(limit, ordering or self._ordering, collector)
        tracing = self._tracing.task(task_id) if self._tracing is not None else None
        builders = self._topology.stores_of(task_id.subtopology)
        state = None
        if builders:
            if self._state is None:
                raise RuntimeError("the topology has state stores but the task manager has no state settings")
            state = task_state(self._state, self._application_id, task_id, builders, context, (
                self._key_serde, self._value_serde), collector.append_raw, in_flight is not None,
                self._log.child(f"task [{task_id}] "), tracing)
        # The sinks' collector: with tracing, each record leaves with its span's traceparent.
        sinks = collector if tracing is None else tracing.collector(collector)
        try:
            graph = self._topology.build_task_graph(
                task_id.subtopology, context, sinks, self._key_serde, self._value_serde,  # type: ignore[arg-type]  # a HeldCollector stands in for the RecordCollector
                state, self._timestamp_extractor,
            )
        except BaseException:
            if state is not None:
                state.close(clean=False)
            raise
        holder: list[StreamTask] = []
        restore = None
        if state is not None:
            settings = self._state
            inputs = sorted(partitions)
            schedule_expiry(state, context, lambda: holder[0] if holder else None)

            async def restore(committed: Committed) -> None:
                assert settings is not None  # a task has stores only with state settings
                await state.restore(self._consumer, settings.reader_factory, inputs, settings.restore_listener,
                                    holder[0].input.first_offset, committed)
        exactly_once = None
        if self._eos is not None:
            exactly_once = ExactlyOnceTask(
                collector=collector,  # type: ignore[arg-type]  # a HeldCollector stands in for the RecordCollector
                start=own.producer.start,
                rewind=lambda committed: self._rewind(holder[0], committed),
                on_failed=self._transaction_failed)
        if timer is None and self._timer_factory is not None:
            timer = self._timer_factory(task_id, self._log.child(f"task [{task_id}] "))
        setup = TaskSetup(
            errors=self._errors, meter=self.meter, timer=timer, on_pause=self._on_pause, state=state,
            restore=restore, committed=self._consumer.committed, exactly_once=exactly_once,
            in_flight=in_flight, spark_jobs=self.spark_jobs, tracing=tracing,
            executor_reads=self._executor_reads(), idle=self._idle_rule())
        send_buffered = self._after_chunk if self._eos is None else (lambda: self._after_chunk(own, task_id))
        task = StreamTask(task_id, partitions, graph, context, send_buffered, self._log, self._clock_ms,
                          setup, self._monotonic_ms)
        holder.append(task)  # what its restore and rewind act on, once it exists
        return task

    def _idle_rule(self) -> IdleRule | None:
        """max.task.idle.ms (without a config, as in a unit test: never wait)."""
        if self._config is None:
            return None
        return IdleRule(int(self._config.get(cfg.MAX_TASK_IDLE_MS, 0)), self._consumer.fetched_lag)

    def _executor_reads(self) -> ExecutorReads | None:
        """The consumer's side of a Spark stage reading on the executors (``streamloop.tasks.bulk_exec``);
        the options the executors' readers take exist only on the Kafka transport."""
        if self._spark is None:
            return None
        consumer = self._consumer
        options = getattr(consumer, "options", None)
        return ExecutorReads(pause=lambda tp: consumer.pause(tp), position=consumer.position,
                             end_offsets=consumer.end_offsets,
                             options=None if options is None else executor_options(options),
                             shared=self.range_jobs)

    def _rewind(self, task: StreamTask, committed: Committed) -> None:
        """Exactly-once, once the task's producer started (which aborted a previous owner's open
        transaction, or completed its commit, and fenced that owner): each partition goes back to
        the commit read after that point, and the records fetched before it are dropped."""
        for tp, om in sorted(committed.items()):
            if om is not None:
                self._consumer.seek(tp, om.offset)
                task.input.discard(tp)
                # No chunk may ever run to resume it: the task can be idle from now on.
                self._pressure.release(tp)

    def collector_of(self, task_id: TaskId) -> RecordCollector | None:
        """The collector of a task's own producer under exactly-once (for its dead letters)."""
        task = self.tasks.get(task_id)
        return None if task is None else task.collector

    # -- PAUSE / resume ------------------------------------------------------------
    def _on_pause(self, task: StreamTask) -> None:
        """Stop fetching the task's partitions; it stays assigned (and keeps polling alive)."""
        self._consumer.pause(*task.partitions)
        self._pressure.forget(task.partitions)
        self._on_tasks_changed()

    async def resume(self, task_id: TaskId, skip: bool) -> bool:
        """Run a PAUSED task again from the failed record (or past it with ``skip``).

        Returns False, doing nothing, when the task is not here or not paused.
        """
        task = self.tasks.get(task_id)
        if task is None or not task.is_paused:
            return False
        # Not under the task's ``processing`` lock: a wall-clock punctuation of the paused task holds
        # it, and may be the caller (awaiting ``resume_async``). Nothing here awaits, so no record or
        # commit step of the task runs in between.
        # From the paused record and from the records the pause dropped, not from the positions:
        # those are lower while records are in flight, which finish on their own (read again, they
        # would run and leave twice).
        for tp, position in sorted(task.resume_offsets(skip).items()):
            self._consumer.seek(tp, position)
        task.resume(skip)
        self._consumer.resume(*task.partitions)
        self._log.info("Resumed task %s%s", task_id, " past the failed record" if skip else "")
        self._on_tasks_changed()
        return True

    async def handle_revocation(self, partitions: Iterable[TopicPartition], timeout: float) -> None:  # noqa: ASYNC109
        """Close the tasks of revoked partitions cleanly: finish, flush, commit, close."""
        revoked = {self._by_partition[tp] for tp in map(_tp, partitions) if tp in self._by_partition}
        if revoked:
            await self.close_tasks(revoked, clean=True, timeout=timeout)

    # The ``timeout`` parameters here (ASYNC109) are one budget spread over several waits (each task's
    # record, each producer's shielded close), not a single scope a caller could put around the call.
    async def close_tasks(self, tasks: Iterable[StreamTask], clean: bool, timeout: float) -> None:  # noqa: ASYNC109
        tasks = sorted(tasks, key=lambda t: t.id)
        for task in tasks:
            task.request_close()
        deadline = time.monotonic() + timeout
        for task in tasks:
            if task.finished.is_set():
                continue
            with anyio.move_on_after(max(0.0, deadline - time.monotonic())):
                await task.finished.wait()
            if not task.finished.is_set():
                self._log.warning("Task %s did not finish its record within %.1f s; closing it dirty",
                                  task.id, timeout)
                clean = False
                if task.cancel_scope is not None:
                    task.cancel_scope.cancel()
        async with self._commit_lock:  # a commit under way finishes first; none starts until they are closed
            try:
                if clean:
                    try:
                        # Deferred, timed out or refused: nothing of it is committed, the tasks' state is
                        # ahead, and the next owner starts from the last successful commit.
                        clean = (await self._committer.commit(tasks)).done
                        if clean:
                            await self._committer.checkpoint(
                                [t for t in tasks if t.transaction_error is None and t.stores_restored])
                    except BaseException:
                        clean = False
                        raise
            finally:
                # Whatever the commit did, the stores close (and release their files) here.
                released: list[TopicPartition] = []
                restart: dict[TopicPartition, int] = {}
                for task in tasks:
                    restart.update(task.restart_offsets())
                    task_clean = clean and task.transaction_error is None
                    # A task an error handler PAUSED has its partitions paused in the consumer too: a
                    # revived task (created again, RUNNING) must fetch them again.
                    handler_paused = task.is_paused
                    task.close(task_clean)
                    if self._eos is not None:
                        await self._release_producer(task, task_clean, timeout)
                    self.closed_processed += task.processed
                    self.closed_timeouts += task.timeouts
                    self.tasks.pop(task.id, None)
                    for tp in task.partitions:
                        self._by_partition.pop(tp, None)
                        if self._pressure.drop(tp) or handler_paused:
                            released.append(tp)
                self._rewind_kept(restart)
                self._resume_released(released)
        self._log.log(logging.DEBUG if clean else logging.INFO, "Closed tasks %s %s", [str(t.id) for t in tasks],
                      "cleanly" if clean else "dirty")

    def _rewind_kept(self, restart: dict[TopicPartition, int]) -> None:
        """Partitions of closed tasks that stay assigned (a cooperative rebalance that changed a
        task's partitions, a revival) go back to where the closed tasks stopped: the task created
        again on them reads on from the consumer's position, which is past the records fetched but
        not processed (lost, under at-least-once, with their offsets committed past them)."""
        if self.shut_down:
            return
        assigned = self._consumer.assignment()
        for tp, offset in sorted(restart.items()):
            if tp in assigned:
                self._consumer.seek(tp, offset)

    def _resume_released(self, partitions: list[TopicPartition]) -> None:
        """Resume fetching partitions that back-pressure or a PAUSE answer paused for a task now
        closed, if they stay assigned (a task revived from its last commit after an outage): nothing
        else tracks their pause any more, so they would stay paused for good while the client looks
        RUNNING."""
        assigned = self._consumer.assignment()
        kept = [tp for tp in partitions if tp in assigned]
        if kept:
            self._consumer.resume(*kept)
            self._log.debug("Resumed fetching %s, paused for a closed task",
                            sorted(map(str, kept)))

    async def _release_producer(self, task: StreamTask, clean: bool, timeout: float) -> None:  # noqa: ASYNC109
        """Exactly-once: abort a dirty task's transaction, close its producer."""
        producer = task.collector.producer if task.collector is not None else None
        # Its stores dropped the aborted transaction's writes when they closed (they were held until
        # a commit: streamloop.state.uncommitted); the disk and its checkpoint are the last commit's.
        if not clean and producer is not None:
            try:
                await producer.abort_transaction()  # type: ignore[attr-defined]  # an exactly-once producer
            except Exception as exc:  # fenced or unreachable: the next owner aborts it
                self._log.warning("Could not abort the transaction of task %s: %s", task.id, exc)
        if producer is not None:
            # Shielded and bounded: a cancellation (the thread failing meanwhile) must not skip the
            # close, which asyncio.wait_for does when cancelled before the close started.
            try:
                with bounded(timeout, f"closing the producer of task {task.id}", shield=True) as scope:
                    await producer.close()
                if scope.cancelled_caught:
                    self._log.warning("Closing the producer of task %s did not finish within %.1f s", task.id, timeout)
            except Exception as exc:  # closing must go on
                self._log.warning("Closing the producer of task %s failed: %s", task.id, exc)

    async def shutdown(self, clean: bool, timeout: float) -> None:  # noqa: ASYNC109
        self.shut_down = True
        await self.close_tasks(list(self.tasks.values()), clean=clean, timeout=timeout)

    # -- records ----------------------------------------------------------------
    def add_records(self, fetched: Mapping[TopicPartition, Sequence[ConsumerRecord]]) -> int:
        total = 0
        for tp, records in fetched.items():
            task = self._by_partition.get(tp)
            if task is None or not records:
                continue  # fetched just before a revocation; the new owner reads it again
            total += self._pressure.add(tp, task, records)
        return total

    async def _after_chunk(self, collector: RecordCollector | None = None, task_id: TaskId | None = None) -> None:
        self._pressure.release_ready()
        if collector is not None:
            if collector.buffered():
                try:
                    await collector.send_buffered()
                except ProduceError as exc:
                    if not is_timeout(exc):
                        raise
                    raise TaskCorruptedError(task_id, f"sending its output timed out: {exc}") from exc
            return
        if self._collector.buffered():
            try:
                await self._collector.send_buffered()
            except ProduceError as exc:
                if not is_timeout(exc):
                    raise
                # Output is lost: the stream thread revives every task from its last commit.
                self.recovery.report(ProducerLost(exc))

    def _transaction_failed(self, task: StreamTask) -> None:
        """Exactly-once: a task's transaction failed; the poll loop revives (or migrates) it."""
        error = task.transaction_error
        if isinstance(error, TaskMigratedError):
            self.recovery.report(TaskMigrated(task, error))
        elif error is not None:
            self.recovery.report(TaskCorrupted(task, error))

    @property
    def commits(self) -> int:
        return self._committer.commits

    def commit_due(self) -> bool:
        """The commit interval passed, or a processor asked for a commit."""
        return self._committer.due(self.tasks.values())

    async def maybe_commit(self) -> CommitResult:
        async with self._commit_lock:
            result = await self._committer.maybe_commit(self.tasks.values())
        if result.status is CommitStatus.REFUSED:
            # The group moved to a generation this member is not in (yet). Its tasks keep their
            # state: a rebalance revokes (eager) or keeps (cooperative) them, and a later commit
            # covers what this one would have. Kafka Streams rejoins too (TaskMigratedException).
            self._log.warning("Periodic commit refused, rejoining the group")
            self._consumer.request_rejoin()
        return result

    async def commit_all(self) -> CommitResult:
        async with self._commit_lock:
            return await self._committer.commit(list(self.tasks.values()))


def _tp(tp: TopicPartition) -> TopicPartition:
    return TopicPartition(tp.topic, tp.partition)
