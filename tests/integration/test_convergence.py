"""The group settles, and RUNNING means settled: on the memory broker and on real Kafka.

A membership change of the client's own (a start, an added or removed thread, a replaced one)
moves the client from RUNNING to REBALANCING and back once; once settled, our client starts no
rebalance by itself while it processes records. (The same checks against a broker that answers
JoinGroup and SyncGroup late are in test_late_coordinator.py.)
"""

from __future__ import annotations

import logging

import pytest

from streamloop import ClientState
from streamloop.tasks.assignor import StreamsAssignor
from streamloop.testing import eventually_async
from streamloop.transport import open_transport
from streamloop.transport.base import ConsumerSettings
from tests.support.cluster import EVERY_BROKER, Cluster
from tests.support.convergence import (
    ClientWatch,
    IgnoreRebalances,
    create_topics,
    new_client,
    produce,
    relay,
    replacing_client,
    wait_processed,
)

pytestmark = pytest.mark.asyncio

DEADLINE = 30.0
STARTED = [(ClientState.CREATED, ClientState.REBALANCING), (ClientState.REBALANCING, ClientState.RUNNING)]


async def settle_quietly(cluster: Cluster, watch: ClientWatch, topics, start: int) -> None:
    """Records flow through the settled group, and nothing rebalances meanwhile."""
    before = watch.rebalances()
    transitions = watch.transitions
    await produce(cluster, topics, start, 200)
    await wait_processed(cluster, topics, range(start, start + 200), DEADLINE)
    assert watch.rebalances() == before, "a settled group rebalanced while it processed records"
    assert watch.transitions == transitions


@pytest.mark.parametrize("threads", [1, 2, 8])
async def test_start_up_goes_from_rebalancing_to_running_once(cluster: Cluster, names, threads: int) -> None:
    topics = await create_topics(cluster, names, 8)
    streams = new_client(cluster, names, topics, threads)
    watch = ClientWatch(streams)
    async with streams:
        await watch.wait_settled(threads, 8, DEADLINE)
        await settle_quietly(cluster, watch, topics, 0)
    assert watch.transitions[:2] == STARTED


@pytest.mark.parametrize("bootstrap", EVERY_BROKER, indirect=True)
@pytest.mark.parametrize("protocol", ["cooperative", "eager"])
async def test_an_added_and_a_removed_thread_each_rebalance_the_client_once(
        cluster: Cluster, names, protocol: str) -> None:
    topics = await create_topics(cluster, names, 4)
    streams = new_client(cluster, names, topics, 2, rebalance_protocol=protocol)
    watch = ClientWatch(streams)
    async with streams:
        await watch.wait_settled(2, 4, DEADLINE)
        assert await streams.add_stream_thread_async() is not None
        await watch.wait_settled(3, 4, DEADLINE)
        await settle_quietly(cluster, watch, topics, 0)
        assert watch.rebalancing_periods() == 2, watch.transitions
        assert await streams.remove_stream_thread_async(timeout=DEADLINE) is not None
        await watch.wait_settled(2, 4, DEADLINE)
        await settle_quietly(cluster, watch, topics, 200)
        assert watch.rebalancing_periods() == 3, watch.transitions


@pytest.mark.parametrize("bootstrap", EVERY_BROKER, indirect=True)
async def test_a_replaced_thread_rebalances_the_client_once_per_change(cluster: Cluster, names) -> None:
    """REPLACE_THREAD is two changes, a thread leaving and one joining: at most two rebalancing
    periods, and every record processed (the failed one again by the replacement)."""
    topics = await create_topics(cluster, names, 4)
    failed: list[int] = []
    streams = replacing_client(cluster, names, topics, failed)
    watch = ClientWatch(streams)
    async with streams:
        await watch.wait_settled(2, 4, DEADLINE)
        await produce(cluster, topics, 0, 8)
        await wait_processed(cluster, topics, range(8), DEADLINE)
        await watch.wait_settled(2, 4, DEADLINE)
        assert failed == [3]
        assert 2 <= watch.rebalancing_periods() <= 3, watch.transitions
        await settle_quietly(cluster, watch, topics, 8)


async def test_rebalances_show_in_each_threads_metrics(cluster: Cluster, names) -> None:
    topics = await create_topics(cluster, names, 4)
    streams = new_client(cluster, names, topics, 2)
    watch = ClientWatch(streams)
    async with streams:
        await watch.wait_settled(2, 4, DEADLINE)
        metrics = {(m.tags["thread-id"], m.name): m.value for m in streams.metrics()
                   if m.group == "stream-thread-metrics" and "rebalance" in m.name}
        threads = {thread for thread, _name in metrics}
        assert len(threads) == 2
        for thread in threads:
            assert metrics[thread, "rebalance-total"] >= 1
            assert metrics[thread, "rebalance-latency-max"] >= metrics[thread, "rebalance-latency-last"] >= 0
            assert metrics[thread, "last-rebalance-seconds-ago"] >= 0
        await eventually_async(lambda: streams.state is ClientState.RUNNING, DEADLINE, "RUNNING")


async def test_a_client_stuck_rebalancing_warns_once_with_its_joins(names, caplog: pytest.LogCaptureFixture) -> None:
    """A member of the group that never rejoins holds every rebalance up (until its
    max.poll.interval.ms): past three session timeouts the client says so, once, at WARNING."""
    bootstrap = f"memory://stuck-{names.suffix}"
    transport = open_transport({"bootstrap.servers": bootstrap})
    cluster = Cluster(transport, bootstrap)
    topics = await create_topics(cluster, names, 4)
    stuck = transport.consumer(ConsumerSettings(
        group_id=names.app, client_id="stuck", assignor=StreamsAssignor(relay(topics), "other", "stuck"),
        max_poll_interval_ms=60_000, session_timeout_ms=60_000))
    stuck.subscribe([topics.source], IgnoreRebalances())
    await stuck.start()
    await stuck.poll(100)  # a member now, and it will not poll again: no rejoin from it
    caplog.set_level(logging.WARNING, logger="streamloop.client")
    streams = new_client(cluster, names, topics, 2, session_timeout_ms=200)
    try:
        async with streams:
            await eventually_async(lambda: any("REBALANCING for" in r.getMessage() for r in caplog.records),
                                   DEADLINE, "the warning of a client stuck in REBALANCING")
            await eventually_async(lambda: streams.metric("alive-stream-threads") == 2, DEADLINE, "two threads")
            warnings = [r.getMessage() for r in caplog.records if "REBALANCING for" in r.getMessage()]
            assert len(warnings) == 1
            assert "StreamThread-1 join" in warnings[0] and "StreamThread-2 join" in warnings[0]
            assert streams.state is ClientState.REBALANCING
    finally:
        await stuck.close(leave_group=False)

