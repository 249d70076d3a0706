"""``TaskManager``: assignments become running tasks, revocations closed ones, and back-pressure.

The consumer is a ``RecordingConsumer`` (pause, resume and commit calls); the
``spawn`` callback either runs each task's coroutine on the test's loop or only
keeps the task, so that its records stay buffered.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

import pytest
import pytest_asyncio

from streamloop.clock import ManualClock
from streamloop.collector import RecordCollector
from streamloop.commit import Committer
from streamloop.errors import CommitFailedError, RebalanceInProgressError
from streamloop.ids import TaskId
from streamloop.logcontext import thread_log
from streamloop.processors.api import BaseProcessor
from streamloop.records import FetchedRecord, Headers, Record, TopicPartition
from streamloop.serdes import BytesSerde
from streamloop.tasks.assignor import StreamsAssignor
from streamloop.tasks.manager import ExactlyOnce, TaskManager
from streamloop.tasks.task import StreamTask, TaskState
from streamloop.testing import eventually_async
from streamloop.topology.builder import StreamsBuilder
from streamloop.topology.topology import Topology
from streamloop.transport.base import ConsumerSettings, OffsetAndMetadata, ProducerSettings
from streamloop.transport.memory import MemoryBroker, MemoryTransport

LOG = thread_log(__name__, "app-StreamThread-1")
WAIT = 5.0
A0, A1, B0, B1, C0 = (TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0),
                      TopicPartition("b", 1), TopicPartition("c", 0))


@dataclass
class RecordingConsumer:
    """The consumer calls the manager makes: pause, resume and (through the committer) commit."""

    manager: TaskManager | None = None
    pauses: list[TopicPartition] = field(default_factory=list)
    resumes: list[tuple[TopicPartition, int]] = field(default_factory=list)  # with the task's buffer then
    commits: list[dict[TopicPartition, int]] = field(default_factory=list)
    fail_commits: bool = False
    commit_error: type[Exception] = CommitFailedError  # what a failing commit raises
    assigned: set[TopicPartition] = field(default_factory=set)
    _paused: set[TopicPartition] = field(default_factory=set)
    # Records fetched ahead of poll per partition (aiokafka's prefetch); taken at most once.
    ahead: dict[TopicPartition, list[FetchedRecord]] = field(default_factory=dict)
    taken_before_pause: list[TopicPartition] = field(default_factory=list)
    seeks: list[tuple[TopicPartition, int]] = field(default_factory=list)

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self.seeks.append((partition, offset))

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def take_fetched(self, partition: TopicPartition) -> list[FetchedRecord]:
        assert partition not in self._paused, "taken after pause: aiokafka would have dropped them"
        self.taken_before_pause.append(partition)
        return self.ahead.pop(partition, [])

    def pause(self, *partitions: TopicPartition) -> None:
        self.pauses.extend(partitions)
        self._paused.update(partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        assert self.manager is not None
        for tp in partitions:
            task = next((t for t in self.manager.tasks.values() if tp in t.partitions), None)
            self.resumes.append((tp, 0 if task is None else task.buffered(tp)))
        self._paused.difference_update(partitions)

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: 100 for tp in partitions}  # changelogs that hold updates

    async def committed(self, partition: TopicPartition) -> OffsetAndMetadata | None:
        return None  # nothing committed before: a task starts with no partition time

    async def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        if self.fail_commits:
            raise self.commit_error("the group rebalanced")
        self.commits.append({tp: om.offset for tp, om in offsets.items()})


class NullProducer:
    def append(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
               timestamp_ms: int | None, headers: Headers) -> None:
        pass

    def buffered(self) -> int:
        return 0

    async def send_buffered(self) -> None:
        pass

    async def flush(self) -> None:
        pass


class GatedTransactionalProducer(NullProducer):
    """A task's transactional producer whose ``start`` (initialising its transactional.id) waits
    for ``gate``: on Kafka, a previous owner's open transaction is aborted meanwhile."""

    in_transaction = False

    def __init__(self, gate: asyncio.Event) -> None:
        self.gate = gate

    async def start(self) -> None:
        await self.gate.wait()

    async def abort_transaction(self) -> None:
        pass

    async def close(self) -> None:
        pass


