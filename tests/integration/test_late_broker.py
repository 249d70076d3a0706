"""The late broker (tests/support/late_broker.py) with plain aiokafka clients.

Each test measures on the client side (when aiokafka's rebalance listener is called, when a raw
request's answer arrives) against when the broker's answer reached the proxy, so a proxy that
held too little, too much or the wrong answers fails here. The broker runs at Kafka's default
group settings: the first rebalance of a new group waits ``group.initial.rebalance.delay.ms``
(3 s, and 3 s more when a second member joins in that time), which every test here pays once.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.protocol.admin import ApiVersionRequest_v0
from aiokafka.protocol.group import JoinGroupRequest_v5, LeaveGroupRequest_v1
from aiokafka.structs import TopicPartition

from streamloop.testing import eventually_async
from tests.support import kafka_frames as frames
from tests.support import kafka_wire as wire
from tests.support.late_broker import KAFKA_GROUP_DEFAULTS, GroupCall, GroupDelays, LateKafka

pytestmark = pytest.mark.kafka

DEADLINE = 20.0
# How much later than configured a held answer may reach the client: the proxy's timer, the
# loops of a loaded 2-core machine and aiokafka's own scheduling.
MARGIN = 0.75
# An answer the proxy must not hold still takes a few milliseconds through it.
AT_ONCE = 0.1
MEMBER_ID_REQUIRED = 79


@dataclass
class Member:
    """An aiokafka group consumer and when its rebalance listener was told of assignments."""

    client_id: str
    consumer: AIOKafkaConsumer
    assigned: list[tuple[float, frozenset[TopicPartition]]] = field(default_factory=list)

    @property
    def assigned_at(self) -> float:
        return self.assigned[-1][0]


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, member: Member) -> None:
        self.member = member

    async def on_partitions_revoked(self, revoked: object) -> None:
        pass

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.member.assigned.append((time.monotonic(), frozenset(assigned)))


@pytest_asyncio.fixture
async def topic(late_kafka: LateKafka) -> str:
    name = f"late-{uuid.uuid4().hex[:10]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=late_kafka.bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, num_partitions=2, replication_factor=1)])
    finally:
        await admin.close()
    return name


@pytest_asyncio.fixture
async def members(late_kafka: LateKafka) -> AsyncIterator[Callable[..., Member]]:
    """``join(client_id)`` starts a member of the test's group on the test's topic (later)."""
    started: list[Member] = []

    def make(client_id: str, group: str) -> Member:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=late_kafka.bootstrap,
            group_id=group,
            client_id=client_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            # Kafka's default group.min.session.timeout.ms is 6 s; a short heartbeat interval
            # lets members learn of a rebalance quickly.
            session_timeout_ms=10_000,
            heartbeat_interval_ms=300,
        )
        member = Member(client_id, consumer)
        started.append(member)
        return member

    yield make
    # A member stopping waits for its group answers: release what the proxy holds first.
    late_kafka.set_delays(GroupDelays())
    await asyncio.gather(*(m.consumer.stop() for m in started), return_exceptions=True)


async def join(member: Member, topic: str) -> None:
    await member.consumer.start()
    member.consumer.subscribe([topic], listener=_Listener(member))


async def all_assigned(group: list[Member], partitions: int = 2) -> None:
    """Wait until the members' latest assignments cover the topic's partitions between them."""

    def covered() -> bool:
        if not all(m.assigned for m in group):
            return False
        latest = [m.assigned[-1][1] for m in group]
        return sum(len(a) for a in latest) == partitions and len(frozenset().union(*latest)) == partitions

    await eventually_async(covered, DEADLINE, "every partition to be assigned", interval=0.02)


def held(call: GroupCall) -> float:
    assert call.held_s is not None, f"not released: {call}"
    return call.held_s


def last_syncs(kafka: LateKafka, group: str) -> tuple[GroupCall, GroupCall]:
    """The leader's and the follower's successful SyncGroup of the group's last generation."""
    generation = kafka.record.last_generation(group)
    syncs = [c for c in kafka.record.syncs(group_id=group) if c.generation_id == generation]
    leaders = [c for c in syncs if c.leader]
    followers = [c for c in syncs if not c.leader]
    assert len(leaders) == 1 and len(followers) == 1, kafka.record.summary()
    return leaders[0], followers[0]


def by_client(group: list[Member], client_id: str | None) -> Member:
    return next(m for m in group if m.client_id == client_id)


