"""The memory:// transport, specified behaviour by behaviour.

Every test gets its own broker on a manual clock (liveness deadlines move only
when a test advances it); poll timeouts are real but short. Waiting is always on
a condition with a deadline, never on a fixed sleep.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamloop.clock import ManualClock
from streamloop.errors import CommitFailedError, IllegalStateError, ProduceError, TransportError
from streamloop.records import FetchedRecord, TopicPartition
from streamloop.testing import eventually_async
from streamloop.transport.base import (
    ConsumerSettings,
    MemberAssignment,
    MemberSubscription,
    OffsetAndMetadata,
    ProducerSettings,
)
from streamloop.transport.memory import (
    GroupState,
    MemoryBroker,
    MemoryConsumer,
    MemoryTransport,
)

TOPIC = "events"
GROUP = "app"
_broker_names = itertools.count()


# --------------------------------------------------------------------------- test doubles


class RoundRobinAssignor:
    """Deals the sorted partitions of each topic to its subscribers, sorted by member id."""

    name = "round-robin"

    def __init__(self) -> None:
        self.assignments: list[dict[str, MemberAssignment]] = []  # one per assign() on this member
        self.received: list[MemberAssignment] = []

    def subscription_user_data(self, topics: Sequence[str]) -> bytes:
        return ",".join(topics).encode()

    def assign(
        self,
        subscriptions: Mapping[str, MemberSubscription],
        partitions_per_topic: Mapping[str, int],
    ) -> dict[str, MemberAssignment]:
        dealt: dict[str, list[TopicPartition]] = {m: [] for m in subscriptions}
        for topic in sorted(partitions_per_topic):
            takers = sorted(m for m, s in subscriptions.items() if topic in s.topics)
            for p in range(partitions_per_topic[topic]):
                dealt[takers[p % len(takers)]].append(TopicPartition(topic, p))
        result = {m: MemberAssignment(tuple(tps)) for m, tps in dealt.items()}
        self.assignments.append(result)
        return result

    def on_assignment(self, assignment: MemberAssignment) -> None:
        self.received.append(assignment)


class RecordingListener:
    def __init__(
        self, on_revoked: Callable[[set[TopicPartition]], Awaitable[None]] | None = None
    ) -> None:
        self.events: list[tuple[str, frozenset[TopicPartition]]] = []
        self.on_revoked = on_revoked

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.events.append(("revoked", frozenset(revoked)))
        if self.on_revoked is not None:
            await self.on_revoked(revoked)

    def on_join_registered(self) -> None:
        pass

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.events.append(("assigned", frozenset(assigned)))


@dataclass
class Member:
    name: str
    consumer: MemoryConsumer
    listener: RecordingListener
    assignor: RoundRobinAssignor
    records: list[FetchedRecord] = field(default_factory=list)

    async def poll(self, timeout_ms: int = 20, max_records: int | None = None) -> None:
        batch = await self.consumer.poll(timeout_ms, max_records)
        for records in batch.values():
            self.records.extend(records)

    async def commit_positions(self) -> None:
        await self.consumer.commit(
            {tp: OffsetAndMetadata(await self.consumer.position(tp)) for tp in self.consumer.assignment()}
        )


# --------------------------------------------------------------------------- helpers


async def eventually(cond: Callable[[], bool], timeout: float, what: str) -> None:
    await eventually_async(cond, timeout=timeout, what=what)


async def poll_until(members: Sequence[Member], cond: Callable[[], bool], what: str, timeout: float = 5) -> None:
    """Poll every member concurrently (20 ms each) until ``cond`` holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"Timed out after {timeout} s waiting for {what}")
        await asyncio.gather(*(m.poll() for m in members))


def group_stable(broker: MemoryBroker, members: Sequence[Member]) -> Callable[[], bool]:
    """The group is STABLE with exactly ``members``, each using the current generation."""

    def check() -> bool:
        group = broker.describe_group(GROUP)
        return (
            group is not None
            and group.state is GroupState.STABLE
            and set(group.members) == {m.consumer.member_id for m in members}
            and all(m.consumer.generation == group.generation for m in members)
        )

    return check