class Spawner:
    """The manager's ``spawn``: keeps each task and, if ``run``, runs its coroutine on this loop."""

    def __init__(self, run: bool) -> None:
        self.run = run
        self.spawned: list[StreamTask] = []
        self.runners: list[asyncio.Task[None]] = []

    def __call__(self, task: StreamTask) -> None:
        self.spawned.append(task)
        if self.run:
            self.runners.append(asyncio.get_running_loop().create_task(task.run()))

    async def stop(self) -> None:
        for task in self.spawned:
            task.request_close()
        for runner in self.runners:
            runner.cancel()
        await asyncio.gather(*self.runners, return_exceptions=True)


class Gate(BaseProcessor):
    """Holds every record of topic ``c`` until the test opens the gate (never, in these tests)."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()

    async def process(self, record: Record) -> None:
        await self.gate.wait()


def two_subtopologies() -> Topology:
    """Sub-topology 0 reads the co-partitioned ``a`` and ``b``; sub-topology 1 reads ``c``."""
    builder = StreamsBuilder()
    builder.stream(["a", "b"]).peek(lambda k, v: None)
    builder.stream("c").peek(lambda k, v: None)
    return builder.build()


def gated_c() -> Topology:
    builder = StreamsBuilder()
    builder.stream(["a", "b"]).peek(lambda k, v: None)
    builder.stream("c").process(Gate, name="gate")
    return builder.build()


@dataclass
class Rig:
    manager: TaskManager
    consumer: RecordingConsumer
    spawner: Spawner


def make_rig(topology: Topology, run: bool, limit: int = 1000) -> Rig:
    clock = ManualClock(0)
    consumer = RecordingConsumer()
    collector = RecordCollector(NullProducer(), {}, _no_lookup)  # type: ignore[arg-type]
    committer = Committer(consumer, collector, 30_000, clock.monotonic_ms, LOG)  # type: ignore[arg-type]
    spawner = Spawner(run)
    manager = TaskManager("app", topology, consumer, collector, committer, spawner, LOG,  # type: ignore[arg-type]
                          clock.wall_ms, BytesSerde(), BytesSerde(), limit)
    consumer.manager = manager
    return Rig(manager, consumer, spawner)


async def _no_lookup(topic: str) -> int | None:
    return None


@pytest_asyncio.fixture
async def running() -> AsyncIterator[Rig]:
    """A manager of ``two_subtopologies()`` whose tasks run."""
    rig = make_rig(two_subtopologies(), run=True)
    yield rig
    await rig.spawner.stop()


@pytest_asyncio.fixture
async def parked() -> AsyncIterator[Rig]:
    """A manager whose tasks never run, so records stay buffered (limit 4 per partition)."""
    rig = make_rig(two_subtopologies(), run=False, limit=4)
    yield rig
    await rig.spawner.stop()


def records(tp: TopicPartition, first: int, count: int) -> list[FetchedRecord]:
    return [FetchedRecord(tp.topic, tp.partition, o, o, None, str(o).encode()) for o in range(first, first + count)]


async def processed(task: StreamTask, count: int) -> None:
    await eventually_async(lambda: task.processed >= count, timeout=WAIT, what=f"task {task.id} processed {count}")


# -- assignment --------------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_assignment_groups_co_partitioned_topics_into_one_task_per_partition_number(parked: Rig) -> None:
    created = parked.manager.handle_assignment([C0, A1, B0, A0, B1])

    assert {t.id: t.partitions for t in created} == {
        TaskId(0, 0): frozenset({A0, B0}),
        TaskId(0, 1): frozenset({A1, B1}),
        TaskId(1, 0): frozenset({C0}),
    }
    assert set(parked.manager.tasks) == {TaskId(0, 0), TaskId(0, 1), TaskId(1, 0)}


@pytest.mark.asyncio
async def test_assignment_spawns_each_new_task_once_in_task_id_order(parked: Rig) -> None:
    parked.manager.handle_assignment([C0, A1, B0, A0, B1])

    assert [t.id for t in parked.spawner.spawned] == [TaskId(0, 0), TaskId(0, 1), TaskId(1, 0)]


@pytest.mark.asyncio
async def test_partitions_already_owned_create_no_new_task(parked: Rig) -> None:
    parked.manager.handle_assignment([A0, B0])

    again = parked.manager.handle_assignment([A0, B0, C0])

    assert [t.id for t in again] == [TaskId(1, 0)]
    assert len(parked.spawner.spawned) == 2


@pytest.mark.asyncio
async def test_task_id_of_a_partition_is_its_subtopology_and_partition_number(parked: Rig) -> None:
    assert parked.manager.task_id_of(B1) == TaskId(0, 1)
    assert parked.manager.task_id_of(C0) == TaskId(1, 0)


@pytest.mark.asyncio
async def test_fetched_records_go_to_the_task_of_their_partition(parked: Rig) -> None:
    parked.manager.handle_assignment([A0, B0, C0])
    stray = TopicPartition("a", 7)

    total = parked.manager.add_records({A0: records(A0, 0, 2), C0: records(C0, 0, 1), stray: records(stray, 0, 3)})

    tasks = parked.manager.tasks
    assert total == 3  # the stray partition has no task here: its records are dropped
    assert (tasks[TaskId(0, 0)].buffered(A0), tasks[TaskId(0, 0)].buffered(B0), tasks[TaskId(1, 0)].buffered()) == (
        2, 0, 1)


# -- revocation ----------------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_revocation_closes_only_the_revoked_tasks_after_committing_their_positions(running: Rig) -> None:
    manager = running.manager
    manager.handle_assignment([A0, B0, C0])
    revoked_task, kept_task = manager.tasks[TaskId(0, 0)], manager.tasks[TaskId(1, 0)]
    manager.add_records({A0: records(A0, 0, 2), B0: records(B0, 0, 1), C0: records(C0, 0, 3)})
    await processed(revoked_task, 3)
    await processed(kept_task, 3)

    await manager.handle_revocation([A0, B0], timeout=WAIT)

    assert running.consumer.commits == [{A0: 2, B0: 1}]
    assert revoked_task.state.state is TaskState.CLOSED
    assert kept_task.state.state is TaskState.RUNNING
    assert set(manager.tasks) == {TaskId(1, 0)}


@pytest.mark.asyncio
async def test_revoked_partitions_are_forgotten_so_later_records_for_them_are_dropped(running: Rig) -> None:
    manager = running.manager
    manager.handle_assignment([A0, B0, C0])

    await manager.handle_revocation([A0, B0], timeout=WAIT)

    assert manager.add_records({A0: records(A0, 0, 2)}) == 0
    assert manager.task_id_of(A0) not in manager.tasks


@pytest.mark.asyncio
async def test_revocation_of_partitions_without_task_does_nothing(running: Rig) -> None:
    running.manager.handle_assignment([C0])

    await running.manager.handle_revocation([A0, B0], timeout=WAIT)

    assert running.consumer.commits == []
    assert set(running.manager.tasks) == {TaskId(1, 0)}


@pytest.mark.asyncio
async def test_revocation_whose_commit_fails_still_closes_the_tasks(running: Rig) -> None:
    manager = running.manager
    manager.handle_assignment([A0, B0])
    task = manager.tasks[TaskId(0, 0)]
    manager.add_records({A0: records(A0, 0, 1)})
    await processed(task, 1)
    running.consumer.fail_commits = True

    await manager.handle_revocation([A0, B0], timeout=WAIT)

    assert task.state.state is TaskState.CLOSED
    assert manager.tasks == {}


@pytest.mark.asyncio
async def test_tasks_whose_closing_commit_a_cooperative_rebalance_defers_close_dirty(
        running: Rig, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # "Not committed" is not "nothing to commit": a clean close would keep the tasks' state (and
    # write its checkpoint) ahead of the offsets the next owner starts from.
    manager = running.manager
    manager.handle_assignment([A0, B0])
    task = manager.tasks[TaskId(0, 0)]
    manager.add_records({A0: records(A0, 0, 1)})
    await processed(task, 1)
    running.consumer.fail_commits = True
    running.consumer.commit_error = RebalanceInProgressError
    checkpointed: list[list[StreamTask]] = []

    async def checkpoint(tasks: list[StreamTask]) -> None:
        checkpointed.append(list(tasks))
    monkeypatch.setattr(manager._committer, "checkpoint", checkpoint)

    with caplog.at_level(logging.DEBUG, logger=LOG.logger.name):
        await manager.close_tasks([task], clean=True, timeout=WAIT)

    assert task.state.state is TaskState.CLOSED
    assert checkpointed == []
    assert [r.getMessage().split("] ", 1)[1] for r in caplog.records if "Closed tasks" in r.getMessage()] == [
        "Closed tasks ['0_0'] dirty"]


@pytest.mark.asyncio
async def test_a_task_that_does_not_finish_its_record_in_time_is_closed_without_commit() -> None:
    rig = make_rig(gated_c(), run=True)
    try:
        manager = rig.manager
        manager.handle_assignment([A0, B0, C0])
        stuck, done = manager.tasks[TaskId(1, 0)], manager.tasks[TaskId(0, 0)]
        manager.add_records({A0: records(A0, 0, 1), C0: records(C0, 0, 1)})
        await processed(done, 1)

        await manager.close_tasks([stuck, done], clean=True, timeout=0.05)

        assert rig.consumer.commits == []
        assert stuck.state.state is TaskState.CLOSED
        assert manager.tasks == {}
    finally:
        await rig.spawner.stop()


@pytest.mark.asyncio
async def test_a_task_that_finished_its_record_closes_cleanly_even_when_the_close_budget_is_spent(
        running: Rig) -> None:
    # The budget is shared by the tasks of one close: when the earlier ones used it up, a later task
    # that has already finished is not "stuck" and its close stays clean (committed).
    manager = running.manager
    manager.handle_assignment([A0])
    task = manager.tasks[TaskId(0, 0)]
    manager.add_records({A0: records(A0, 0, 1)})
    await processed(task, 1)
    task.request_close()
    await asyncio.wait_for(task.finished.wait(), WAIT)

    await manager.close_tasks([task], clean=True, timeout=0)

    assert running.consumer.commits == [{A0: 1}]


@pytest.mark.asyncio
async def test_a_task_closed_dirty_ends_quietly_when_its_record_in_flight_completes() -> None:
    rig = make_rig(gated_c(), run=True)
    try:
        manager = rig.manager
        manager.handle_assignment([C0])
        stuck = manager.tasks[TaskId(1, 0)]
        gate = next(n.processor for n in stuck.graph.nodes if n.name == "gate")  # type: ignore[attr-defined]
        manager.add_records({C0: records(C0, 0, 2)})
        await eventually_async(lambda: stuck.context.offset == 0, timeout=WAIT, what="record 0 in flight")
        await manager.close_tasks([stuck], clean=True, timeout=0.05)

        gate.gate.set()  # the slow call the processor waited on finally returns
        (outcome,) = await asyncio.wait_for(asyncio.gather(rig.spawner.runners[0], return_exceptions=True), WAIT)

        assert outcome is None
        assert stuck.processed == 0
    finally:
        await rig.spawner.stop()


@pytest.mark.asyncio
async def test_shutdown_closes_every_task_cleanly(running: Rig) -> None:
    manager = running.manager
    manager.handle_assignment([A0, B0, A1, B1, C0])
    manager.add_records({A1: records(A1, 0, 2), C0: records(C0, 0, 1)})
    await processed(manager.tasks[TaskId(0, 1)], 2)
    await processed(manager.tasks[TaskId(1, 0)], 1)
    tasks = list(manager.tasks.values())

    await manager.shutdown(clean=True, timeout=WAIT)

    assert running.consumer.commits == [{A1: 2, C0: 1}]
    assert all(t.state.state is TaskState.CLOSED for t in tasks)
    assert manager.tasks == {}


@pytest.mark.asyncio
async def test_dirty_shutdown_closes_every_task_without_commit(running: Rig) -> None:
    manager = running.manager
    manager.handle_assignment([A0, B0])
    manager.add_records({A0: records(A0, 0, 2)})
    await processed(manager.tasks[TaskId(0, 0)], 2)

    await manager.shutdown(clean=False, timeout=WAIT)

    assert running.consumer.commits == []
    assert manager.tasks == {}


# -- back-pressure ----------------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_partition_is_not_paused_below_the_buffer_limit(parked: Rig) -> None:
    parked.manager.handle_assignment([A0, B0])

    parked.manager.add_records({A0: records(A0, 0, 3)})

    assert parked.consumer.pauses == []


@pytest.mark.asyncio
async def test_partition_is_paused_once_its_task_holds_the_buffer_limit(parked: Rig) -> None:
    parked.manager.handle_assignment([A0, B0])

    parked.manager.add_records({A0: records(A0, 0, 3)})
    parked.manager.add_records({A0: records(A0, 3, 1), B0: records(B0, 0, 1)})
    parked.manager.add_records({A0: records(A0, 4, 2)})

    assert parked.consumer.pauses == [A0]  # once, and only the full partition


@pytest.mark.asyncio
async def test_records_fetched_ahead_are_buffered_before_back_pressure_pauses_their_partition(parked: Rig) -> None:
    # Pausing makes aiokafka drop a partition's prefetched records; the broker would send them again.
    parked.manager.handle_assignment([A0, B0])
    parked.consumer.ahead[A0] = records(A0, 5, 4)
    parked.consumer.ahead[B0] = records(B0, 1, 2)

    polled = parked.manager.add_records({A0: records(A0, 0, 5), B0: records(B0, 0, 1)})

    task = parked.manager.tasks[TaskId(0, 0)]
    assert parked.consumer.pauses == [A0]
    assert parked.consumer.taken_before_pause == [A0]  # only the partition that is paused
    assert task.buffered(A0) == 9
    assert polled == 10  # what the thread counts as polled includes them
    assert parked.consumer.ahead == {B0: records(B0, 1, 2)}  # B0 keeps its prefetch: getmany brings it


@pytest.mark.asyncio
async def test_paused_partition_is_resumed_once_its_task_drained_to_half_the_limit() -> None:
    limit = 2_000  # more than one chunk of records, so the task drains in several steps
    rig = make_rig(two_subtopologies(), run=False, limit=limit)
    try:
        rig.manager.handle_assignment([A0, B0])
        task = rig.manager.tasks[TaskId(0, 0)]
        rig.manager.add_records({A0: records(A0, 0, limit)})
        assert rig.consumer.pauses == [A0]

        runner = asyncio.get_running_loop().create_task(task.run())
        rig.spawner.runners.append(runner)
        await processed(task, limit)

        assert len(rig.consumer.resumes) == 1
        tp, buffered_then = rig.consumer.resumes[0]
        assert tp == A0 and buffered_then <= limit // 2
        assert rig.consumer.paused() == set()
    finally:
        await rig.spawner.stop()


@pytest.mark.asyncio
async def test_a_resumed_partition_is_paused_again_when_it_fills_up() -> None:
    rig = make_rig(two_subtopologies(), run=True, limit=10)
    try:
        manager = rig.manager
        manager.handle_assignment([A0, B0])
        manager.add_records({A0: records(A0, 0, 10)})
        await eventually_async(lambda: rig.consumer.resumes, timeout=WAIT, what="A0 resumed")

        manager.add_records({A0: records(A0, 10, 10)})

        assert rig.consumer.pauses == [A0, A0]
    finally:
        await rig.spawner.stop()


@pytest.mark.asyncio
async def test_a_partition_paused_by_back_pressure_is_resumed_when_its_task_closes_and_it_stays_assigned(
        parked: Rig) -> None:
    # A task revived from its last commit (a producer timeout in a broker outage): closed dirty,
    # then created again for the same partitions, which the consumer still has assigned.
    parked.consumer.assigned = {A0, B0}
    parked.manager.handle_assignment([A0, B0])
    parked.manager.add_records({A0: records(A0, 0, 5)})
    assert parked.consumer.paused() == {A0}

    await parked.manager.close_tasks(list(parked.manager.tasks.values()), clean=False, timeout=0.1)
    parked.manager.handle_assignment([A0, B0])

    assert parked.consumer.paused() == set()
    parked.manager.add_records({A0: records(A0, 0, 5)})
    assert parked.consumer.paused() == {A0}  # and back-pressure tracks it again


@pytest.mark.asyncio
@pytest.mark.parametrize("clean", [True, False])
async def test_a_closed_tasks_partitions_that_stay_assigned_go_back_to_its_first_unprocessed_record(
        parked: Rig, clean: bool) -> None:
    # A cooperative rebalance that changes a task's partitions closes it and creates it again on
    # those it keeps: the consumer's position is past the records it fetched and did not process.
    parked.consumer.assigned = {A0, B0}
    parked.manager.handle_assignment([A0, B0])
    parked.manager.add_records({A0: records(A0, 3, 5)})

    await parked.manager.close_tasks(list(parked.manager.tasks.values()), clean=clean, timeout=0.1)

    assert parked.consumer.seeks == [(A0, 3)]  # B-0 gave it nothing: it reads on where it is


@pytest.mark.asyncio
async def test_a_closed_tasks_partitions_that_were_revoked_or_shut_down_are_not_seeked(parked: Rig) -> None:
    parked.consumer.assigned = {A0, B0}
    parked.manager.handle_assignment([A0, B0])
    parked.manager.add_records({A0: records(A0, 3, 5), B0: records(B0, 0, 2)})
    parked.consumer.assigned = {B0}  # A-0 was revoked

    await parked.manager.close_tasks(list(parked.manager.tasks.values()), clean=True, timeout=0.1)
    assert parked.consumer.seeks == [(B0, 0)]

    parked.manager.handle_assignment([B0])
    parked.manager.add_records({B0: records(B0, 0, 2)})
    await parked.manager.shutdown(clean=True, timeout=0.1)
    assert parked.consumer.seeks == [(B0, 0)]  # nothing more: no task follows a shutdown


@pytest.mark.asyncio
async def test_a_task_paused_by_a_handler_and_revived_fetches_its_partitions_again(parked: Rig) -> None:
    # A PAUSE answer paused the task and its partitions; then a producer timeout revives every
    # task from its last commit: the new task runs, so nothing would ever resume the partitions.
    parked.consumer.assigned = {A0, B0}
    parked.manager.handle_assignment([A0, B0])
    (task,) = parked.manager.tasks.values()
    task.state.transition_to(TaskState.RUNNING)
    task.state.transition_to(TaskState.PAUSED)
    parked.manager._on_pause(task)  # what the task calls when a handler answers PAUSE
    assert parked.consumer.paused() == {A0, B0}

    await parked.manager.close_tasks([task], clean=False, timeout=0.1)
    (revived,) = parked.manager.handle_assignment([A0, B0])

    assert not revived.is_paused
    assert parked.consumer.paused() == set()


@pytest.mark.asyncio
async def test_a_revoked_partition_paused_by_back_pressure_is_left_alone(parked: Rig) -> None:
    parked.consumer.assigned = {A0, B0}
    parked.manager.handle_assignment([A0, B0])
    parked.manager.add_records({A0: records(A0, 0, 5)})
    parked.consumer.assigned = set()  # the new assignment no longer has it

    await parked.manager.handle_revocation([A0, B0], timeout=0.1)

    assert parked.consumer.resumes == []


# -- checkpoints ---------------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_task_closed_before_its_restore_leaves_no_checkpoint(tmp_path) -> None:
    """A rebalance at start-up closes a task cleanly before it restored (a wiped state dir): its empty
    stores must not be checkpointed at the changelog's end, or the next owner trusts them and skips
    the restore (counts lower than the input)."""
    from streamloop.state import Materialized
    from streamloop.state.cache import ThreadCache
    from streamloop.state.task_state import StateSettings

    builder = StreamsBuilder()
    builder.stream("a").group_by_key().count(materialized=Materialized("counts", persistent=True))
    clock = ManualClock(0)
    consumer = RecordingConsumer()
    collector = RecordCollector(NullProducer(), {}, _no_lookup)  # type: ignore[arg-type]
    committer = Committer(consumer, collector, 30_000, clock.monotonic_ms, LOG)  # type: ignore[arg-type]
    spawner = Spawner(run=True)  # its coroutine starts after the close request: it never restores
    settings = StateSettings(str(tmp_path), True, ThreadCache(0), lambda: None)  # type: ignore[arg-type,return-value]
    manager = TaskManager("app", builder.build(), consumer, collector, committer, spawner, LOG,  # type: ignore[arg-type]
                          clock.wall_ms, BytesSerde(), BytesSerde(), 1000, state=settings)
    consumer.manager = manager
    (task,) = manager.handle_assignment([A0])
    assert task.state.state is TaskState.CREATED
    await manager.close_tasks([task], clean=True, timeout=WAIT)
    assert not list(tmp_path.rglob(".checkpoint"))
    await spawner.stop()


class Member:
    """A group member of the memory broker reading ``c``, as the stream thread runs it: the
    rebalance listener creates the manager's tasks, and ``poll`` hands fetched records to them."""

    def __init__(self, transport: MemoryTransport, topology: Topology, name: str) -> None:
        self.consumer = transport.consumer(ConsumerSettings("app", name, StreamsAssignor(topology, name, name)))
        self.manager: TaskManager | None = None

    async def join(self) -> None:
        self.consumer.subscribe(["c"], self)
        await self.consumer.start()

        async def owns_c0() -> bool:
            await self.poll()
            return C0 in self.consumer.assignment()
        await eventually_async(owns_c0, WAIT, "C0 assigned")

    async def poll(self) -> None:
        records = await self.consumer.poll(10, 4)
        if self.manager is not None:
            self.manager.add_records(records)

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        pass

    def on_join_registered(self) -> None:
        pass

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        if self.manager is not None:
            self.manager.handle_assignment(assigned)


