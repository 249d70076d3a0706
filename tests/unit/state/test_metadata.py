"""StreamsMetadataState: which endpoint owns which partitions of each store, and a key's host.

The scenario is Kafka Streams' ``StreamsMetadataStateTest`` (streams/src/test/java/org/apache/kafka/
streams/processor/internals/StreamsMetadataStateTest.java): four source topics, a count per topic,
one count over the merge of the first two, three hosts with active and standby partitions.
"""

from __future__ import annotations

import threading

import pytest
from aiokafka.partitioner import murmur2

from streamloop.errors import ConfigError
from streamloop.records import TopicPartition
from streamloop.serdes import StringSerde
from streamloop.state import Materialized
from streamloop.state.metadata import HostInfo, KeyQueryMetadata, StreamsMetadata, StreamsMetadataState
from streamloop.topology.builder import StreamsBuilder
from streamloop.topology.topology import Topology

STR = StringSerde()
ONE, TWO, THREE = HostInfo("host-one", 8080), HostInfo("host-two", 9090), HostInfo("host-three", 7070)
T1P0, T1P1 = TopicPartition("topic-one", 0), TopicPartition("topic-one", 1)
T2P0, T2P1 = TopicPartition("topic-two", 0), TopicPartition("topic-two", 1)
T3P0, T4P0 = TopicPartition("topic-three", 0), TopicPartition("topic-four", 0)


def topology() -> Topology:
    builder = StreamsBuilder()
    one = builder.stream("topic-one")
    one.group_by_key().count(materialized=Materialized("table-one"))
    two = builder.stream("topic-two")
    two.group_by_key().count(materialized=Materialized("table-two"))
    builder.stream("topic-three").group_by_key().count(materialized=Materialized("table-three"))
    one.merge(two).group_by_key().count(materialized=Materialized("merged-table"))
    builder.stream("topic-four").map_values(lambda v: v).to("out")
    return builder.build()


def store_sources(topo: Topology) -> dict[str, tuple[str, ...]]:
    """As ``KafkaStreams`` computes it: each store's sub-topology's source topics."""
    return {name: topo.subtopology_of_store(name).source_topics for name in topo.store_names}


ACTIVE = {ONE: {T1P0, T2P1, T4P0}, TWO: {T2P0, T1P1}, THREE: {T3P0}}
STANDBY = {THREE: {T1P0, T2P1, T4P0}, ONE: {T2P0, T1P1}, TWO: {T3P0}}


@pytest.fixture
def state() -> StreamsMetadataState:
    state = StreamsMetadataState(ONE, store_sources(topology()))
    state.on_change(ACTIVE, STANDBY)
    return state


def test_the_merged_store_reads_both_topics() -> None:
    sources = store_sources(topology())
    assert set(sources["merged-table"]) == {"topic-one", "topic-two"}
    assert sources["table-three"] == ("topic-three",)


def test_all_instances_with_their_active_and_standby_stores(state: StreamsMetadataState) -> None:
    """As shouldGetAllStreamInstances (without the global store: there are no global tables yet)."""
    assert state.all_metadata() == [
        StreamsMetadata(ONE, frozenset({"table-one", "table-two", "merged-table"}), frozenset(ACTIVE[ONE]),
                        frozenset({"table-one", "table-two", "merged-table"}), frozenset(STANDBY[ONE])),
        StreamsMetadata(THREE, frozenset({"table-three"}), frozenset(ACTIVE[THREE]),
                        frozenset({"table-one", "table-two", "merged-table"}), frozenset(STANDBY[THREE])),
        StreamsMetadata(TWO, frozenset({"table-one", "table-two", "merged-table"}), frozenset(ACTIVE[TWO]),
                        frozenset({"table-three"}), frozenset(STANDBY[TWO])),
    ]  # sorted by host, then port
    assert state.local_metadata() == state.all_metadata()[0]


def test_an_instance_without_stores_is_listed_too(state: StreamsMetadataState) -> None:
    """As shouldGetAllStreamsInstancesWithNoStores."""
    four = HostInfo("host-four", 8080)
    state.on_change({**ACTIVE, four: {T4P0}}, {})
    assert StreamsMetadata(four, frozenset(), frozenset({T4P0})) in state.all_metadata()


def test_instances_for_a_store_include_its_standbys(state: StreamsMetadataState) -> None:
    """As shouldGetInstancesForStoreName and
    shouldReturnEmptyCollectionOnGetAllInstancesWithStoreWhenStoreDoesntExist."""
    assert [m.host_info for m in state.all_metadata_for_store("table-one")] == [ONE, THREE, TWO]
    assert [m.host_info for m in state.all_metadata_for_store("table-three")] == [THREE, TWO]
    assert state.all_metadata_for_store("not-a-store") == []


def test_a_key_names_its_active_and_standby_hosts() -> None:
    """As shouldGetInstanceWithKey: one partition of topic-three (count 1), active on three, standby on two."""
    state = StreamsMetadataState(ONE, store_sources(topology()))
    state.on_change(ACTIVE, STANDBY)
    assert state.key_query_metadata_for_key("table-three", "the-key", STR) == KeyQueryMetadata(
        THREE, frozenset({TWO}), 0)


def test_a_merged_store_key_is_found_on_either_source_topic() -> None:
    """As shouldGetInstanceWithKeyWithMergedStreams: partition 2 of topic-two is on host two."""
    t2p2 = TopicPartition("topic-two", 2)
    state = StreamsMetadataState(ONE, store_sources(topology()))
    state.on_change({**ACTIVE, TWO: {T2P0, T1P1, t2p2}}, {**STANDBY, ONE: {T2P0, T1P1, t2p2}})
    key = next(k for k in (f"k{i}" for i in range(100)) if (murmur2(STR.serialize(k)) & 0x7FFFFFFF) % 3 == 2)
    assert state.key_query_metadata_for_key("merged-table", key, STR) == KeyQueryMetadata(TWO, frozenset({ONE}), 2)