def partitions(topic: str, count: int) -> set[TopicPartition]:
    return {TopicPartition(topic, p) for p in range(count)}


async def produce(transport: MemoryTransport, topic: str, partition: int, values: Iterable[bytes]) -> None:
    producer = transport.producer(ProducerSettings(client_id="test-producer"))
    await producer.start()
    for value in values:
        producer.append(topic, partition, None, value, 1, ())
    await producer.flush()
    await producer.close()


def values_of(records: Iterable[FetchedRecord]) -> list[bytes | None]:
    return [r.value for r in records]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start_ms=1_700_000_000_000)


@pytest.fixture
def broker(clock: ManualClock) -> MemoryBroker:
    return MemoryBroker(f"test-{next(_broker_names)}", clock=clock, seed=7)


@pytest.fixture
def transport(broker: MemoryBroker) -> MemoryTransport:
    return MemoryTransport(broker)


@pytest_asyncio.fixture
async def topic(transport: MemoryTransport) -> str:
    await transport.admin("test-admin").create_topics({TOPIC: 4})
    return TOPIC


@pytest_asyncio.fixture
async def member_factory(transport: MemoryTransport):
    made: list[Member] = []

    async def make(
        name: str,
        *,
        on_revoked: Callable[[set[TopicPartition]], Awaitable[None]] | None = None,
        start: bool = True,
        **overrides: object,
    ) -> Member:
        assignor = RoundRobinAssignor()
        consumer = transport.consumer(
            ConsumerSettings(group_id=GROUP, client_id=name, assignor=assignor, **overrides)  # type: ignore[arg-type]
        )
        listener = RecordingListener(on_revoked)
        consumer.subscribe([TOPIC], listener)
        if start:
            await consumer.start()
        member = Member(name, consumer, listener, assignor)
        made.append(member)
        return member

    yield make
    for member in made:
        await member.consumer.close()


# --------------------------------------------------------------------------- registry and admin


def test_brokers_are_shared_per_url_until_reset() -> None:
    url = f"memory://registry-{next(_broker_names)}"
    first = MemoryBroker.for_url(url)
    assert MemoryBroker.for_url(url) is first
    assert MemoryBroker.for_url("memory://") is MemoryBroker.for_url("memory://")
    assert MemoryBroker.for_url("memory://").name == ""

    MemoryBroker.reset(first.name)
    assert MemoryBroker.for_url(url) is not first
    own = MemoryBroker.install(MemoryBroker(first.name, seed=3))
    assert MemoryTransport.from_url(url).broker is own
    MemoryBroker.reset(first.name)


@pytest.mark.asyncio
async def test_create_topics_leaves_existing_topics_and_counts_skip_missing_ones(
    transport: MemoryTransport,
) -> None:
    admin = transport.admin("admin")
    await admin.create_topics({"a": 3})
    await admin.create_topics({"a": 5, "b": 1})

    assert await admin.partition_counts(["a", "b", "missing"]) == {"a": 3, "b": 1}


@pytest.mark.asyncio
async def test_deleted_topic_is_left_out_of_partition_counts(transport: MemoryTransport) -> None:
    admin = transport.admin("admin")
    await admin.create_topics({"a": 2, "b": 2})
    await admin.delete_topics(["a"])

    assert await admin.partition_counts(["a", "b"]) == {"b": 2}


# --------------------------------------------------------------------------- produce and read


@pytest.mark.asyncio
async def test_reader_reads_back_produced_records_in_offset_order(
    transport: MemoryTransport, topic: str, clock: ManualClock
) -> None:
    producer = transport.producer(ProducerSettings(client_id="p"))
    await producer.start()
    producer.append(topic, 1, b"k0", b"v0", 42, [("h", b"x")])
    producer.append(topic, 1, None, b"v1", None, ())
    producer.append(topic, 1, b"k2", None, 44, ())
    assert producer.buffered() == 3
    await producer.flush()
    assert producer.buffered() == 0

    reader = transport.reader("r")
    reader.assign([TopicPartition(topic, 1)])
    batch = await reader.poll(timeout_ms=1000)

    records = batch[TopicPartition(topic, 1)]
    assert [(r.offset, r.key, r.value) for r in records] == [(0, b"k0", b"v0"), (1, None, b"v1"), (2, b"k2", None)]
    assert [r.timestamp for r in records] == [42, clock.wall_ms(), 44]
    assert records[0].headers == (("h", b"x"),)
    assert await reader.end_offsets([TopicPartition(topic, 1)]) == {TopicPartition(topic, 1): 3}
    await reader.close()


