"""Queries across instances, on the memory broker and on real Kafka: two instances of one application.

Each instance sets ``application.server``; each learns from the assignment which instance owns
which partitions of the store, and a key's metadata names the instance whose store holds it (as
Kafka Streams' ``QueryableStateIntegrationTest.shouldBeAbleToQueryDuringRebalance`` checks with
``queryMetadataForKey``). After one instance closes, the other owns every partition.
"""

from __future__ import annotations

import threading
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
import pytest

from streamloop import ClientState, KafkaStreams, Materialized, StreamsBuilder, Topology
from streamloop.errors import IllegalStateError
from streamloop.records import TopicPartition
from streamloop.serdes import StringSerde
from streamloop.state.metadata import HostInfo, KeyQueryMetadata, StreamsMetadata
from streamloop.testing import eventually_async
from streamloop.transport import open_transport
from streamloop.transport.partitioner import key_hash
from tests.support.apps import count_topology, make_streams
from tests.support.cluster import Cluster

pytestmark = pytest.mark.asyncio

STR = StringSerde()
PARTITIONS = 4
STORE = "counts"


def instance(cluster: Cluster, names, tmp_path: Path, source: str, sink: str, host: HostInfo) -> KafkaStreams:  # type: ignore[no-untyped-def]
    return make_streams(count_topology(source, sink, STORE, persistent=False), cluster.bootstrap, names.app,
                        state_dir=str(tmp_path / str(host.port)), application_server=host.endpoint)


def owned_partitions(streams: KafkaStreams) -> set[TopicPartition]:
    return {tp for thread in streams.metadata_for_local_threads() for task in thread.active_tasks
            for tp in task.topic_partitions}


def settled(instances: dict[HostInfo, KafkaStreams], source: str) -> bool:
    """Every instance RUNNING, its metadata the same as the others', and each entry what that instance runs."""
    if any(s.state is not ClientState.RUNNING for s in instances.values()):
        return False
    views = [s.metadata_for_all_clients() for s in instances.values()]
    if any(view != views[0] for view in views):
        return False
    by_host = {m.host_info: m.topic_partitions for m in views[0]}
    return (set(by_host) == set(instances)
            and all(by_host[h] == owned_partitions(s) for h, s in instances.items())
            and set().union(*by_host.values()) == {TopicPartition(source, p) for p in range(PARTITIONS)})


async def test_each_keys_metadata_names_the_instance_whose_store_holds_it(cluster: Cluster, names, tmp_path) -> None:
    source, sink = names("input"), names("counts")
    await cluster.create_topics({source: PARTITIONS, sink: PARTITIONS})
    records = [(f"k{i % 12}", f"v{i}") for i in range(48)]
    await cluster.produce(source, records, STR, STR, partitions=PARTITIONS)  # the producer's partitioner
    expected = Counter(k for k, _ in records)
    hosts = [HostInfo("127.0.0.1", 1001), HostInfo("127.0.0.1", 1002)]
    instances = {h: instance(cluster, names, tmp_path, source, sink, h) for h in hosts}
    first, second = instances.values()
    with pytest.raises(IllegalStateError, match="not been started"):
        first.query_metadata_for_key(STORE, "k0", STR)

    async with AsyncExitStack() as stack:
        for streams in instances.values():
            await streams.start_async()
            stack.push_async_callback(streams.close_async)
        await eventually_async(lambda: settled(instances, source), timeout=60, what="both instances settled")

        def located() -> bool:
            for key, count in expected.items():
                metadata = first.query_metadata_for_key(STORE, key, STR)
                assert metadata == second.query_metadata_for_key(STORE, key, STR)
                assert metadata is not None and metadata != KeyQueryMetadata.NOT_AVAILABLE
                assert metadata.partition == key_hash(STR.serialize(key)) % PARTITIONS
                assert metadata.standby_hosts == frozenset()
                owner = instances[metadata.active_host]
                other = second if owner is first else first
                assert other.store(STORE).get(key) is None
                if owner.store(STORE).get(key) != count:
                    return False
            return True

        await eventually_async(located, timeout=30, what="every key counted on the instance its metadata names")
        assert first.query_metadata_for_key("no-such-store", "k0", STR) is None
        assert [m.host_info for m in first.metadata_for_store(STORE)] == hosts

        # One instance leaves: after the rebalance the other owns every partition, its counts restored.
        await second.close_async()
        del instances[hosts[1]]
        await eventually_async(lambda: settled(instances, source), timeout=60, what="the first owns all")
        assert first.metadata_for_all_clients() == [StreamsMetadata(
            hosts[0], frozenset({STORE}), frozenset(TopicPartition(source, p) for p in range(PARTITIONS)))]

        def all_on_first() -> bool:
            return all(first.query_metadata_for_key(STORE, key, STR).active_host == hosts[0]  # type: ignore[union-attr]
                       and first.store(STORE).get(key) == count for key, count in expected.items())

        await eventually_async(all_on_first, timeout=30, what="every key on the first instance")
    with pytest.raises(IllegalStateError, match="not running"):
        first.metadata_for_all_clients()


