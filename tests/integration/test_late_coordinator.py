"""Convergence against a broker that answers JoinGroup and SyncGroup late (issue "converge").

The late broker (tests/support/late_broker.py) runs Apache Kafka at its *default* group settings
(``group.initial.rebalance.delay.ms`` 3 s) behind a proxy that holds each successful JoinGroup
answer ``join_s`` and a SyncGroup answer ``leader_sync_s`` (the leader's) or ``follower_sync_s``
(a follower's, later): a follower's SyncGroup is still in flight when the leader already has its
assignment. The clients keep their own defaults too (``heartbeat.interval.ms`` 3 s,
``session.timeout.ms`` 45 s), as a user's first application does.

Each case reaches RUNNING with every task assigned within the rounds its change needs times a
round's delay, plus 5 s; after that no JoinGroup comes from our client for a round's time, and
every record is processed. Before the fix (sibling nudges) the follower's wait made its sibling
rejoin, which failed the follower's SyncGroup, one generation per broker wait, for ever.

The short variants run in ``make test``; ``-m slow`` runs every thread count and protocol.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from streamloop import ClientState, KafkaStreams
from streamloop.testing import eventually_async
from streamloop.transport import open_transport
from tests.support.cluster import Cluster
from tests.support.convergence import (
    ClientWatch,
    Topics,
    create_topics,
    group_settled,
    new_client,
    produce,
    replacing_client,
    wait_processed,
)
from tests.support.group_record import JOIN
from tests.support.late_broker import GroupDelays, LateKafka

pytestmark = [pytest.mark.asyncio, pytest.mark.kafka]

DELAYS = GroupDelays(join_s=2.0, leader_sync_s=0.5)  # a follower's SyncGroup answer after 1.5 s
ROUND_S = DELAYS.join_s + DELAYS.follower_s
# A new group's first round also waits group.initial.rebalance.delay.ms (3 s at Kafka's default),
# once more for members that join during it.
NEW_GROUP_S = 6.0
SLACK_S = 5.0
# The client's own group timing at its defaults, not the test suite's short heartbeats.
DEFAULT_TIMING = {"heartbeat_interval_ms": 3_000, "session_timeout_ms": 45_000}
COOPERATIVE_AND_EAGER = ["cooperative", pytest.param("eager", marks=pytest.mark.slow)]


def bound(rounds: int, new_group: bool = False) -> float:
    return rounds * ROUND_S + (NEW_GROUP_S if new_group else 0.0) + SLACK_S


@pytest.fixture
def cluster(late_kafka: LateKafka) -> Cluster:
    return Cluster(open_transport({"bootstrap.servers": late_kafka.bootstrap}), late_kafka.bootstrap)


@asynccontextmanager
async def running(late_kafka: LateKafka, *clients: KafkaStreams) -> AsyncIterator[None]:
    """Start the clients with the broker answering late; close them with it answering at once
    (a consumer's close waits for a JoinGroup answer the proxy still holds)."""
    late_kafka.set_delays(DELAYS)
    try:
        for client in clients:
            await client.start_async()
        yield
    finally:
        late_kafka.set_delays(GroupDelays())
        for client in clients:
            await client.close_async(timeout=30)


async def settled_within(watch: ClientWatch, threads: int, partitions: int, seconds: float, what: str) -> float:
    started = time.monotonic()
    await watch.wait_settled(threads, partitions, seconds, f"{what}: RUNNING with all tasks within {seconds:.1f} s")
    return time.monotonic() - started


async def quiet_and_complete(late_kafka: LateKafka, cluster: Cluster, topics: Topics, app: str,
                             watches: list[ClientWatch], start: int) -> None:
    """No JoinGroup from our clients for a round's time, and records flow through all the while."""
    transitions = [w.transitions for w in watches]
    await produce(cluster, topics, start, 200)
    await late_kafka.record.expect_no_join_requests(ROUND_S, group_id=app)
    await wait_processed(cluster, topics, range(start, start + 200), 30)
    assert [w.transitions for w in watches] == transitions, "a settled client left RUNNING"


@pytest.mark.parametrize("threads", [pytest.param(1, marks=pytest.mark.slow), 2,
                                     pytest.param(8, marks=pytest.mark.slow)])
@pytest.mark.parametrize("protocol", COOPERATIVE_AND_EAGER)
async def test_start_up_settles_in_one_round(late_kafka: LateKafka, cluster: Cluster, names, threads: int,
                                             protocol: str) -> None:
    topics = await create_topics(cluster, names, 8)
    streams = new_client(cluster, names, topics, threads, rebalance_protocol=protocol, **DEFAULT_TIMING)
    watch = ClientWatch(streams)
    async with running(late_kafka, streams):
        await settled_within(watch, threads, 8, bound(1, new_group=True), f"start-up of {threads} threads")
        await quiet_and_complete(late_kafka, cluster, topics, names.app, [watch], 0)
    assert watch.transitions[:2] == [(ClientState.CREATED, ClientState.REBALANCING),
                                     (ClientState.REBALANCING, ClientState.RUNNING)]


@pytest.mark.parametrize("protocol", COOPERATIVE_AND_EAGER)
async def test_an_added_and_a_removed_thread_settle_within_their_rounds(
        late_kafka: LateKafka, cluster: Cluster, names, protocol: str) -> None:
    topics = await create_topics(cluster, names, 4)
    streams = new_client(cluster, names, topics, 2, rebalance_protocol=protocol, **DEFAULT_TIMING)
    watch = ClientWatch(streams)
    # A task moves to the added thread in two rounds under the cooperative protocol, one under eager.
    add_rounds = 2 if protocol == "cooperative" else 1
    async with running(late_kafka, streams):
        await settled_within(watch, 2, 4, bound(1, new_group=True), "start-up")
        assert await streams.add_stream_thread_async() is not None
        await settled_within(watch, 3, 4, bound(add_rounds), "an added thread")
        await quiet_and_complete(late_kafka, cluster, topics, names.app, [watch], 0)
        assert await streams.remove_stream_thread_async(timeout=30) is not None
        await settled_within(watch, 2, 4, bound(1), "a removed thread")
        await quiet_and_complete(late_kafka, cluster, topics, names.app, [watch], 200)
    assert watch.rebalancing_periods() == 3, watch.transitions


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["cooperative", "eager"])
async def test_a_second_instance_settles_within_its_rounds(late_kafka: LateKafka, cluster: Cluster, names,
                                                          protocol: str) -> None:
    topics = await create_topics(cluster, names, 8)
    first = new_client(cluster, names, topics, 2, rebalance_protocol=protocol, **DEFAULT_TIMING)
    second = new_client(cluster, names, topics, 2, rebalance_protocol=protocol, client_id=names("second"),
                        **DEFAULT_TIMING)
    watches = [ClientWatch(first), ClientWatch(second)]
    async with running(late_kafka, first):
        await settled_within(watches[0], 2, 8, bound(1, new_group=True), "the first instance")
        await second.start_async()
        rounds = 2 if protocol == "cooperative" else 1
        await eventually_async(lambda: group_settled(watches, 2, 8), bound(rounds),
                               f"both instances RUNNING, sharing the tasks within {bound(rounds):.1f} s")
        try:
            await quiet_and_complete(late_kafka, cluster, topics, names.app, watches, 0)
        finally:
            late_kafka.set_delays(GroupDelays())
            await second.close_async(timeout=30)