@pytest.mark.asyncio
async def test_produce_to_a_missing_partition_raises_produce_error_naming_it(
    transport: MemoryTransport, topic: str
) -> None:
    producer = transport.producer(ProducerSettings(client_id="p"))
    producer.append(topic, 9, None, b"x", None, ())
    producer.append(topic, 0, None, b"kept", None, ())

    with pytest.raises(ProduceError, match=f"{topic}-9") as failure:
        await producer.send_buffered()

    assert (failure.value.topic, failure.value.partition) == (topic, 9)
    assert values_of(transport.broker.records(TopicPartition(topic, 0))) == [b"kept"]
    await producer.close()


@pytest.mark.asyncio
async def test_producer_stays_failed_after_a_produce_error(transport: MemoryTransport, topic: str) -> None:
    producer = transport.producer(ProducerSettings(client_id="p"))
    producer.append("nowhere", 0, None, b"x", None, ())
    with pytest.raises(ProduceError, match="topic 'nowhere' does not exist"):
        await producer.send_buffered()

    producer.append(topic, 0, None, b"not sent", None, ())
    with pytest.raises(ProduceError, match="nowhere-0"):
        await producer.flush()
    assert transport.broker.records(TopicPartition(topic, 0)) == []
    await producer.close()


@pytest.mark.asyncio
async def test_poll_returns_empty_after_its_timeout_when_nothing_arrives(
    transport: MemoryTransport, topic: str
) -> None:
    reader = transport.reader("r")
    reader.assign([TopicPartition(topic, 0)])
    loop = asyncio.get_running_loop()
    started = loop.time()

    assert await reader.poll(timeout_ms=50) == {}
    assert loop.time() - started >= 0.045
    await reader.close()


@pytest.mark.asyncio
async def test_waiting_poll_returns_as_soon_as_records_are_sent(
    transport: MemoryTransport, topic: str
) -> None:
    reader = transport.reader("r")
    reader.assign([TopicPartition(topic, 2)])
    loop = asyncio.get_running_loop()
    started = loop.time()

    batch, _ = await asyncio.gather(reader.poll(timeout_ms=10_000), produce(transport, topic, 2, [b"a"]))

    assert values_of(batch[TopicPartition(topic, 2)]) == [b"a"]
    assert loop.time() - started < 5
    await reader.close()


@pytest.mark.asyncio
async def test_poll_caps_records_and_shares_them_fairly_across_partitions(
    transport: MemoryTransport, topic: str
) -> None:
    for p in (0, 1):
        await produce(transport, topic, p, [b"%d-%d" % (p, i) for i in range(10)])
    reader = transport.reader("r")
    reader.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])

    first = await reader.poll(timeout_ms=0, max_records=6)
    second = await reader.poll(timeout_ms=0, max_records=6)

    assert {tp.partition: len(rs) for tp, rs in first.items()} == {0: 3, 1: 3}
    assert [r.offset for r in second[TopicPartition(topic, 0)]] == [3, 4, 5]
    assert [r.offset for r in second[TopicPartition(topic, 1)]] == [3, 4, 5]
    await reader.close()


@pytest.mark.asyncio
async def test_paused_partition_is_not_fetched_until_resumed(
    transport: MemoryTransport, topic: str
) -> None:
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    await produce(transport, topic, 0, [b"a"])
    await produce(transport, topic, 1, [b"b"])
    reader = transport.reader("r")
    reader.assign([tp0, tp1])
    reader.pause(tp0)

    assert reader.paused() == {tp0}
    assert set(await reader.poll(timeout_ms=0)) == {tp1}
    assert await reader.poll(timeout_ms=0) == {}

    reader.resume(tp0)
    assert values_of((await reader.poll(timeout_ms=0))[tp0]) == [b"a"]
    await reader.close()


