"""``Committer``: when a stream thread commits, and the at-least-once order of a commit.

Tasks are real ``StreamTask`` instances run on the test's loop, so their
committable positions come from records they really processed. The consumer is
either a ``RecordingConsumer`` (which shares a call log with the producer, to
see the order of flush and commit) or a real group consumer of a memory broker.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import pytest
import pytest_asyncio

from streamloop.clock import ManualClock
from streamloop.collector import RecordCollector
from streamloop.commit import CommitResult, CommitStatus, Committer
from streamloop.errors import CommitFailedError, ProduceError, RebalanceInProgressError
from streamloop.ids import TaskId
from streamloop.logcontext import thread_log
from streamloop.processors.api import BaseProcessor
from streamloop.processors.context import TaskContext
from streamloop.records import FetchedRecord, Headers, Record, TopicPartition
from streamloop.recovery import ProducerLost, RecoveryInbox
from streamloop.serdes import BytesSerde
from streamloop.tasks.task import StreamTask
from streamloop.tasks.timeouts import TaskTimer
from streamloop.testing import eventually_async
from streamloop.topology.builder import StreamsBuilder
from streamloop.topology.topology import Topology
from streamloop.transport.base import (
    ConsumerSettings,
    MemberAssignment,
    MemberSubscription,
    OffsetAndMetadata,
)
from streamloop.transport.memory import MemoryBroker, MemoryConsumer, MemoryTransport
from tests.support.convergence import IgnoreRebalances

LOG = thread_log(__name__, "app-StreamThread-1")
INTERVAL_MS = 1_000
WAIT = 5.0
_brokers = itertools.count()


# -- test doubles ----------------------------------------------------------------------------------


@dataclass
class RecordingProducer:
    """The producer calls a commit makes, logged into ``calls`` (shared with the consumer);
    ``flush`` raises ``fail_with`` while it is set."""

    calls: list[str]
    fail_with: Exception | None = None

    def append(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
               timestamp_ms: int | None, headers: Headers) -> None:
        self.calls.append("append")

    def buffered(self) -> int:
        return 0

    async def send_buffered(self) -> None:
        self.calls.append("send_buffered")

    async def flush(self) -> None:
        self.calls.append("flush")
        if self.fail_with is not None:
            raise self.fail_with


@dataclass
class RecordingConsumer:
    """Keeps every commit; raises ``fail_with`` instead while it is set."""

    calls: list[str]
    commits: list[dict[TopicPartition, int]] = field(default_factory=list)
    fail_with: Exception | None = None

    async def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        self.calls.append("commit")
        if self.fail_with is not None:
            raise self.fail_with
        self.commits.append({tp: om.offset for tp, om in offsets.items()})


class Committing(BaseProcessor):
    """Asks for a commit when it sees the value ``b"commit"``."""

    def process(self, record: Record) -> None:
        if record.value == b"commit":
            self.context.commit()


def topology() -> Topology:
    builder = StreamsBuilder()
    builder.stream("in").process(Committing, name="committing")
    return builder.build()


class Tasks:
    """Makes running ``StreamTask``s of ``topology()``; each one is closed at teardown."""

    def __init__(self, collector: RecordCollector, clock: ManualClock) -> None:
        self._collector = collector
        self._clock = clock
        self._topology = topology()
        self._running: list[tuple[StreamTask, asyncio.Task[None]]] = []

    def __call__(self, partition: int) -> StreamTask:
        task_id = TaskId(0, partition)
        context = TaskContext("app", task_id, self._clock.wall_ms)
        graph = self._topology.build_task_graph(0, context, self._collector, BytesSerde(), BytesSerde())
        task = StreamTask(task_id, [TopicPartition("in", partition)], graph, context, self._after_chunk,
                          LOG, self._clock.wall_ms)
        self._running.append((task, asyncio.get_running_loop().create_task(task.run())))
        return task

    async def _after_chunk(self) -> None:
        pass

    async def close(self) -> None:
        for task, runner in self._running:
            task.request_close()
            await asyncio.wait_for(runner, WAIT)
            task.close()


async def feed(task: StreamTask, *values: bytes) -> None:
    """Buffer ``values`` after what the task already got, and wait until it processed them."""
    (tp,) = task.partitions
    start = task.buffered(tp) + task.processed
    target = task.processed + len(values)
    task.add_records(tp, [FetchedRecord(tp.topic, tp.partition, start + i, 0, None, v) for i, v in enumerate(values)])
    await eventually_async(lambda: task.processed >= target, timeout=WAIT, what=f"{target} records processed")


@dataclass
class Rig:
    calls: list[str]
    clock: ManualClock
    producer: RecordingProducer
    consumer: RecordingConsumer
    committer: Committer
    tasks: Tasks
    inbox: RecoveryInbox  # the stream thread's, which its poll loop drains


@pytest_asyncio.fixture
async def rig() -> AsyncIterator[Rig]:
    calls: list[str] = []
    clock = ManualClock(10_000)
    producer, consumer = RecordingProducer(calls), RecordingConsumer(calls)
    collector = RecordCollector(producer, {}, _no_lookup)  # type: ignore[arg-type]
    inbox = RecoveryInbox()
    committer = Committer(consumer, collector, INTERVAL_MS, clock.monotonic_ms, LOG, inbox)  # type: ignore[arg-type]
    tasks = Tasks(collector, clock)
    yield Rig(calls, clock, producer, consumer, committer, tasks, inbox)
    await tasks.close()


async def _no_lookup(topic: str) -> int | None:
    return None


# -- the order of a commit ----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_commit_flushes_the_producer_before_it_commits_offsets(rig: Rig) -> None:
    task = rig.tasks(0)
    await feed(task, b"a", b"b")
    rig.calls.clear()

    await rig.committer.commit([task])

    assert rig.calls == ["flush", "commit"]


@pytest.mark.asyncio
async def test_commit_commits_the_offset_after_the_last_processed_record_of_each_task(rig: Rig) -> None:
    first, second = rig.tasks(0), rig.tasks(1)
    await feed(first, b"a", b"b", b"c")
    await feed(second, b"d")

    committed = await rig.committer.commit([first, second])

    assert committed == CommitResult(CommitStatus.COMMITTED, 2)
    assert rig.consumer.commits == [{TopicPartition("in", 0): 3, TopicPartition("in", 1): 1}]
    assert rig.committer.commits == 1


@pytest.mark.asyncio
async def test_only_positions_that_moved_since_the_last_commit_are_committed(rig: Rig) -> None:
    first, second = rig.tasks(0), rig.tasks(1)
    await feed(first, b"a")
    await feed(second, b"b")
    await rig.committer.commit([first, second])

    await feed(first, b"c", b"d")
    committed = await rig.committer.commit([first, second])

    assert committed == CommitResult(CommitStatus.COMMITTED, 1)
    assert rig.consumer.commits[-1] == {TopicPartition("in", 0): 3}


@pytest.mark.asyncio
async def test_commit_with_nothing_new_flushes_but_commits_nothing(rig: Rig) -> None:
    task = rig.tasks(0)
    await feed(task, b"a")
    await rig.committer.commit([task])
    rig.calls.clear()

    committed = await rig.committer.commit([task])

    assert committed == CommitResult(CommitStatus.COMMITTED, 0)
    assert rig.calls == ["flush"]


# -- when a commit is due ----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_commit_is_due_once_the_interval_passed_on_the_clock(rig: Rig) -> None:
    assert not rig.committer.due([])

    rig.clock.advance(INTERVAL_MS - 1)
    assert not rig.committer.due([])

    rig.clock.advance(1)
    assert rig.committer.due([])


@pytest.mark.asyncio
async def test_a_commit_restarts_the_interval(rig: Rig) -> None:
    rig.clock.advance(INTERVAL_MS)

    await rig.committer.commit([])

    assert not rig.committer.due([])
    rig.clock.advance(INTERVAL_MS)
    assert rig.committer.due([])


@pytest.mark.asyncio
async def test_maybe_commit_does_nothing_before_the_interval_passed(rig: Rig) -> None:
    task = rig.tasks(0)
    await feed(task, b"a")
    rig.calls.clear()

    assert await rig.committer.maybe_commit([task]) == CommitResult(CommitStatus.COMMITTED, 0)
    assert rig.calls == []

    rig.clock.advance(INTERVAL_MS)
    assert await rig.committer.maybe_commit([task]) == CommitResult(CommitStatus.COMMITTED, 1)
    assert rig.calls == ["flush", "commit"]


@pytest.mark.asyncio
async def test_a_processors_commit_request_makes_the_commit_due_before_the_interval(rig: Rig) -> None:
    task = rig.tasks(0)
    await feed(task, b"a")
    assert not rig.committer.due([task])

    await feed(task, b"commit")

    assert task.context.commit_requested
    assert rig.committer.due([task])
    assert await rig.committer.maybe_commit([task]) == CommitResult(CommitStatus.COMMITTED, 1)


@pytest.mark.asyncio
async def test_a_commit_clears_the_processors_commit_request(rig: Rig) -> None:
    task = rig.tasks(0)
    await feed(task, b"commit")

    await rig.committer.commit([task])

    assert not task.context.commit_requested
    assert not rig.committer.due([task])


# -- failure -----------------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_commit_the_group_refuses_leaves_the_tasks_positions_uncommitted(rig: Rig) -> None:
    task = rig.tasks(0)
    await feed(task, b"a", b"b")
    rig.consumer.fail_with = CommitFailedError("the group rebalanced")

    assert await rig.committer.commit([task]) == CommitResult(CommitStatus.REFUSED)

    assert rig.committer.commits == 0
    assert {tp: om.offset for tp, om in task.committable_offsets().items()} == {TopicPartition("in", 0): 2}
    rig.consumer.fail_with = None
    assert await rig.committer.commit([task]) == CommitResult(CommitStatus.COMMITTED, 1)
    assert rig.consumer.commits == [{TopicPartition("in", 0): 2}]


@pytest.mark.asyncio
async def test_a_commit_during_a_cooperative_rebalance_is_deferred_to_the_next_poll(rig: Rig) -> None:
    task = rig.tasks(0)
    await feed(task, b"a")
    rig.consumer.fail_with = RebalanceInProgressError("the group is rebalancing")

    result = await rig.committer.commit([task])

    # Not "nothing to commit": closing tasks on this answer must close them dirty.
    assert result == CommitResult(CommitStatus.DEFERRED)
    assert not result.done
    assert rig.committer.due([task])
    rig.consumer.fail_with = None
    assert await rig.committer.maybe_commit([task]) == CommitResult(CommitStatus.COMMITTED, 1)


@pytest.mark.asyncio
async def test_output_lost_to_a_produce_timeout_is_reported_once_for_the_thread_to_revive_its_tasks(
        rig: Rig) -> None:
    task = rig.tasks(0)
    task.timer = TaskTimer(task.id, 60_000, 100, 1_000, rig.clock.monotonic_ms, LOG)
    await feed(task, b"a")
    lost = ProduceError("out", 1, "the batch expired")
    lost.__cause__ = TimeoutError("the batch expired")
    rig.producer.fail_with = lost

    first = await rig.committer.commit([task])
    second = await rig.committer.commit([task])

    assert first == second == CommitResult(CommitStatus.TIMED_OUT)
    assert rig.consumer.commits == []
    assert task.timer.running
    assert rig.inbox.drain() == [ProducerLost(lost)]
    assert not rig.inbox


@pytest.mark.asyncio
async def test_no_offsets_are_committed_while_output_lost_elsewhere_waits_for_its_revival(rig: Rig) -> None:
    """A task's own send reported the loss (``ProducerLost`` in the inbox) and dropped the batch:
    the flush finds nothing pending, but the records before the positions lost their output. A
    commit beside the poll loop can come before the loop revives the tasks: it must not commit."""
    task = rig.tasks(0)
    await feed(task, b"a")
    rig.inbox.report(ProducerLost(ProduceError("out", 1, "the batch expired")))

    result = await rig.committer.commit([task])

    assert result == CommitResult(CommitStatus.TIMED_OUT)
    assert rig.consumer.commits == []
    assert {tp: om.offset for tp, om in task.committable_offsets().items()} == {TopicPartition("in", 0): 1}


@pytest.mark.asyncio
async def test_a_failing_flush_commits_no_offsets(rig: Rig) -> None:
    task = rig.tasks(0)
    await feed(task, b"a")
    rig.producer.fail_with = ProduceError("out", 1, "the broker refused the batch")
    rig.calls.clear()

    with pytest.raises(ProduceError, match="out-1"):
        await rig.committer.commit([task])

    assert rig.calls == ["flush"]
    assert {tp: om.offset for tp, om in task.committable_offsets().items()} == {TopicPartition("in", 0): 1}


# -- against a real group consumer of the memory broker ----------------------------------------------------


class TakeAll:
    """A group assignor that gives every partition to the first member."""

    name = "take-all"

    def subscription_user_data(self, topics: Sequence[str]) -> bytes:
        return b""

    def assign(self, subscriptions: Mapping[str, MemberSubscription],
               partitions_per_topic: Mapping[str, int]) -> dict[str, MemberAssignment]:
        members = sorted(subscriptions)
        everything = tuple(TopicPartition(t, p) for t, n in sorted(partitions_per_topic.items()) for p in range(n))
        return {m: MemberAssignment(everything if i == 0 else ()) for i, m in enumerate(members)}

    def on_assignment(self, assignment: MemberAssignment) -> None:
        pass




@dataclass
class MemoryRig:
    broker: MemoryBroker
    consumer: MemoryConsumer
    committer: Committer
    tasks: Tasks


async def memory_rig(joined: bool) -> MemoryRig:
    broker = MemoryBroker(f"commit-{next(_brokers)}", clock=ManualClock(0), seed=1)
    transport = MemoryTransport(broker)
    broker.create_topics({"in": 2})
    consumer = transport.consumer(ConsumerSettings(group_id="app", client_id="c-1", assignor=TakeAll()))
    if joined:
        consumer.subscribe(["in"], IgnoreRebalances())
        await consumer.start()
        want = {TopicPartition("in", 0), TopicPartition("in", 1)}
        await eventually_async(_polled_until(consumer, want), timeout=WAIT, what="both partitions assigned")
    clock = ManualClock(0)
    collector = RecordCollector(RecordingProducer([]), {}, _no_lookup)  # type: ignore[arg-type]
    committer = Committer(consumer, collector, INTERVAL_MS, clock.monotonic_ms, LOG)
    return MemoryRig(broker, consumer, committer, Tasks(collector, clock))


def _polled_until(consumer: MemoryConsumer, want: set[TopicPartition]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        await consumer.poll(10)
        return consumer.assignment() == want

    return check


@pytest.mark.asyncio
async def test_committed_positions_reach_the_group_on_the_memory_broker() -> None:
    mem = await memory_rig(joined=True)
    try:
        task = mem.tasks(1)
        await feed(task, b"a", b"b", b"c")

        assert await mem.committer.commit([task]) == CommitResult(CommitStatus.COMMITTED, 1)

        # The metadata carries the partition time (0: the records' timestamps).
        assert mem.broker.committed("app", TopicPartition("in", 1)) == OffsetAndMetadata(3, "sl2:0")
        assert mem.broker.committed("app", TopicPartition("in", 0)) is None
    finally:
        await mem.tasks.close()
        await mem.consumer.close()


@pytest.mark.asyncio
async def test_commit_by_a_consumer_that_owns_no_partitions_is_refused_and_stores_nothing() -> None:
    mem = await memory_rig(joined=False)
    try:
        task = mem.tasks(0)
        await feed(task, b"a")

        assert await mem.committer.commit([task]) == CommitResult(CommitStatus.REFUSED)

        assert mem.broker.committed("app", TopicPartition("in", 0)) is None
        assert {tp: om.offset for tp, om in task.committable_offsets().items()} == {TopicPartition("in", 0): 1}
    finally:
        await mem.tasks.close()
        await mem.consumer.close()