def test_the_partition_is_the_producers() -> None:
    state = StreamsMetadataState(ONE, {"s": ("t",)})
    state.on_change({ONE: {TopicPartition("t", p) for p in range(0, 7, 2)},
                     TWO: {TopicPartition("t", p) for p in range(1, 7, 2)}}, {})
    for key in ("a", "b", "key-42", "ünïcode"):
        expected = (murmur2(key.encode()) & 0x7FFFFFFF) % 7
        metadata = state.key_query_metadata_for_key("s", key, STR)
        assert metadata == KeyQueryMetadata(ONE if expected % 2 == 0 else TWO, frozenset(), expected)


def test_not_available_before_any_assignment_and_for_an_empty_one() -> None:
    """As shouldReturnNotAvailableWhenClusterIsEmpty and shouldNotThrowExceptionWhenOnChangeNotCalled."""
    state = StreamsMetadataState(ONE, store_sources(topology()))
    assert state.key_query_metadata_for_key("table-one", "a", STR) is KeyQueryMetadata.NOT_AVAILABLE
    assert state.all_metadata() == [] and state.all_metadata_for_store("table-one") == []
    state.on_change({}, {})
    assert state.key_query_metadata_for_key("table-one", "a", STR) is KeyQueryMetadata.NOT_AVAILABLE
    assert KeyQueryMetadata(HostInfo("unavailable", -1), frozenset(), -1) == KeyQueryMetadata.NOT_AVAILABLE


def test_an_unknown_store_has_no_key_metadata(state: StreamsMetadataState) -> None:
    """As shouldReturnNullOnGetWithKeyWhenStoreDoesntExist; a None argument is an error (shouldThrowWhenKeyIsNull)."""
    assert state.key_query_metadata_for_key("not-a-store", "key", STR) is None
    with pytest.raises(TypeError):
        state.key_query_metadata_for_key("table-three", None, STR)
    with pytest.raises(TypeError):
        state.key_query_metadata_for_key("table-three", "key", None)  # type: ignore[arg-type]


def test_metadata_handed_out_stays_as_it_was_after_a_change(state: StreamsMetadataState) -> None:
    """As shouldReturnAllMetadataThatRemainsValidAfterChange and shouldNotReturnMutableReference..."""
    before = state.all_metadata()
    copy = list(before)
    before.clear()
    assert state.all_metadata() == copy
    state.on_change({}, {})
    assert state.all_metadata() == [] and copy[0].host_info == ONE


def test_an_instance_without_endpoint_sees_the_others() -> None:
    state = StreamsMetadataState(None, {"s": ("t",)})
    state.on_change({TWO: {TopicPartition("t", 0)}}, {})
    assert state.local_metadata() == StreamsMetadata(HostInfo.unavailable(), frozenset(), frozenset())
    assert state.key_query_metadata_for_key("s", "k", STR) == KeyQueryMetadata(TWO, frozenset(), 0)


def test_reads_from_other_threads_see_whole_assignments() -> None:
    """Each change replaces one snapshot: a reader never sees half of one assignment and half of another."""
    state = StreamsMetadataState(ONE, {"s": ("t",)})
    first = {ONE: {TopicPartition("t", p) for p in range(8)}}
    second = {ONE: {TopicPartition("t", p) for p in range(4)}, TWO: {TopicPartition("t", p) for p in range(4, 8)}}
    state.on_change(first, {})
    stop = threading.Event()
    seen: set[tuple[HostInfo, ...]] = set()

    def read() -> None:
        while not stop.is_set():
            metadata = state.all_metadata()
            assert sum(len(m.topic_partitions) for m in metadata) == 8
            seen.add(tuple(m.host_info for m in metadata))

    reader = threading.Thread(target=read)
    reader.start()
    for i in range(2000):
        state.on_change(second if i % 2 else first, {})
    stop.set()
    reader.join()
    assert seen <= {(ONE,), (ONE, TWO)}


@pytest.mark.parametrize(("endpoint", "expected"), [
    ("localhost:8080", HostInfo("localhost", 8080)),
    ("10.0.0.7:1", HostInfo("10.0.0.7", 1)),
    ("[::1]:65535", HostInfo("::1", 65535)),
    ("", None),
    ("  ", None),
])
def test_host_info_from_endpoint(endpoint: str, expected: HostInfo | None) -> None:
    assert HostInfo.build_from_endpoint(endpoint) == expected
    if expected is not None:
        assert HostInfo.build_from_endpoint(expected.endpoint) == expected


@pytest.mark.parametrize("endpoint", ["localhost", "localhost:0", "localhost:65536", ":8080", "a:b", "a:1,b:2",
                                      "http://a:80", "::1:80"])
def test_a_malformed_endpoint_is_a_config_error(endpoint: str) -> None:
    with pytest.raises(ConfigError, match=r"application\.server.*expected host:port"):
        HostInfo.build_from_endpoint(endpoint)


def test_application_server_is_checked_with_the_config() -> None:
    from streamloop.config import StreamsConfig

    base = {"application.id": "app", "bootstrap.servers": "memory://x"}
    assert StreamsConfig(base)["application.server"] == ""
    assert StreamsConfig({**base, "application.server": "app-1:8080"})["application.server"] == "app-1:8080"
    with pytest.raises(ConfigError, match=r"application\.server.*expected host:port.*got 'app-1'"):
        StreamsConfig({**base, "application.server": "app-1"})