@pytest.mark.asyncio
async def test_seek_makes_the_next_poll_start_at_that_offset(transport: MemoryTransport, topic: str) -> None:
    tp = TopicPartition(topic, 0)
    await produce(transport, topic, 0, [b"a", b"b", b"c"])
    reader = transport.reader("r")
    reader.assign([tp])
    await reader.poll(timeout_ms=0)
    assert await reader.position(tp) == 3

    reader.seek(tp, 1)

    assert values_of((await reader.poll(timeout_ms=0))[tp]) == [b"b", b"c"]
    await reader.close()


# --------------------------------------------------------------------------- consumer groups


@pytest.mark.asyncio
async def test_sole_member_is_assigned_every_partition(broker: MemoryBroker, topic: str, member_factory) -> None:
    a = await member_factory("a")

    await poll_until([a], group_stable(broker, [a]), "a alone in a stable group")

    assert a.consumer.assignment() == partitions(topic, 4)
    assert a.listener.events == [("assigned", frozenset(partitions(topic, 4)))]
    assert a.consumer.member_id is not None and a.consumer.member_id.startswith("a-")
    assert a.assignor.received[-1].partitions == tuple(sorted(partitions(topic, 4)))


@pytest.mark.asyncio
async def test_second_member_joining_revokes_then_splits_partitions_per_the_assignor(
    broker: MemoryBroker, topic: str, member_factory
) -> None:
    a = await member_factory("a")
    await poll_until([a], group_stable(broker, [a]), "a alone")
    b = await member_factory("b")

    await poll_until([a, b], group_stable(broker, [a, b]), "a and b stable")

    everything = frozenset(partitions(topic, 4))
    split = a.assignor.assignments[-1]  # a is the leader: it joined first
    assert a.listener.events == [
        ("assigned", everything),
        ("revoked", everything),
        ("assigned", frozenset(split[a.consumer.member_id].partitions)),
    ]
    assert b.listener.events == [("assigned", frozenset(split[b.consumer.member_id].partitions))]
    assert a.consumer.assignment() | b.consumer.assignment() == everything
    assert not a.consumer.assignment() & b.consumer.assignment()


@pytest.mark.asyncio
async def test_leader_is_the_longest_standing_member(broker: MemoryBroker, topic: str, member_factory) -> None:
    a = await member_factory("a")
    await poll_until([a], group_stable(broker, [a]), "a alone")
    b = await member_factory("b")
    await poll_until([a, b], group_stable(broker, [a, b]), "a and b")
    assert (len(a.assignor.assignments), len(b.assignor.assignments)) == (2, 0)

    await a.consumer.close()
    await poll_until([b], group_stable(broker, [b]), "b alone")

    assert len(b.assignor.assignments) == 1


@pytest.mark.asyncio
async def test_member_leaving_the_group_rebalances_the_others_at_once(
    broker: MemoryBroker, transport: MemoryTransport, topic: str, member_factory
) -> None:
    a = await member_factory("a")
    b = await member_factory("b")
    await poll_until([a, b], group_stable(broker, [a, b]), "a and b")
    b_had = frozenset(b.consumer.assignment())
    a_had = min(a.consumer.assignment())
    await produce(transport, topic, a_had.partition, [b"for a"])
    loop = asyncio.get_running_loop()
    started = loop.time()

    # b waits in a long poll; a's leave wakes it, and it returns with a's record.
    polling = asyncio.ensure_future(b.poll(timeout_ms=10_000))
    await a.consumer.close(leave_group=True)
    await asyncio.wait_for(polling, 5)

    assert loop.time() - started < 5
    assert values_of(b.records) == [b"for a"]
    assert b.listener.events[-2:] == [("revoked", b_had), ("assigned", frozenset(partitions(topic, 4)))]


