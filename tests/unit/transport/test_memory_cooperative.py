"""The memory:// transport's cooperative protocol (KIP-429), behaviour by behaviour.

A cooperative member keeps its partitions while the group rebalances (``poll`` goes on returning
their records), revokes only what the new assignment takes away, keeps the positions and pause
flags of what stays, and rejoins at once when it lost partitions; the broker refuses an assignment
that gives a partition away while its owner still holds it.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import pytest_asyncio

from streamloop.errors import TransportError
from streamloop.records import TopicPartition
from streamloop.transport.base import ConsumerSettings, MemberAssignment, MemberSubscription
from streamloop.transport.memory import GroupState, MemoryBroker, MemoryTransport
from tests.unit.transport.test_memory import (  # the fixtures and helpers of the eager tests
    GROUP,
    TOPIC,
    Member,
    RecordingListener,
    RoundRobinAssignor,
    broker,
    clock,
    group_stable,
    partitions,
    poll_until,
    produce,
    topic,
    transport,
    values_of,
)

pytestmark = pytest.mark.asyncio
__all__ = ["broker", "clock", "topic", "transport"]


class HandOverAssignor(RoundRobinAssignor):
    """Round robin, but a partition another member still holds goes to no one this round."""

    name = "hand-over"

    def assign(self, subscriptions: Mapping[str, MemberSubscription],
               partitions_per_topic: Mapping[str, int]) -> dict[str, MemberAssignment]:
        holder = {TopicPartition(*tp): m for m, s in subscriptions.items() for tp in s.owned}
        dealt = super().assign(subscriptions, partitions_per_topic)
        result = {m: MemberAssignment(tuple(tp for tp in a.partitions if holder.get(tp, m) == m))
                  for m, a in dealt.items()}
        self.assignments[-1] = result
        return result


@pytest_asyncio.fixture
async def member(transport: MemoryTransport):
    made: list[Member] = []

    async def make(name: str, assignor: RoundRobinAssignor | None = None) -> Member:
        assignor = assignor or HandOverAssignor()
        consumer = transport.consumer(ConsumerSettings(group_id=GROUP, client_id=name, assignor=assignor,
                                                       cooperative=True))
        listener = RecordingListener()
        consumer.subscribe([TOPIC], listener)
        await consumer.start()
        made.append(Member(name, consumer, listener, assignor))
        return made[-1]

    yield make
    for m in made:
        await m.consumer.close()


async def test_a_member_fetches_its_partitions_while_the_group_rebalances(
        broker: MemoryBroker, transport: MemoryTransport, topic: str, member) -> None:
    a = await member("a")
    c = await member("c")
    await poll_until([a, c], lambda: group_stable(broker, [a, c])() and bool(c.consumer.assignment()),
                     "a and c sharing the partitions")
    held = a.consumer.assignment()
    events = len(a.listener.events)
    await member("b")  # joins: the group waits for a and c to rejoin
    await a.poll()     # a rejoins, keeps its partitions, and waits for c in the barrier

    await produce(transport, topic, 0, [b"during"])
    await a.poll()

    assert broker.describe_group(GROUP).state is GroupState.PREPARING_REBALANCE
    assert values_of(a.records) == [b"during"]
    assert a.consumer.assignment() == held
    assert a.listener.events[events:] == [("revoked", frozenset())]


async def test_a_member_revokes_only_what_it_lost_and_the_follow_up_hands_it_over(
        broker: MemoryBroker, topic: str, member) -> None:
    a = await member("a")
    await poll_until([a], group_stable(broker, [a]), "a alone")
    b = await member("b")

    await poll_until([a, b], lambda: group_stable(broker, [a, b])() and bool(b.consumer.assignment()),
                     "b owning partitions")

    everything = frozenset(partitions(topic, 4))
    kept, moved = frozenset(a.consumer.assignment()), frozenset(b.consumer.assignment())
    assert kept | moved == everything and not kept & moved and len(kept) == len(moved) == 2
    assert a.listener.events == [
        ("assigned", everything),
        ("revoked", frozenset()),   # before rejoining: nothing
        ("revoked", moved),         # the first rebalance took these away: a closes them
        ("assigned", kept),
        ("revoked", frozenset()),   # the follow-up rebalance a asked for
        ("assigned", kept),
    ]
    # b never got more than its share, and got it once a had let it go.
    assert b.listener.events[-1] == ("assigned", moved)
    assert all(kind == "assigned" and tps <= moved for kind, tps in b.listener.events)
    assert a.assignor.assignments[1][b.consumer.member_id].partitions == ()  # a still held them all


async def test_a_kept_partition_keeps_its_position_and_its_pause(
        broker: MemoryBroker, transport: MemoryTransport, topic: str, member) -> None:
    a = await member("a")
    await produce(transport, topic, 0, [b"x0", b"x1"])
    await poll_until([a], lambda: len(a.records) == 2, "a read partition 0")
    first = TopicPartition(topic, 0)
    a.consumer.pause(first)
    b = await member("b")

    await poll_until([a, b], lambda: group_stable(broker, [a, b])() and bool(b.consumer.assignment()),
                     "b owning partitions")

    assert first in a.consumer.assignment()  # the round robin deals partition 0 to a, the first member
    assert a.consumer.paused() == {first}
    assert await a.consumer.position(first) == 2
    await produce(transport, topic, 0, [b"x2"])
    a.consumer.resume(first)
    await poll_until([a, b], lambda: len(a.records) == 3, "a reading on from offset 2")
    assert values_of(a.records) == [b"x0", b"x1", b"x2"]


async def test_an_assignment_that_gives_away_a_held_partition_is_refused(
        broker: MemoryBroker, topic: str, member) -> None:
    a = await member("a", RoundRobinAssignor())  # not cooperative-aware
    await poll_until([a], group_stable(broker, [a]), "a alone")
    await member("b", RoundRobinAssignor())

    with pytest.raises(TransportError, match="still owns it"):
        await a.poll()
        await a.poll()