@pytest.mark.asyncio
async def test_exactly_once_refetches_a_partition_whose_full_buffer_was_dropped_at_initialisation() -> None:
    # Restart after a crash: a backlog fills the buffer and back-pressure pauses the partition
    # while the task initialises its transactional.id; the seek to the committed offset then
    # drops the buffer, so nothing but that drop can resume fetching (issue #19).
    transport = MemoryTransport(MemoryBroker(f"eos-stall-{uuid.uuid4().hex[:8]}"))
    transport.broker.create_topics({"c": 1})
    seen: list[int] = []
    builder = StreamsBuilder()
    builder.stream("c").peek(lambda k, v: seen.append(int(v)))
    topology = builder.build()
    producer = transport.producer(ProducerSettings("input"))
    for offset in range(100):
        producer.append("c", 0, None, str(offset).encode(), offset, ())
    await producer.flush()
    previous = Member(transport, topology, "previous")  # the owner that committed 30, then died
    await previous.join()
    await previous.consumer.commit({C0: OffsetAndMetadata(30)})
    await previous.consumer.close()
    gate = asyncio.Event()
    restarted = Member(transport, topology, "restarted")
    consumer = restarted.consumer
    clock = ManualClock(0)
    collector = RecordCollector(NullProducer(), {}, _no_lookup)  # type: ignore[arg-type]
    spawner = Spawner(run=True)
    restarted.manager = manager = TaskManager(
        "app", topology, consumer, collector, Committer(consumer, collector, 30_000, clock.monotonic_ms, LOG),
        spawner, LOG, clock.wall_ms, BytesSerde(), BytesSerde(), 10,
        exactly_once=ExactlyOnce(lambda task_id: GatedTransactionalProducer(gate)))  # type: ignore[arg-type]
    try:
        await restarted.join()
        (task,) = manager.tasks.values()
        while C0 not in consumer.paused():
            await restarted.poll()
        assert task.buffered(C0) >= 10

        gate.set()

        async def polled_and_processed() -> bool:
            await restarted.poll()
            return task.position(C0) == 100
        await eventually_async(polled_and_processed, timeout=WAIT, what="offsets 30..99 processed after the seek")
        assert seen == list(range(30, 100))
    finally:
        await spawner.stop()
        await consumer.close()