@pytest.mark.asyncio
async def test_request_rejoin_rebalances_the_whole_group(broker: MemoryBroker, topic: str, member_factory) -> None:
    a = await member_factory("a")
    b = await member_factory("b")
    await poll_until([a, b], group_stable(broker, [a, b]), "a and b")
    generation = a.consumer.generation
    assert generation is not None

    b.consumer.request_rejoin()
    await poll_until(
        [a, b],
        lambda: group_stable(broker, [a, b])() and a.consumer.generation == generation + 1,
        "the next generation",
    )

    assert [kind for kind, _ in a.listener.events[-2:]] == ["revoked", "assigned"]
    assert [kind for kind, _ in b.listener.events[-2:]] == ["revoked", "assigned"]


@pytest.mark.asyncio
async def test_offsets_committed_inside_on_partitions_revoked_are_accepted(
    broker: MemoryBroker, transport: MemoryTransport, topic: str, member_factory
) -> None:
    await produce(transport, topic, 0, [b"a", b"b"])
    commit_errors: list[BaseException] = []

    async def commit_on_revoke(revoked: set[TopicPartition]) -> None:
        try:
            await a.commit_positions()
        except BaseException as error:
            commit_errors.append(error)
            raise

    a = await member_factory("a", on_revoked=commit_on_revoke)
    await poll_until([a], lambda: len(a.records) == 2, "a read both records")
    b = await member_factory("b")

    await poll_until([a, b], group_stable(broker, [a, b]), "a and b")

    assert commit_errors == []
    assert await b.consumer.committed(TopicPartition(topic, 0)) == OffsetAndMetadata(2)


@pytest.mark.asyncio
async def test_commit_for_a_partition_another_member_owns_is_refused(
    broker: MemoryBroker, topic: str, member_factory
) -> None:
    a = await member_factory("a")
    b = await member_factory("b")
    await poll_until([a, b], group_stable(broker, [a, b]), "a and b")
    owned_by_b = min(b.consumer.assignment())

    with pytest.raises(CommitFailedError, match=str(owned_by_b)):
        await a.consumer.commit({owned_by_b: OffsetAndMetadata(1)})

    assert await a.consumer.committed(owned_by_b) is None


@pytest.mark.asyncio
async def test_commit_after_the_member_rejoined_is_refused_for_revoked_partitions(
    broker: MemoryBroker, topic: str, member_factory
) -> None:
    a = await member_factory("a")
    await poll_until([a], group_stable(broker, [a]), "a alone")
    b = await member_factory("b")
    await poll_until([a, b], group_stable(broker, [a, b]), "a and b")
    moved = min(b.consumer.assignment())

    with pytest.raises(CommitFailedError):
        await a.consumer.commit({moved: OffsetAndMetadata(0)})


@pytest.mark.asyncio
async def test_new_owner_restarts_from_the_committed_offset_and_gets_the_uncommitted_tail_again(
    broker: MemoryBroker, transport: MemoryTransport, topic: str, member_factory
) -> None:
    tp = TopicPartition(topic, 0)
    await produce(transport, topic, 0, [b"r%d" % i for i in range(10)])
    a = await member_factory("a")
    await poll_until([a], lambda: len(a.records) == 10, "a read all ten")
    await a.consumer.commit({tp: OffsetAndMetadata(4)})
    await a.consumer.close(leave_group=True)

    b = await member_factory("b")
    await poll_until([b], lambda: len(b.records) == 6, "b read the uncommitted tail")

    assert [r.offset for r in b.records] == [4, 5, 6, 7, 8, 9]


@pytest.mark.asyncio
async def test_auto_offset_reset_latest_starts_at_the_log_end(
    broker: MemoryBroker, transport: MemoryTransport, topic: str, member_factory
) -> None:
    await produce(transport, topic, 0, [b"old"])
    a = await member_factory("a", auto_offset_reset="latest")
    await poll_until([a], group_stable(broker, [a]), "a alone")
    await produce(transport, topic, 0, [b"new"])

    await poll_until([a], lambda: len(a.records) == 1, "a read the new record")

    assert values_of(a.records) == [b"new"]


@pytest.mark.asyncio
async def test_auto_offset_reset_none_without_a_committed_offset_is_an_error(
    transport: MemoryTransport, topic: str, member_factory
) -> None:
    a = await member_factory("a", auto_offset_reset="none")

    with pytest.raises(TransportError, match="no valid committed offset"):
        for _ in range(10):
            await a.poll()