def test_the_broker_has_kafkas_default_group_settings(late_kafka: LateKafka, kafka_defaults_bootstrap: str) -> None:
    broker = late_kafka.broker
    assert broker.dir is not None
    props = dict(
        line.split("=", 1) for line in (broker.dir / "server.properties").read_text().splitlines() if "=" in line
    )
    assert {k: props[k] for k in KAFKA_GROUP_DEFAULTS} == {k: str(v) for k, v in KAFKA_GROUP_DEFAULTS.items()}
    assert props["advertised.listeners"] == f"PLAINTEXT://{late_kafka.proxy.address}"
    assert kafka_defaults_bootstrap == late_kafka.bootstrap != broker.bootstrap
    # Below the ephemeral range, like the broker's own ports.
    assert 20_000 <= late_kafka.proxy.port < 32_000
    assert late_kafka.proxy.delays == GroupDelays()


@pytest.mark.asyncio
async def test_the_leaders_sync_answer_is_held_and_the_followers_longer(
    late_kafka: LateKafka, topic: str, members: Callable[..., Member]
) -> None:
    late_kafka.set_delays(GroupDelays(leader_sync_s=1.0, follower_sync_s=2.0))
    group = f"group-{topic}"
    both = [members("late-a", group), members("late-b", group)]
    await asyncio.gather(*(join(m, topic) for m in both))
    await all_assigned(both)

    record = late_kafka.record
    leader_sync, follower_sync = last_syncs(late_kafka, group)
    print(f"\n{record.summary()}")
    # The broker answers the follower's SyncGroup together with the leader's; the proxy hands
    # them on 1 s and 2 s later, and the clients get them then.
    assert leader_sync.answered_at is not None and follower_sync.answered_at is not None
    assert abs(leader_sync.answered_at - follower_sync.answered_at) < 0.5
    assert 1.0 <= held(leader_sync) < 1.0 + MARGIN
    assert 2.0 <= held(follower_sync) < 2.0 + MARGIN
    for sync in (leader_sync, follower_sync):
        assert sync.answered_at is not None
        seen = by_client(both, sync.client_id).assigned_at - sync.answered_at
        expected = 1.0 if sync.leader else 2.0
        assert expected <= seen < expected + MARGIN, (sync.client_id, seen)
    # The leader is who the JoinGroup answers named.
    leader_id = {c.leader_id for c in record.joins(group_id=group) if c.generation_id == leader_sync.generation_id}
    assert leader_id == {leader_sync.member_id}
    # JoinGroup was not held.
    assert all(held(c) < AT_ONCE for c in record.join_requests(group_id=group) if c.released_at is not None)
    # The group is stable from when the last member (the follower) was handed its assignment.
    assert await record.wait_until_stable(group, timeout=DEADLINE) == follower_sync.released_at


@pytest.mark.asyncio
async def test_join_answers_are_held_and_errors_are_not(
    late_kafka: LateKafka, topic: str, members: Callable[..., Member]
) -> None:
    late_kafka.set_delays(GroupDelays(join_s=1.5))
    group = f"group-{topic}"
    both = [members("late-a", group), members("late-b", group)]
    await asyncio.gather(*(join(m, topic) for m in both))
    await all_assigned(both)

    record = late_kafka.record
    print(f"\n{record.summary()}")
    requests = record.join_requests(group_id=group)
    errors = [c for c in requests if not c.ok]
    # Each member's first JoinGroup is answered MEMBER_ID_REQUIRED; that goes through at once,
    # and the member rejoins with its new id right away.
    assert sorted((c.client_id, c.error_code) for c in errors) == [
        ("late-a", MEMBER_ID_REQUIRED),
        ("late-b", MEMBER_ID_REQUIRED),
    ]
    for error in errors:
        assert held(error) < AT_ONCE
        rejoin = next(c for c in requests if c.client_id == error.client_id and c.requested_at > error.requested_at)
        assert rejoin.member_id == error.assigned_member_id
        assert rejoin.requested_at - error.requested_at < 0.5
    generation = record.last_generation(group)
    answers = [c for c in record.joins(group_id=group) if c.generation_id == generation]
    assert sorted(str(c.client_id) for c in answers) == ["late-a", "late-b"]
    for answer in answers:
        assert answer.answered_at is not None
        assert 1.5 <= held(answer) < 1.5 + MARGIN
        # Seen by the client: its assignment came 1.5 s after the broker answered (the SyncGroup
        # that follows is not held).
        seen = by_client(both, answer.client_id).assigned_at - answer.answered_at
        assert 1.5 <= seen < 1.5 + MARGIN, (answer.client_id, seen)
    assert all(held(c) < AT_ONCE for c in record.syncs(group_id=group))


