"""The assignor carries each instance's ``application.server`` and hands out the partitions by host.

As Kafka Streams' ``SubscriptionInfo.userEndPoint`` and ``AssignmentInfo.partitionsByHost``
(``StreamsPartitionAssignor.populatePartitionsByHostMaps``): every member of the group gets the
same map; the threads of one instance add up under its endpoint; members without one are left out.
"""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from streamloop.ids import TaskId
from streamloop.records import TopicPartition
from streamloop.serdes import StringSerde
from streamloop.state.metadata import HostInfo, KeyQueryMetadata, StreamsMetadataState
from streamloop.tasks.assignor import AssignmentInfo, StreamsAssignor, SubscriptionInfo
from streamloop.topology.builder import StreamsBuilder
from streamloop.topology.topology import Topology
from streamloop.transport.base import MemberAssignment, MemberSubscription

A, B = HostInfo("a.internal", 8080), HostInfo("::1", 9090)
hosts = st.builds(HostInfo, st.from_regex(r"[a-z0-9.-]{1,20}", fullmatch=True), st.integers(1, 65535))
partitions = st.sets(st.builds(TopicPartition, st.sampled_from(["in", "other-topic", "x-repartition"]),
                               st.integers(0, 63)), max_size=20)


def topology() -> Topology:
    builder = StreamsBuilder()
    builder.stream("in").group_by_key().count().to_stream().to("out")
    return builder.build()


def test_subscription_carries_the_endpoint_and_an_old_one_reads_as_none() -> None:
    info = SubscriptionInfo("p", "t", [TaskId(0, 1)], endpoint="a.internal:8080")
    assert SubscriptionInfo.decode(info.encode()) == info
    old = orjson.dumps({"v": 1, "process": "p", "thread": "t", "prev": ["0_1"], "err": 0})
    assert SubscriptionInfo.decode(old).endpoint == ""


@given(st.dictionaries(hosts, partitions, max_size=4), st.dictionaries(hosts, partitions, max_size=3))
def test_assignment_info_round_trips_the_partitions_by_host(active: dict, standby: dict) -> None:  # type: ignore[type-arg]
    info = AssignmentInfo([TaskId(0, 0)], partitions_by_host=active, standby_partitions_by_host=standby)
    assert AssignmentInfo.decode(info.encode()) == info


def test_an_assignment_without_hosts_has_none() -> None:
    old = orjson.dumps({"v": 1, "tasks": ["0_0"], "err": 0})
    assert AssignmentInfo.decode(old) == AssignmentInfo([TaskId(0, 0)])


def test_every_member_learns_which_endpoint_owns_which_partitions() -> None:
    topo = topology()
    members = {  # member id -> (process, endpoint)
        "a-1": ("process-a", A.endpoint), "a-2": ("process-a", A.endpoint),
        "b-1": ("process-b", B.endpoint), "c-1": ("process-c", ""),
    }
    assignors = {m: StreamsAssignor(topo, process, m, endpoint) for m, (process, endpoint) in members.items()}
    subscriptions = {m: MemberSubscription(m, ("in",), a.subscription_user_data(["in"])) for m, a in assignors.items()}

    result = assignors["a-1"].assign(subscriptions, {"in": 8})

    owned = {m: set(result[m].partitions) for m in members}
    expected = {A: owned["a-1"] | owned["a-2"], B: owned["b-1"]}
    assert all(owned.values())  # every member got tasks, the one without endpoint too
    for member in members:
        assert AssignmentInfo.decode(result[member].user_data).partitions_by_host == expected


def test_on_assignment_updates_the_clients_metadata() -> None:
    topo = topology()
    (store,) = topo.store_names
    sources = {store: topo.subtopology_of_store(store).source_topics}
    state = StreamsMetadataState(A, sources)
    assignor = StreamsAssignor(topo, "process-a", "a-1", A.endpoint, state)
    assert state.key_query_metadata_for_key(store, "k", StringSerde()) is KeyQueryMetadata.NOT_AVAILABLE

    by_host = {A: {TopicPartition("in", 0)}, B: {TopicPartition("in", 1)}}
    assignor.on_assignment(MemberAssignment((TopicPartition("in", 0),),
                                            AssignmentInfo([TaskId(0, 0)], partitions_by_host=by_host).encode()))

    assert [m.host_info for m in state.all_metadata()] == [B, A]  # "::1" sorts before "a.internal"
    assert {m.host_info: m.topic_partitions for m in state.all_metadata()} == by_host
    metadata = state.key_query_metadata_for_key(store, "k", StringSerde())
    assert metadata is not None and metadata.active_host == (A if metadata.partition == 0 else B)


def test_an_assignment_without_this_instances_endpoint_asks_for_a_rejoin() -> None:
    """As Kafka Streams' StreamsPartitionAssignor.verifyHostInfo (a static member back with a new endpoint)."""
    def after(endpoint: str, by_host: dict[HostInfo, set[TopicPartition]]) -> bool:
        assignor = StreamsAssignor(topology(), "p", "t", endpoint)
        assignor.on_assignment(MemberAssignment((), AssignmentInfo([], partitions_by_host=by_host).encode()))
        return assignor.rejoin_for_endpoint

    assert after(A.endpoint, {B: {TopicPartition("in", 0)}})
    assert not after(A.endpoint, {A: set(), B: {TopicPartition("in", 0)}})  # listed, even without partitions
    assert not after(A.endpoint, {})  # no instance sets an endpoint
    assert not after("", {B: {TopicPartition("in", 0)}})


def test_two_instances_with_one_endpoint_are_warned_about(caplog) -> None:  # type: ignore[no-untyped-def]
    topo = topology()
    assignors = {m: StreamsAssignor(topo, f"process-{m}", m, A.endpoint) for m in ("x", "y")}
    subscriptions = {m: MemberSubscription(m, ("in",), a.subscription_user_data(["in"])) for m, a in assignors.items()}
    with caplog.at_level("WARNING", logger="streamloop.tasks.assignor"):
        assignors["x"].assign(subscriptions, {"in": 2})
    assert "2 instances set application.server to a.internal:8080" in caplog.text