@pytest.mark.asyncio
async def test_poll_from_inside_a_rebalance_callback_is_refused(topic: str, member_factory) -> None:
    async def poll_again(revoked: set[TopicPartition]) -> None:
        await a.consumer.poll(0)

    a = await member_factory("a", on_revoked=poll_again)
    await a.poll()
    a.consumer.request_rejoin()

    with pytest.raises(IllegalStateError, match="already running"):
        await a.poll()


@pytest.mark.asyncio
async def test_member_that_stops_polling_is_removed_after_max_poll_interval(
    broker: MemoryBroker, clock: ManualClock, topic: str, member_factory
) -> None:
    a = await member_factory("a", max_poll_interval_ms=10_000)
    b = await member_factory("b", max_poll_interval_ms=10_000)
    await poll_until([a, b], group_stable(broker, [a, b]), "a and b")

    clock.advance(6_000)
    await a.poll()
    assert group_stable(broker, [a, b])()  # b is idle, but not for long enough yet
    clock.advance(6_000)
    await poll_until([a], group_stable(broker, [a]), "b removed")

    assert a.consumer.assignment() == partitions(topic, 4)


@pytest.mark.asyncio
async def test_member_closed_without_leaving_is_removed_after_session_timeout(
    broker: MemoryBroker, clock: ManualClock, topic: str, member_factory
) -> None:
    a = await member_factory("a")
    b = await member_factory("b", session_timeout_ms=3_000)
    await poll_until([a, b], group_stable(broker, [a, b]), "a and b")
    b_id = b.consumer.member_id

    await b.consumer.close(leave_group=False)
    await a.poll()
    assert b_id in broker.describe_group(GROUP).members  # type: ignore[union-attr]

    clock.advance(3_500)
    await poll_until([a], lambda: a.consumer.assignment() == partitions(topic, 4), "a took over")
    assert b_id not in broker.describe_group(GROUP).members  # type: ignore[union-attr]


@pytest.mark.asyncio
async def test_member_stuck_in_its_revoke_callback_is_dropped_from_the_barrier_after_max_poll_interval(
    broker: MemoryBroker, clock: ManualClock, topic: str, member_factory
) -> None:
    release = asyncio.Event()

    async def stuck(revoked: set[TopicPartition]) -> None:
        await release.wait()

    a = await member_factory("a", max_poll_interval_ms=10_000)
    b = await member_factory("b", max_poll_interval_ms=10_000, on_revoked=stuck)
    await poll_until([a, b], group_stable(broker, [a, b]), "a and b")

    c = await member_factory("c", max_poll_interval_ms=10_000)
    b_polling = asyncio.ensure_future(b.poll(timeout_ms=50))
    await poll_until([a, c], lambda: b.listener.events[-1][0] == "revoked", "b inside its revoke callback")
    await asyncio.gather(a.poll(), c.poll())
    assert broker.describe_group(GROUP).state is GroupState.PREPARING_REBALANCE  # type: ignore[union-attr]

    clock.advance(11_000)
    await poll_until([a, c], group_stable(broker, [a, c]), "the barrier fell without b")
    assert a.consumer.assignment() | c.consumer.assignment() == partitions(topic, 4)

    release.set()
    await asyncio.wait_for(b_polling, 5)


@pytest.mark.asyncio
async def test_static_member_returning_takes_over_its_assignment_without_a_rebalance(
    broker: MemoryBroker, topic: str, member_factory
) -> None:
    a = await member_factory("a")
    b = await member_factory("b", group_instance_id="b-static")
    await poll_until([a, b], group_stable(broker, [a, b]), "a and b")
    generation, b_had = b.consumer.generation, b.consumer.assignment()
    await b.consumer.close(leave_group=False)

    b2 = await member_factory("b2", group_instance_id="b-static")
    await poll_until([a, b2], group_stable(broker, [a, b2]), "b2 in b's place")

    assert b2.consumer.assignment() == b_had
    assert b2.consumer.generation == a.consumer.generation == generation
    assert [kind for kind, _ in a.listener.events] == ["assigned"]