@pytest.mark.asyncio
async def test_with_the_delays_at_zero_answers_come_at_once(
    late_kafka: LateKafka, topic: str, members: Callable[..., Member]
) -> None:
    group = f"group-{topic}"
    both = [members("late-a", group), members("late-b", group)]
    await asyncio.gather(*(join(m, topic) for m in both))
    await all_assigned(both)

    record = late_kafka.record
    calls = [c for c in record.calls(group_id=group) if c.released_at is not None]
    assert {c.api for c in calls} == {"JoinGroup", "SyncGroup"}
    assert all(held(c) < AT_ONCE for c in calls), record.summary()
    for sync in last_syncs(late_kafka, group):
        assert sync.answered_at is not None
        assert by_client(both, sync.client_id).assigned_at - sync.answered_at < 0.5
    # aiokafka 0.14 against Kafka 4.1: JoinGroup v5 and SyncGroup v3 (neither flexible), and
    # every frame through the proxy was understood.
    seen = late_kafka.proxy.api_versions_seen()
    print(f"\napi versions seen: { {k: sorted(v) for k, v in sorted(seen.items())} }")
    assert seen[wire.JOIN_GROUP] == {5}
    assert seen[wire.SYNC_GROUP] == {3}
    assert late_kafka.proxy.unparsed_frames == 0


@pytest.mark.asyncio
async def test_other_requests_are_not_delayed_while_a_join_answer_is_held(
    late_kafka: LateKafka, topic: str, members: Callable[..., Member]
) -> None:
    late_kafka.set_delays(GroupDelays(join_s=30.0, leader_sync_s=30.0))
    group = f"group-{topic}"
    member = members("late-held", group)
    await join(member, topic)
    record = late_kafka.record

    def held_now() -> bool:
        return any(c.ok and c.released_at is None for c in record.joins(group_id=group))

    await eventually_async(held_now, DEADLINE, "a JoinGroup answer to be held", interval=0.02)

    producer = AIOKafkaProducer(bootstrap_servers=late_kafka.bootstrap, linger_ms=0)
    reader = AIOKafkaConsumer(bootstrap_servers=late_kafka.bootstrap, auto_offset_reset="earliest")
    admin = AIOKafkaAdminClient(bootstrap_servers=late_kafka.bootstrap)
    await asyncio.gather(producer.start(), reader.start(), admin.start())
    try:
        started = time.monotonic()
        await producer.send_and_wait(topic, b"v", partition=0)
        produced = time.monotonic() - started

        started = time.monotonic()
        await admin.describe_cluster()
        described = time.monotonic() - started

        tp = TopicPartition(topic, 0)
        reader.assign([tp])
        started = time.monotonic()
        fetched: list[bytes] = []
        while not fetched:
            assert time.monotonic() - started < DEADLINE
            batch = await reader.getmany(tp, timeout_ms=100)
            fetched += [r.value for r in batch.get(tp, [])]
        fetch = time.monotonic() - started
    finally:
        await asyncio.gather(producer.stop(), reader.stop(), admin.close(), return_exceptions=True)
    print(f"\nproduce {produced:.3f} s, metadata {described:.3f} s, fetch {fetch:.3f} s")
    assert fetched == [b"v"]
    assert produced < 1.0 and described < 1.0 and fetch < 1.0
    assert held_now()  # all of that while the JoinGroup answer was still held


@pytest.mark.asyncio
async def test_lowering_the_delays_releases_held_answers(
    late_kafka: LateKafka, topic: str, members: Callable[..., Member]
) -> None:
    late_kafka.set_delays(GroupDelays(join_s=30.0))
    group = f"group-{topic}"
    member = members("late-a", group)
    await join(member, topic)
    record = late_kafka.record
    await eventually_async(
        lambda: any(c.ok for c in record.joins(group_id=group)), DEADLINE, "a JoinGroup answer", interval=0.02
    )
    # From another thread, as a test driving an app on other loops would.
    changed_at = time.monotonic()
    await asyncio.to_thread(late_kafka.set_delays, GroupDelays())
    await all_assigned([member])
    answer = record.joins(group_id=group)[-1]
    assert answer.released_at is not None
    assert 0 <= answer.released_at - changed_at < 0.5
    assert member.assigned_at - changed_at < 1.0