async def test_a_replaced_thread_settles_and_its_record_is_processed(
        late_kafka: LateKafka, cluster: Cluster, names) -> None:
    """REPLACE_THREAD: the failed thread leaves and its replacement joins; the failed record is
    processed again by the new owner of its task."""
    topics = await create_topics(cluster, names, 4)
    failed: list[int] = []
    streams = replacing_client(cluster, names, topics, failed, **DEFAULT_TIMING)
    watch = ClientWatch(streams)
    async with running(late_kafka, streams):
        await settled_within(watch, 2, 4, bound(1, new_group=True), "start-up")
        await produce(cluster, topics, 0, 8)
        # The leave and the join may fall into one rebalance or two; a cooperative hand-over
        # adds its follow-up round.
        await wait_processed(cluster, topics, range(8), bound(3))
        assert failed == [3]
        await settled_within(watch, 2, 4, bound(3), "the replacement")
        await quiet_and_complete(late_kafka, cluster, topics, names.app, [watch], 8)


async def test_a_joingroup_held_longer_than_the_request_timeout_still_completes(
        late_kafka: LateKafka, cluster: Cluster, names) -> None:
    """A JoinGroup may take the rebalance timeout (max.poll.interval.ms); Java's consumer waits that
    long for it (plus 5 s), whatever request.timeout.ms says. Timed out at request.timeout.ms, it
    is sent again and held again, for ever."""
    topics = await create_topics(cluster, names, 4)
    streams = new_client(cluster, names, topics, 1, request_timeout_ms=3_000, max_poll_interval_ms=30_000,
                         **DEFAULT_TIMING)
    watch = ClientWatch(streams)
    late_kafka.set_delays(GroupDelays(join_s=5.0))
    try:
        await streams.start_async()
        await settled_within(watch, 1, 4, 6.0 + 5.0 + SLACK_S, "a JoinGroup held 5 s, request.timeout.ms 3 s")
    finally:
        late_kafka.set_delays(GroupDelays())
        await streams.close_async(timeout=30)