async def test_a_static_member_back_with_another_endpoint_is_known_to_the_others(tmp_path) -> None:
    """A static member that returns within session.timeout.ms gets its old assignment without a
    rebalance; its new application.server is in no one's metadata until it rejoins, which it does
    (Kafka Streams' StreamsPartitionAssignor.verifyHostInfo). On the memory broker only: it models
    the static rejoin exactly; the assignor's side is the same on both transports."""
    bootstrap = f"memory://query-static-{tmp_path.name}"
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    source, sink, app = "input", "counts", "static-app"
    await cluster.create_topics({source: PARTITIONS, sink: PARTITIONS})
    old, new, other = HostInfo("127.0.0.1", 1001), HostInfo("127.0.0.1", 1011), HostInfo("127.0.0.1", 1002)

    def static(host: HostInfo, instance_id: str | None) -> KafkaStreams:
        extra = {"group_instance_id": instance_id} if instance_id else {}
        return make_streams(count_topology(source, sink, STORE, persistent=False), bootstrap, app,
                            state_dir=str(tmp_path / str(host.port)), application_server=host.endpoint, **extra)

    def hosts_seen(streams: KafkaStreams) -> set[HostInfo]:
        return {m.host_info for m in streams.metadata_for_all_clients()}

    async with static(other, None) as stays:
        first = static(old, "query-static")
        async with first:
            await eventually_async(lambda: hosts_seen(stays) == {old, other}, timeout=30, what="both known")
        # Closed without leaving the group (static); back at once with another endpoint.
        async with static(new, "query-static") as back:
            await eventually_async(lambda: hosts_seen(stays) == hosts_seen(back) == {new, other}, timeout=30,
                                   what="the new endpoint known to both instances")


async def test_a_new_instance_knows_nothing_until_its_first_assignment_the_others_keep_theirs(tmp_path) -> None:
    """While an instance's first rebalance is under way its key metadata is NOT_AVAILABLE; an
    instance already running keeps the previous assignment's metadata until the next one arrives
    (Kafka Streams' StreamsMetadataState: NOT_AVAILABLE until initialized, as
    StreamsMetadataStateTest.shouldReturnNotAvailableWhenClusterIsEmpty; onChange only on assignment).
    The rebalance is held open by the running instance's thread, blocked in a record on the memory broker."""
    bootstrap = f"memory://query-first-{tmp_path.name}"
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    source, sink, app = "input", "counts", "first-app"
    await cluster.create_topics({source: PARTITIONS, sink: PARTITIONS})
    a, b = HostInfo("127.0.0.1", 1001), HostInfo("127.0.0.1", 1002)
    entered, release = threading.Event(), threading.Event()

    def block_on(_key: str, value: str) -> None:
        if value == "block":
            entered.set()
            release.wait(timeout=30)

    def topology() -> Topology:
        builder = StreamsBuilder()
        stream = builder.stream(source, key_serde=STR, value_serde=STR).peek(block_on)
        stream.group_by_key().count(materialized=Materialized(STORE, persistent=False))
        return builder.build()

    def start(host: HostInfo) -> KafkaStreams:
        return make_streams(topology(), bootstrap, app, state_dir=str(tmp_path / str(host.port)),
                            application_server=host.endpoint)

    async with start(a) as first:
        await eventually_async(lambda: settled({a: first}, source), timeout=30, what="the first alone")
        await cluster.produce(source, [("k", "block")], STR, STR, partitions=PARTITIONS)
        await anyio.to_thread.run_sync(entered.wait, 30)
        try:
            async with start(b) as second:
                assert second.query_metadata_for_key(STORE, "k", STR) is KeyQueryMetadata.NOT_AVAILABLE
                assert second.metadata_for_all_clients() == [] and second.metadata_for_store(STORE) == []
                metadata = first.query_metadata_for_key(STORE, "k", STR)
                assert metadata is not None and metadata.active_host == a  # the last assignment's
                release.set()
                await eventually_async(lambda: settled({a: first, b: second}, source), timeout=30,
                                       what="both settled after the rebalance")
        finally:
            release.set()