@pytest.mark.asyncio
async def test_a_held_answer_holds_the_answers_behind_it_on_its_connection(late_kafka: LateKafka) -> None:
    late_kafka.set_delays(GroupDelays(join_s=1.5))
    group = f"raw-{uuid.uuid4().hex[:10]}"
    conn = await frames.RawConnection.open(late_kafka.bootstrap)
    other = await frames.RawConnection.open(late_kafka.bootstrap)
    try:

        def join_request(member_id: str) -> JoinGroupRequest_v5:
            return JoinGroupRequest_v5(group, 10_000, 10_000, member_id, None, "consumer", [("range", b"")])

        conn.send(join_request(""), "raw-a")
        _, frame, _ = await conn.receive()
        first = wire.parse_join_group_response(frame, 5)
        assert first.error_code == MEMBER_ID_REQUIRED

        # The JoinGroup and, right behind it on the same connection, an ApiVersions request.
        join_id = conn.send(join_request(first.member_id or ""), "raw-a")
        versions_id = conn.send(ApiVersionRequest_v0(), "raw-a")
        await eventually_async(
            lambda: any(c.ok for c in late_kafka.record.joins(group_id=group)), DEADLINE, "the JoinGroup answer",
            interval=0.01,
        )
        # Meanwhile another connection is answered at once.
        asked = time.monotonic()
        other.send(ApiVersionRequest_v0(), "raw-b")
        await other.receive()
        assert time.monotonic() - asked < AT_ONCE * 5

        answers = [await conn.receive(), await conn.receive()]
        assert [a[0] for a in answers] == [join_id, versions_id]  # in order
        answer = late_kafka.record.joins(group_id=group)[-1]
        assert answer.answered_at is not None
        assert wire.parse_join_group_response(answers[0][1], 5).generation_id == answer.generation_id == 1
        # The broker answered ApiVersions right after the JoinGroup (one request per connection
        # at a time); it reached the client only after the held JoinGroup answer.
        for _, _, arrived in answers:
            assert 1.5 <= arrived - answer.answered_at < 1.5 + MARGIN
        conn.send(LeaveGroupRequest_v1(group, answer.assigned_member_id), "raw-a")
        _, frame, _ = await conn.receive()
        assert wire.parse_leave_group_response(frame, 1) == 0
        assert late_kafka.record.calls("LeaveGroup", group_id=group)[-1].ok
    finally:
        await conn.close()
        await other.close()


@pytest.mark.asyncio
async def test_the_record_tells_generations_and_who_rejoined_when(
    late_kafka: LateKafka, topic: str, members: Callable[..., Member]
) -> None:
    group = f"group-{topic}"
    record = late_kafka.record
    first = [members("late-a", group), members("late-b", group)]
    await asyncio.gather(*(join(m, topic) for m in first))
    await all_assigned(first)
    settled = await record.wait_until_stable(group, timeout=DEADLINE)
    assert record.generations(group) == [1]
    await record.expect_no_join_requests(0.5, group_id=group)

    third = members("late-c", group)
    await join(third, topic)
    resettled = await record.wait_until_stable(group, 2, timeout=DEADLINE)
    await all_assigned([*first, third])
    print(f"\n{record.summary()}")

    assert record.generations(group) == [1, 2]
    assert record.last_generation(group) == 2
    rejoins = record.join_requests_since(settled, group_id=group)
    # The newcomer's first JoinGroup came while generation 1 was stable and started the
    # rebalance; the others came during it.
    assert rejoins[0].client_id == "late-c" and rejoins[0].while_stable is True
    assert all(c.while_stable is False for c in rejoins[1:])
    assert {c.client_id for c in rejoins} == {"late-a", "late-b", "late-c"}
    assert [c.client_id for c in record.join_requests_since(settled, "late-a")] == ["late-a"]
    assert record.generation_members(group, 2) == {c.assigned_member_id for c in rejoins if c.ok}
    assert resettled > settled
    with pytest.raises(AssertionError, match="late-a sent a JoinGroup"):
        # A member that leaves makes the others rejoin: the quiet period is broken.
        await third.consumer.stop()
        await record.expect_no_join_requests(DEADLINE, group_id=group, client_prefix="late-a")