async def test_a_member_waiting_for_the_follow_up_joins_it_without_waiting_for_its_heartbeat(
        late_kafka: LateKafka, cluster: Cluster, names) -> None:
    """Cooperative: a second instance's threads get no tasks in their first rebalance (the tasks
    still have owners) and wait for the follow-up that moves them. The coordinator tells a member
    of a rebalance only in the answer to its next heartbeat, so a member that waited for it would
    join the follow-up up to ``heartbeat.interval.ms`` (10 s here) after the owners did: a member
    that knows a follow-up is coming asks the coordinator at once."""
    timing = {"heartbeat_interval_ms": 10_000, "session_timeout_ms": 45_000}
    topics = await create_topics(cluster, names, 4)
    first = new_client(cluster, names, topics, 2, **timing)
    second = new_client(cluster, names, topics, 2, client_id=names("second"), **timing)
    watches = [ClientWatch(first), ClientWatch(second)]
    async with running(late_kafka, first):
        await settled_within(watches[0], 2, 4, bound(1, new_group=True), "the first instance")
        await second.start_async()
        try:
            # The first instance hears of the second at its heartbeat (up to 10 s), then two rounds;
            # this bound also leaves the second's members their heartbeat, to measure their wait.
            await eventually_async(lambda: group_settled(watches, 2, 4), 2 * 10.0 + bound(2),
                                   "both instances RUNNING, sharing the tasks")
        finally:
            late_kafka.set_delays(GroupDelays())
            await second.close_async(timeout=30)
    record = late_kafka.record
    calls = record.calls(group_id=names.app)
    waited: dict[str, float] = {}
    for sync in record.syncs(group_id=names.app, client_prefix=names("second")):
        assert sync.released_at is not None
        own = [c for c in calls if c.api == JOIN and c.member_id == sync.member_id
               and c.requested_at > sync.released_at]
        if not own or sync.member_id in waited:
            continue
        # The follow-up started with the first JoinGroup after the leader sent this generation's
        # assignments (an owner rejoins once its SyncGroup answer takes tasks away).
        leader_sync = next(c for c in record.syncs(group_id=names.app, leader=True)
                           if c.generation_id == sync.generation_id)
        started = min(c.requested_at for c in calls if c.api == JOIN and c.requested_at > leader_sync.requested_at)
        waited[str(sync.member_id)] = own[0].requested_at - max(started, sync.released_at)
    assert len(waited) == 2, record.summary()
    assert max(waited.values()) < 1.5, (waited, record.summary())
