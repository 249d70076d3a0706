"""The aiokafka transport against a real single-node Kafka broker."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence

import pytest

from streamloop.errors import CommitFailedError, ProduceError
from streamloop.records import TopicPartition
from streamloop.testing import eventually_async
from streamloop.transport.base import (
    ConsumerSettings,
    MemberAssignment,
    MemberSubscription,
    OffsetAndMetadata,
    ProducerSettings,
)
from streamloop.transport.kafka import KafkaConsumer, KafkaTransport, is_retriable

pytestmark = [pytest.mark.kafka, pytest.mark.asyncio]

DEADLINE = 30.0


@pytest.fixture
def transport(kafka_bootstrap: str) -> KafkaTransport:
    return KafkaTransport(kafka_bootstrap)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def wait_until(
    condition: Callable[[], bool], what: str, timeout: float = DEADLINE
) -> None:
    await eventually_async(condition, timeout, what, interval=0.02)


async def create_topic(transport: KafkaTransport, partitions: int = 4) -> str:
    topic = _name("topic")
    admin = transport.admin("test-admin")
    await admin.start()
    try:
        await admin.create_topics({topic: partitions})
    finally:
        await admin.close()
    return topic


async def produce(
    transport: KafkaTransport,
    records: Sequence[tuple[str, int, bytes | None, bytes | None]],
    **settings: object,
) -> None:
    producer = transport.producer(ProducerSettings(client_id="test-producer", **settings))  # type: ignore[arg-type]
    await producer.start()
    try:
        for topic, partition, key, value in records:
            producer.append(topic, partition, key, value, None, ())
        await producer.flush()
    finally:
        await producer.close()


async def read_all(
    transport: KafkaTransport, partitions: Sequence[TopicPartition], expected: int
) -> dict[TopicPartition, list[object]]:
    reader = transport.reader("test-reader")
    reader.assign(partitions)
    await reader.start()
    try:
        for tp in partitions:
            reader.seek(tp, 0)
        got: dict[TopicPartition, list[object]] = {tp: [] for tp in partitions}
        deadline = time.monotonic() + DEADLINE
        while sum(map(len, got.values())) < expected:
            assert time.monotonic() < deadline, f"read {sum(map(len, got.values()))}/{expected}"
            for tp, batch in (await reader.poll(200)).items():
                got[TopicPartition(tp.topic, tp.partition)].extend(batch)
        return got
    finally:
        await reader.close()


class RoundRobinAssignor:
    """Test assignor: partitions dealt round-robin over the members sorted by id."""

    name = "test-roundrobin"

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.seen_subscriptions: list[Mapping[str, MemberSubscription]] = []
        self.assignments: list[MemberAssignment] = []

    def subscription_user_data(self, topics: Sequence[str]) -> bytes:
        return f"{self.tag}:{','.join(topics)}".encode()

    def assign(
        self,
        subscriptions: Mapping[str, MemberSubscription],
        partitions_per_topic: Mapping[str, int],
    ) -> dict[str, MemberAssignment]:
        self.seen_subscriptions.append(dict(subscriptions))
        members = sorted(subscriptions)
        dealt: dict[str, list[TopicPartition]] = {m: [] for m in members}
        i = 0
        for topic in sorted(partitions_per_topic):
            for p in range(partitions_per_topic[topic]):
                dealt[members[i % len(members)]].append(TopicPartition(topic, p))
                i += 1
        return {
            m: MemberAssignment(tuple(tps), f"from-{self.tag}:{len(members)}".encode())
            for m, tps in dealt.items()
        }

    def on_assignment(self, assignment: MemberAssignment) -> None:
        self.assignments.append(assignment)


class Recorder:
    """Rebalance listener recording every callback; can block or fail on demand."""

    def __init__(self) -> None:
        self.events: list[tuple[str, set[TopicPartition]]] = []
        self.owned: set[TopicPartition] = set()
        self.block_revoke: asyncio.Event | None = None
        self.block_assign: asyncio.Event | None = None
        self.fail_assign: BaseException | None = None
        self.on_revoke: Callable[[set[TopicPartition]], Awaitable[None]] | None = None

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        assert all(type(tp) is TopicPartition for tp in revoked)
        self.events.append(("revoked", set(revoked)))
        if self.on_revoke is not None:
            await self.on_revoke(revoked)
        if self.block_revoke is not None:
            await self.block_revoke.wait()
        self.owned -= revoked

    def on_join_registered(self) -> None:
        pass

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        assert all(type(tp) is TopicPartition for tp in assigned)
        self.events.append(("assigned", set(assigned)))
        if self.block_assign is not None:
            await self.block_assign.wait()
        self.owned |= assigned
        if self.fail_assign is not None:
            raise self.fail_assign

    def count(self, kind: str) -> int:
        return sum(1 for k, _ in self.events if k == kind)


def group_settings(group: str, client: str, **overrides: object) -> ConsumerSettings:
    values: dict[str, object] = {
        "group_id": group,
        "client_id": client,
        "assignor": RoundRobinAssignor(client),
        "session_timeout_ms": 3000,
        "heartbeat_interval_ms": 200,
        "max_poll_interval_ms": 30_000,
    }
    values.update(overrides)
    return ConsumerSettings(**values)  # type: ignore[arg-type]


class Member:
    """A group consumer with a background poll loop (as the engine would run it)."""

    def __init__(self, transport: KafkaTransport, group: str, topic: str, client: str, **kw: object):
        self.settings = group_settings(group, client, **kw)
        self.assignor: RoundRobinAssignor = self.settings.assignor  # type: ignore[assignment]
        self.consumer: KafkaConsumer = transport.consumer(self.settings)
        self.listener = Recorder()
        self.topic = topic
        self.records: dict[TopicPartition, list[object]] = {}
        self.poll_error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, poll: bool = True) -> Member:
        self.consumer.subscribe([self.topic], self.listener)
        await self.consumer.start()
        if poll:
            self._task = asyncio.create_task(self._poll_loop())
        return self

    async def _poll_loop(self) -> None:
        try:
            while True:
                for tp, batch in (await self.consumer.poll(100)).items():
                    self.records.setdefault(TopicPartition(tp.topic, tp.partition), []).extend(batch)
        except Exception as exc:  # surfaced by the test
            self.poll_error = exc

    async def stop_polling(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def close(self, leave_group: bool = True) -> None:
        await self.stop_polling()
        await self.consumer.close(leave_group=leave_group)


# -- admin --------------------------------------------------------------------------------


async def test_admin_creates_counts_and_deletes_topics(transport: KafkaTransport) -> None:
    admin = transport.admin("test-admin")
    await admin.start()
    try:
        a, b, missing = _name("a"), _name("b"), _name("missing")
        await admin.create_topics({a: 4, b: 1})
        assert await admin.partition_counts([a, b, missing]) == {a: 4, b: 1}
        # Existing topics are left as they are; asking for a missing one does not create it.
        await admin.create_topics({a: 8})
        assert await admin.partition_counts([a, missing]) == {a: 4}
        assert await admin.partition_counts([missing]) == {}
        await admin.delete_topics([a, missing])
        assert await admin.partition_counts([a, b]) == {b: 1}
    finally:
        await admin.close()


# -- producer + reader -------------------------------------------------------------------


async def test_produce_1000_records_and_read_them_back_in_partition_order(
    transport: KafkaTransport,
) -> None:
    topic = await create_topic(transport, 4)
    # A small batch size, so every partition fills several builders.
    producer = transport.producer(ProducerSettings(client_id="p", batch_size=2048))
    await producer.start()
    sent: dict[int, list[tuple[bytes, bytes, int, list[tuple[str, bytes]]]]] = {p: [] for p in range(4)}
    try:
        for i in range(1000):
            p = i % 4
            key, value = f"k{i}".encode(), f"value-{i:04d}-".encode() * 3
            ts = 1_700_000_000_000 + i
            headers = [("seq", str(i).encode())] if i % 2 else []
            producer.append(topic, p, key, value, ts, headers if i % 3 else tuple(headers))
            sent[p].append((key, value, ts, headers))
            if i % 100 == 99:
                assert producer.buffered() == 100
                await producer.send_buffered()
                assert producer.buffered() == 0
        await producer.flush()
        assert producer.buffered() == 0
    finally:
        await producer.close()

    partitions = [TopicPartition(topic, p) for p in range(4)]
    got = await read_all(transport, partitions, 1000)
    for p in range(4):
        records = got[TopicPartition(topic, p)]
        assert [r.offset for r in records] == list(range(250))  # type: ignore[attr-defined]
        assert [
            (r.key, r.value, r.timestamp, list(r.headers))  # type: ignore[attr-defined]
            for r in records
        ] == sent[p]

    reader = transport.reader("offsets")
    reader.assign(partitions)
    await reader.start()
    try:
        assert await reader.end_offsets(partitions) == {tp: 250 for tp in partitions}
        assert reader.assignment() == set(partitions)
        reader.seek(partitions[2], 240)
        assert await reader.position(partitions[2]) == 240
    finally:
        await reader.close()


async def test_pause_holds_back_a_partition_and_resume_brings_it(transport: KafkaTransport) -> None:
    topic = await create_topic(transport, 2)
    p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    await produce(transport, [(topic, p, None, f"{p}-{i}".encode()) for i in range(50) for p in (0, 1)])

    reader = transport.reader("pauser")
    reader.assign([p0, p1])
    await reader.start()
    try:
        reader.seek(p0, 0)
        reader.seek(p1, 0)
        reader.pause(p0)
        assert reader.paused() == {p0}
        got: dict[TopicPartition, list[object]] = {p0: [], p1: []}

        async def poll_into() -> None:
            for tp, batch in (await reader.poll(100)).items():
                got[TopicPartition(tp.topic, tp.partition)].extend(batch)

        deadline = time.monotonic() + DEADLINE
        while len(got[p1]) < 50:
            assert time.monotonic() < deadline
            await poll_into()
        for _ in range(3):  # a few more polls: still nothing from the paused partition
            await poll_into()
        assert got[p0] == []

        reader.resume(p0)
        assert reader.paused() == set()
        while len(got[p0]) < 50:
            assert time.monotonic() < deadline
            await poll_into()
        assert [r.value for r in got[p0]] == [f"0-{i}".encode() for i in range(50)]  # type: ignore[attr-defined]
    finally:
        await reader.close()


async def test_produce_to_a_missing_topic_fails_with_produce_error(transport: KafkaTransport) -> None:
    missing = _name("missing")
    producer = transport.producer(ProducerSettings(client_id="p", request_timeout_ms=1500))
    await producer.start()
    try:
        producer.append(missing, 0, b"k", b"v", None, ())
        started = time.monotonic()
        with pytest.raises(ProduceError) as caught:
            await producer.flush()
        assert time.monotonic() - started < 10
        assert (caught.value.topic, caught.value.partition) == (missing, 0)
        assert caught.value.__cause__ is not None
        # The producer stays failed: nothing after the failure counts as delivered.
        with pytest.raises(ProduceError):
            await producer.flush()
    finally:
        await producer.close()


async def test_a_cancelled_hand_over_leaves_the_producer_failed(transport: KafkaTransport) -> None:
    missing = _name("missing")
    producer = transport.producer(ProducerSettings(client_id="p", request_timeout_ms=30_000))
    await producer.start()
    try:
        producer.append(missing, 0, b"k", b"v", None, ())
        task = asyncio.create_task(producer.send_buffered())
        await wait_until(lambda: producer.buffered() == 0, "the hand-over to start")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The record was neither sent nor kept: flush must not report success.
        with pytest.raises(ProduceError):
            await producer.flush()
    finally:
        await producer.close()


async def test_produce_to_a_partition_that_does_not_exist_fails(transport: KafkaTransport) -> None:
    topic = await create_topic(transport, 2)
    producer = transport.producer(ProducerSettings(client_id="p"))
    await producer.start()
    try:
        producer.append(topic, 0, b"k", b"ok", None, ())
        producer.append(topic, 7, b"k", b"nowhere", None, ())
        with pytest.raises(ProduceError) as caught:
            await producer.flush()
        assert (caught.value.topic, caught.value.partition) == (topic, 7)
    finally:
        await producer.close()


# -- group consumer ------------------------------------------------------------------------


async def test_group_members_split_partitions_and_commit_with_metadata(
    transport: KafkaTransport,
) -> None:
    topic = await create_topic(transport, 4)
    await produce(transport, [(topic, i % 4, None, str(i).encode()) for i in range(40)])
    group = _name("group")
    all_tps = {TopicPartition(topic, p) for p in range(4)}

    a = await Member(transport, group, topic, "member-a").start()
    b = Member(transport, group, topic, "member-b")
    try:
        await wait_until(lambda: a.listener.owned == all_tps, "A to own all 4 partitions")
        assert a.consumer.assignment() == all_tps
        assert a.consumer.member_id
        assert a.listener.events[0] == ("revoked", set())  # aiokafka: empty revoke on first join
        assert a.listener.events[1] == ("assigned", all_tps)
        # The assignor saw the user data and handed its own back.
        (subs,) = a.assignor.seen_subscriptions
        (sub,) = subs.values()
        assert sub.topics == (topic,) and sub.user_data == f"member-a:{topic}".encode()
        assert a.assignor.assignments[-1].user_data == b"from-member-a:1"
        assert set(a.assignor.assignments[-1].partitions) == all_tps

        await wait_until(lambda: sum(map(len, a.records.values())) == 40, "A to read 40 records")
        p0, p3 = TopicPartition(topic, 0), TopicPartition(topic, 3)
        assert await a.consumer.committed(p0) is None
        await a.consumer.commit({p0: OffsetAndMetadata(10, "meta-0"), p3: OffsetAndMetadata(7)})
        assert await a.consumer.committed(p0) == OffsetAndMetadata(10, "meta-0")
        assert await a.consumer.committed(p3) == OffsetAndMetadata(7, "")
        await a.consumer.commit({})  # nothing to do

        # In on_partitions_revoked the old generation still owns the partitions:
        # commits made there are accepted.
        async def commit_on_revoke(revoked: set[TopicPartition]) -> None:
            if p3 in revoked:
                await a.consumer.commit({p3: OffsetAndMetadata(9, "on-revoke")})

        a.listener.on_revoke = commit_on_revoke
        revokes_before = a.listener.count("revoked")
        await b.start()
        await wait_until(
            lambda: len(a.listener.owned) == 2 and len(b.listener.owned) == 2,
            "A and B to own 2 partitions each",
        )
        assert a.listener.count("revoked") == revokes_before + 1
        assert a.listener.events[revokes_before * 2] == ("revoked", all_tps)
        assert a.listener.owned | b.listener.owned == all_tps
        assert a.consumer.assignment() == a.listener.owned
        assert b.consumer.assignment() == b.listener.owned
        assert await b.consumer.committed(p3) == OffsetAndMetadata(9, "on-revoke")
        assert a.assignor.assignments[-1].user_data == b.assignor.assignments[-1].user_data
        assert a.assignor.assignments[-1].user_data.endswith(b":2")

        # A member cannot commit a partition it no longer owns.
        (foreign,) = sorted(b.listener.owned)[:1]
        with pytest.raises(CommitFailedError):
            await a.consumer.commit({foreign: OffsetAndMetadata(1)})

        # B resumes from the committed offsets (9 for p3).
        if p3 in b.listener.owned:
            await wait_until(lambda: p3 in b.records, "B to read p3")
            assert b.records[p3][0].offset == 9  # type: ignore[attr-defined]
        assert a.poll_error is None and b.poll_error is None
    finally:
        await b.close()
        await a.close()


async def test_request_rejoin_rebalances_the_whole_group(transport: KafkaTransport) -> None:
    topic = await create_topic(transport, 4)
    group = _name("group")
    a = await Member(transport, group, topic, "member-a").start()
    b = await Member(transport, group, topic, "member-b").start()
    try:
        await wait_until(
            lambda: len(a.listener.owned) == 2 and len(b.listener.owned) == 2, "a 2/2 split"
        )
        # One of them is the group leader and one a follower: either one's
        # request makes the whole group rebalance.
        for requester in (a, b, a, b):
            before_a, before_b = a.listener.count("assigned"), b.listener.count("assigned")
            requester.consumer.request_rejoin()
            await wait_until(
                lambda: a.listener.count("assigned") > before_a  # noqa: B023
                and b.listener.count("assigned") > before_b,  # noqa: B023
                "both members to be reassigned",
            )
            await wait_until(
                lambda: len(a.listener.owned) == 2 and len(b.listener.owned) == 2,
                "a 2/2 split again",
            )
        # The assignor never sees the transport's rejoin counter.
        for subs in a.assignor.seen_subscriptions + b.assignor.seen_subscriptions:
            for sub in subs.values():
                assert sub.user_data.startswith(b"member-"), sub.user_data
    finally:
        await b.close()
        await a.close()


async def test_poll_returns_in_time_while_a_rebalance_is_in_progress(
    transport: KafkaTransport,
) -> None:
    topic = await create_topic(transport, 2)
    await produce(transport, [(topic, p, None, b"x") for p in (0, 1) for _ in range(5)])
    a = Member(transport, _name("group"), topic, "member-a")
    await a.start(poll=False)
    try:
        while len(a.listener.owned) < 2:  # the engine's loop: poll until assigned
            await a.consumer.poll(100)
        # A slow on_partitions_revoked keeps the rebalance in progress.
        a.listener.block_revoke = asyncio.Event()
        a.consumer.request_rejoin()
        await wait_until(lambda: a.listener.count("revoked") == 2, "the revoke callback")
        started = time.monotonic()
        assert await a.consumer.poll(300) == {}
        assert time.monotonic() - started < 2.0

        # A slow on_partitions_assigned: records of the new assignment are held back.
        a.listener.block_assign = asyncio.Event()
        a.listener.block_revoke.set()
        await wait_until(lambda: a.listener.count("assigned") == 2, "the assign callback")
        for _ in range(3):
            started = time.monotonic()
            assert await a.consumer.poll(300) == {}
            assert time.monotonic() - started < 2.0
        a.listener.block_assign.set()
        got: dict[int, list[int]] = {0: [], 1: []}
        deadline = time.monotonic() + DEADLINE
        while sum(map(len, got.values())) < 10:
            assert time.monotonic() < deadline
            for tp, batch in (await a.consumer.poll(200)).items():
                got[tp.partition].extend(r.offset for r in batch)  # type: ignore[attr-defined]
        # Nothing was lost while held back (nothing was committed: earliest).
        assert got == {0: [0, 1, 2, 3, 4], 1: [0, 1, 2, 3, 4]}
    finally:
        if a.listener.block_revoke is not None:
            a.listener.block_revoke.set()
        if a.listener.block_assign is not None:
            a.listener.block_assign.set()
        await a.close()


async def test_listener_errors_are_raised_from_poll(transport: KafkaTransport) -> None:
    topic = await create_topic(transport, 1)
    a = Member(transport, _name("group"), topic, "member-a")
    a.listener.fail_assign = RuntimeError("boom in on_partitions_assigned")
    await a.start(poll=False)
    try:
        deadline = time.monotonic() + DEADLINE
        with pytest.raises(RuntimeError, match="boom in on_partitions_assigned"):
            while time.monotonic() < deadline:
                await a.consumer.poll(100)
    finally:
        await a.close()


@pytest.mark.parametrize("leave_group", [True, False])
async def test_close_with_and_without_leaving_the_group(
    transport: KafkaTransport, leave_group: bool
) -> None:
    topic = await create_topic(transport, 4)
    group = _name("group")
    session_s = 3.0
    a = await Member(transport, group, topic, "member-a", session_timeout_ms=int(session_s * 1000)).start()
    b = await Member(transport, group, topic, "member-b", session_timeout_ms=int(session_s * 1000)).start()
    try:
        await wait_until(
            lambda: len(a.listener.owned) == 2 and len(b.listener.owned) == 2, "a 2/2 split"
        )
        started = time.monotonic()
        await a.close(leave_group=leave_group)
        await wait_until(lambda: len(b.listener.owned) == 4, "B to take over all partitions")
        took = time.monotonic() - started
        if leave_group:
            assert took < session_s * 2 / 3, took  # LeaveGroup: rebalance at once
        else:
            assert took >= session_s * 0.8, took  # only after the session timed out
    finally:
        await b.close()
        await a.close()


async def test_static_member_keeps_its_partitions_across_a_restart(
    transport: KafkaTransport,
) -> None:
    topic = await create_topic(transport, 4)
    group = _name("group")
    a = await Member(transport, group, topic, "member-a", group_instance_id="instance-a").start()
    b = await Member(transport, group, topic, "member-b", group_instance_id="instance-b").start()
    try:
        await wait_until(
            lambda: len(a.listener.owned) == 2 and len(b.listener.owned) == 2, "a 2/2 split"
        )
        owned_a = set(a.listener.owned)
        b_assigned = b.listener.count("assigned")
        await a.close(leave_group=False)  # a static member that stays: no LeaveGroup
        a2 = await Member(transport, group, topic, "member-a2", group_instance_id="instance-a").start()
        try:
            await wait_until(lambda: a2.listener.owned == owned_a, "the restarted member's partitions")
            assert b.listener.count("assigned") == b_assigned  # B saw no rebalance
        finally:
            await a2.close()
    finally:
        await b.close()
        await a.close()


async def test_static_member_closed_with_leave_group_leaves_at_once(
    transport: KafkaTransport,
) -> None:
    """LeaveGroup v3 names the group.instance.id: B takes over long before A's session expires."""
    topic = await create_topic(transport, 4)
    group = _name("group")
    session_ms = 30_000
    a = await Member(transport, group, topic, "member-a", group_instance_id="instance-a",
                     session_timeout_ms=session_ms).start()
    b = await Member(transport, group, topic, "member-b", group_instance_id="instance-b",
                     session_timeout_ms=session_ms).start()
    try:
        await wait_until(
            lambda: len(a.listener.owned) == 2 and len(b.listener.owned) == 2, "a 2/2 split"
        )
        started = time.monotonic()
        await a.close(leave_group=True)
        await wait_until(lambda: len(b.listener.owned) == 4, "B to take over all partitions",
                         timeout=session_ms / 1000 / 2)
        assert time.monotonic() - started < session_ms / 1000 / 3
    finally:
        await b.close()
        await a.close()


async def test_is_retriable_classifies_aiokafka_errors() -> None:
    from aiokafka import errors as aioerrors

    assert is_retriable(aioerrors.KafkaTimeoutError())
    assert is_retriable(aioerrors.RequestTimedOutError())
    assert is_retriable(TimeoutError())
    assert is_retriable(aioerrors.LeaderNotAvailableError())
    wrapped = ProduceError("t", 0, "x")
    wrapped.__cause__ = aioerrors.NotLeaderForPartitionError()
    assert is_retriable(wrapped)
    assert not is_retriable(aioerrors.TopicAuthorizationFailedError())