@pytest.mark.asyncio
async def test_a_second_consumer_with_the_same_group_instance_id_fences_the_first(
    broker: MemoryBroker, topic: str, member_factory
) -> None:
    first = await member_factory("first", group_instance_id="static")
    await poll_until([first], group_stable(broker, [first]), "first alone")

    second = await member_factory("second", group_instance_id="static")
    await poll_until([second], group_stable(broker, [second]), "second in first's place")

    with pytest.raises(TransportError, match="fenced"):
        await first.poll()
    assert first.listener.events[-1] == ("revoked", frozenset(partitions(topic, 4)))


@pytest.mark.asyncio
async def test_creating_a_subscribed_topic_rebalances_the_group(
    broker: MemoryBroker, transport: MemoryTransport, member_factory
) -> None:
    a = await member_factory("a")
    await poll_until([a], group_stable(broker, [a]), "a alone, with nothing to consume")
    assert a.consumer.assignment() == set()

    await transport.admin("admin").create_topics({TOPIC: 2})

    await poll_until([a], lambda: a.consumer.assignment() == partitions(TOPIC, 2), "a assigned the new topic")


# --------------------------------------------------------------------------- threads


@pytest.mark.asyncio
async def test_members_on_two_threads_with_their_own_loops_consume_every_record_exactly_once() -> None:
    name = f"threads-{next(_broker_names)}"
    url = f"memory://{name}"
    transport = MemoryTransport.from_url(url)
    await transport.admin("admin").create_topics({TOPIC: 4})
    stop = threading.Event()
    lock = threading.Lock()
    consumed: list[tuple[str, int, int]] = []
    callback_threads: dict[str, set[int]] = defaultdict(set)
    errors: list[BaseException] = []

    class CommittingListener:
        def __init__(self, who: str, consumer: MemoryConsumer) -> None:
            self.who, self.consumer = who, consumer

        async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
            callback_threads[self.who].add(threading.get_ident())
            await self.consumer.commit({tp: OffsetAndMetadata(await self.consumer.position(tp)) for tp in revoked})

        def on_join_registered(self) -> None:
            pass

        async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
            callback_threads[self.who].add(threading.get_ident())

    async def consume(who: str) -> None:
        consumer = MemoryTransport.from_url(url).consumer(
            ConsumerSettings(group_id=GROUP, client_id=who, assignor=RoundRobinAssignor())
        )
        consumer.subscribe([TOPIC], CommittingListener(who, consumer))
        await consumer.start()
        try:
            while not stop.is_set():
                batch = await consumer.poll(timeout_ms=20)
                with lock:
                    consumed.extend((who, r.partition, r.offset) for rs in batch.values() for r in rs)
                await consumer.commit({tp: OffsetAndMetadata(rs[-1].offset + 1) for tp, rs in batch.items()})
        finally:
            await consumer.close()

    def thread_main(who: str) -> None:
        callback_threads[who + "-thread"].add(threading.get_ident())
        try:
            asyncio.run(consume(who))
        except BaseException as error:
            errors.append(error)

    def count(who: str | None = None) -> int:
        with lock:
            return sum(1 for w, _, _ in consumed if who is None or w == who)

    def members() -> Mapping[str, frozenset[TopicPartition]]:
        group = transport.broker.describe_group(GROUP)
        return group.members if group is not None and group.state is GroupState.STABLE else {}

    async def produce_round(start: int) -> None:
        for p in range(4):
            await produce(transport, TOPIC, p, [b"%d" % i for i in range(start, start + 25)])

    threads = [threading.Thread(target=thread_main, args=(who,)) for who in ("t1", "t2")]
    try:
        threads[0].start()
        await eventually(lambda: len(members()) == 1, 5, "t1 alone in a stable group")
        await produce_round(0)
        await eventually(lambda: count("t1") >= 10, 5, "t1 consuming")
        threads[1].start()
        await eventually(
            lambda: len(members()) == 2 and all(len(tps) == 2 for tps in members().values()),
            5,
            "t1 and t2 sharing the partitions",
        )
        await produce_round(25)
        await eventually(lambda: count() >= 200 or bool(errors), 10, "all 200 records consumed")
    finally:
        stop.set()
        for thread in threads:
            await asyncio.to_thread(thread.join, 10)
        MemoryBroker.reset(name)

    assert errors == []
    delivered = Counter((p, o) for _, p, o in consumed)
    assert delivered == Counter({(p, o): 1 for p in range(4) for o in range(50)})
    assert count("t2") > 0
    for who in ("t1", "t2"):
        assert callback_threads[who] == callback_threads[who + "-thread"]


# --------------------------------------------------------------------------- properties

PARTITIONS = 3
member_index = st.integers(0, 7)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("produce"), st.integers(0, PARTITIONS - 1), st.integers(1, 4)),
        st.tuples(st.just("join"), st.booleans()),
        st.tuples(st.just("leave"), member_index),
        st.tuples(st.just("poll"), member_index, st.integers(1, 6)),
        st.tuples(st.just("commit"), member_index),
        st.tuples(st.just("rejoin"), member_index),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations, seed=st.integers(0, 2**32 - 1))
def test_every_record_reaches_some_member_and_no_partition_has_two_owners(
    ops: list[tuple], seed: int
) -> None:
    asyncio.run(_group_scenario(ops, seed))


async def _group_scenario(ops: list[tuple], seed: int) -> None:
    broker = MemoryBroker("property", clock=ManualClock(), seed=seed)
    transport = MemoryTransport(broker)
    await transport.admin("admin").create_topics({TOPIC: PARTITIONS})
    producer = transport.producer(ProducerSettings(client_id="p"))
    produced: set[tuple[int, int]] = set()
    deliveries: dict[tuple[int | None, int, int], str] = {}  # (generation, partition, offset) → member
    live: list[Member] = []
    names = itertools.count()

    def check_owners() -> None:
        local = [m.consumer.assignment() for m in live]
        assert sum(len(a) for a in local) == len(set().union(*local)), "two members hold one partition"
        group = broker.describe_group(GROUP)
        if group is not None:
            owned = list(group.members.values())
            assert sum(len(o) for o in owned) == len(set().union(*owned)), "the broker gave a partition twice"

    async def poll(member: Member, max_records: int) -> None:
        batch = await member.consumer.poll(0, max_records)
        generation = member.consumer.generation
        for tp, records in batch.items():
            assert tp in member.consumer.assignment()
            for record in records:
                key = (generation, record.partition, record.offset)
                assert key not in deliveries, f"{key} delivered to {deliveries[key]} and {member.name}"
                deliveries[key] = member.name

    async def join(commit_on_revoke: bool) -> None:
        assignor = RoundRobinAssignor()
        name = f"m{next(names)}"
        consumer = transport.consumer(ConsumerSettings(group_id=GROUP, client_id=name, assignor=assignor))
        member = Member(name, consumer, RecordingListener(), assignor)
        if commit_on_revoke:
            member.listener.on_revoked = lambda revoked: member.commit_positions()
        consumer.subscribe([TOPIC], member.listener)
        await consumer.start()
        live.append(member)

    for op in ops:
        kind = op[0]
        if kind == "produce":
            for _i in range(op[2]):
                producer.append(TOPIC, op[1], None, b"v", None, ())
            await producer.flush()
            end = broker.end_offsets([TopicPartition(TOPIC, op[1])])[TopicPartition(TOPIC, op[1])]
            produced.update((op[1], o) for o in range(end))
        elif kind == "join":
            if len(live) < 4:
                await join(op[1])
        elif live:
            member = live[op[1] % len(live)]
            if kind == "leave":
                live.remove(member)
                await member.consumer.close(leave_group=True)
            elif kind == "poll":
                await poll(member, op[2])
            elif kind == "commit":
                await member.commit_positions()  # an owner's commit is never refused
            elif kind == "rejoin":
                member.consumer.request_rejoin()
        check_owners()

    if not live:
        await join(False)
    for _ in range(200):
        if produced <= {(p, o) for _, p, o in deliveries}:
            break
        for member in live:
            await poll(member, 50)
            check_owners()
    assert produced <= {(p, o) for _, p, o in deliveries}, "some records were never delivered"
    for member in live:
        await member.consumer.close()
