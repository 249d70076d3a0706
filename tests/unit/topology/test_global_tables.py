"""``builder.global_table`` and ``stream.join``/``left_join`` with it, in the test driver."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from streamloop import ClientState, KafkaStreams, StreamsBuilder
from streamloop.errors import DeserializationError, InvalidStateStoreError, TopologyError
from streamloop.serdes import IntegerSerde, StringSerde
from streamloop.state import Materialized
from streamloop.testing import TopologyTestDriver, eventually
from streamloop.topology.global_tables import GlobalKTable
from streamloop.transport.memory import MemoryBroker

STR, INT = StringSerde(), IntegerSerde()


def foreign_key(_key: Any, value: str) -> str | None:
    """Kafka Streams' tests' key mapper: the lookup key after the comma of "X0,FKey0" (None if none)."""
    parts = value.split(",")
    return parts[1] if len(parts) > 1 else None


def joined_topology(left: bool, partitions_store: str = "globals") -> Any:
    builder = StreamsBuilder()
    table = builder.global_table("global", key_serde=STR, value_serde=STR, materialized=partitions_store)
    stream = builder.stream("in", key_serde=INT, value_serde=STR)
    join = stream.left_join if left else stream.join
    join(table, foreign_key, lambda value, other: f"{value}+{other}").to("out", key_serde=INT, value_serde=STR)
    return builder.build()


def drive(left: bool, config: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    driver = TopologyTestDriver(joined_topology(left), {"default.dsl.store": "in_memory", **(config or {})},
                                **kwargs)
    return (driver, driver.create_input_topic("in", INT, STR), driver.create_input_topic("global", STR, STR),
            driver.create_output_topic("out", INT, STR))


def test_inner_join_matches_only_keys_the_global_table_has_and_table_updates_emit_nothing() -> None:
    """KStreamGlobalKTableJoinTest: shouldNotJoinWithEmptyGlobalTableOnStreamUpdates,
    shouldNotJoinOnGlobalTableUpdates, shouldJoinOnlyIfMatchFoundOnStreamUpdates and
    shouldClearGlobalTableEntryOnNullValueUpdates, step by step."""
    driver, stream, table, out = drive(left=False)
    with driver:
        stream.pipe_records([(i, f"X{i},FKey{i}") for i in range(2)])
        assert out.is_empty()  # empty global table: nothing joins
        table.pipe_records([(f"FKey{i}", f"Y{i}") for i in range(2)])
        assert out.is_empty()  # an update of the global table emits nothing
        stream.pipe_records([(i, f"X{i},FKey{i}") for i in range(4)])
        assert out.read_key_values() == [(0, "X0,FKey0+Y0"), (1, "X1,FKey1+Y1")]
        table.pipe_input("FKey0", None)  # a tombstone removes the row
        stream.pipe_records([(i, f"X{i},FKey{i}") for i in range(2)])
        assert out.read_key_values() == [(1, "X1,FKey1+Y1")]


def test_inner_join_drops_null_lookup_keys_and_null_values() -> None:
    """KStreamGlobalKTableJoinTest: shouldNotJoinOnNullKeyMapperValues and
    shouldNotJoinOnNullKeyMapperValueWithNullKey (a null key is fine when the mapper gives a key)."""
    driver, stream, table, out = drive(left=False)
    with driver:
        table.pipe_input("FKey1", "Y1")
        stream.pipe_input(0, "X0")  # no lookup key
        stream.pipe_input(2, None)  # no value: nothing to join
        stream.pipe_input(None, "X1,FKey1")
        assert out.read_key_values() == [(None, "X1,FKey1+Y1")]


def test_left_join_joins_every_record_with_a_value_passing_none_for_a_missing_row_or_lookup_key() -> None:
    """KStreamGlobalKTableLeftJoinTest: shouldJoinWithEmptyGlobalTableOnStreamUpdates,
    shouldJoinRegardlessIfMatchFoundOnStreamUpdates, and (KIP-962, Kafka Streams 3.7+)
    shouldJoinOnNullKeyMapperValues; a record without a value is still dropped."""
    driver, stream, table, out = drive(left=True)
    with driver:
        stream.pipe_input(0, "X0,FKey0")
        table.pipe_input("FKey1", "Y1")
        stream.pipe_records([(1, "X1,FKey1"), (2, "X2"), (3, None)])
        assert out.read_key_values() == [(0, "X0,FKey0+None"), (1, "X1,FKey1+Y1"), (2, "X2+None")]


def test_join_needs_no_copartitioning_nor_repartition_after_a_key_change() -> None:
    builder = StreamsBuilder()
    table = builder.global_table("global", key_serde=STR, value_serde=STR, materialized="globals")
    (builder.stream("in", key_serde=INT, value_serde=STR)
            .select_key(lambda _k, v: v)  # a new key: a KTable join would repartition first
            .join(table, lambda key, _v: key, lambda v, other: f"{v}:{other}")
            .to("out", key_serde=STR, value_serde=STR))
    topology = builder.build()
    assert topology.repartition_topics() == []
    assert "global" not in topology.source_topics  # no task reads it
    with TopologyTestDriver(topology, {"default.dsl.store": "in_memory"},
                            partitions={"in": 3, "global": 2}) as driver:
        rows = driver.create_input_topic("global", STR, STR)
        rows.pipe_records([(f"k{i}", f"v{i}") for i in range(6)])
        stream = driver.create_input_topic("in", INT, STR)
        stream.pipe_records([(i, f"k{i}") for i in range(7)])
        out = driver.create_output_topic("out", STR, STR)
        assert sorted(out.read_key_values()) == [(f"k{i}", f"k{i}:v{i}") for i in range(6)]
        store = driver.get_key_value_store("globals")
        assert sorted(store.all()) == [(f"k{i}", f"v{i}") for i in range(6)]
        assert store.get("k3") == "v3"


@pytest.mark.parametrize("persistent", [False, True])
def test_the_global_store_is_queryable_and_survives_a_crash_of_the_tasks(persistent: bool) -> None:
    store = "rocksDB" if persistent else "in_memory"
    driver, stream, table, out = drive(left=False, config={"default.dsl.store": store})
    with driver:
        table.pipe_records([("FKey1", "Y1"), ("FKey2", "Y2"), ("FKey2", "Y2b")])
        driver.crash()  # the tasks restart; the global table is not theirs
        stream.pipe_input(2, "X2,FKey2")
        assert out.read_key_values() == [(2, "X2,FKey2+Y2b")]
        assert dict(driver.get_key_value_store("globals").all()) == {"FKey1": "Y1", "FKey2": "Y2b"}


def test_global_table_api_errors() -> None:
    builder = StreamsBuilder()
    table = builder.global_table("global", materialized=Materialized.as_("g"))
    assert isinstance(table, GlobalKTable) and table.queryable_store_name == "g"
    with pytest.raises(TopologyError, match="already read by global source"):
        builder.stream("global")
    with pytest.raises(TopologyError, match="already added"):
        builder.global_table("other", materialized="g")
    stream = builder.stream("in")
    with pytest.raises(TypeError, match="key_selector needs a callable"):
        stream.join(table, None, lambda v, o: v)  # type: ignore[arg-type]

    async def joiner(v: Any, o: Any) -> Any:
        return v
    with pytest.raises(TopologyError, match="plain function"):
        stream.left_join(table, lambda k, v: k, joiner)
    stream.join(table, lambda k, _v: k, lambda v, _o: v).to("out")
    with TopologyTestDriver(builder.build()) as driver:
        with pytest.raises(InvalidStateStoreError):
            driver.get_key_value_store("nope")
        with pytest.raises(TypeError, match="read-only"):
            driver._global.stores["g"].put(b"k", b"v")


def test_a_topology_of_only_a_global_table_is_valid_and_its_topic_is_a_source_of_the_driver() -> None:
    builder = StreamsBuilder()
    builder.global_table("global", key_serde=STR, value_serde=STR, materialized="only")
    with TopologyTestDriver(builder.build(), {"default.dsl.store": "in_memory"}, strict_topics=True) as driver:
        assert driver.unused_topics().sources_without_input == ("global",)
        driver.create_input_topic("global", STR, STR).pipe_input("a", "1")
        assert driver.get_key_value_store("only").get("a") == "1"
        assert not driver.unused_topics()  # piped to: neither an unused source nor an unread output


def test_describe_shows_a_global_table_as_kafka_streams_does() -> None:
    builder = StreamsBuilder()
    table = builder.global_table("g", materialized="gs")
    builder.stream("in").join(table, lambda k, _v: k, lambda v, _o: v).to("out")
    described = builder.build().describe()
    assert described.endswith("\n\n")  # each sub-topology ends with a blank line
    assert described.split("\n\n")[1] == (
        "   Sub-topology: 1 for global store (will not generate tasks)\n"
        "    Source: KSTREAM-SOURCE-0000000000 (topics: [g])\n"
        "      --> KTABLE-SOURCE-0000000001\n"
        "    Processor: KTABLE-SOURCE-0000000001 (stores: [gs])\n"
        "      --> none\n"
        "      <-- KSTREAM-SOURCE-0000000000")


def test_every_instance_holds_a_global_store_in_the_query_metadata() -> None:
    """Kafka Streams' StreamsMetadataState: a global store is listed on every host, and a key of it
    is on this host, with no partition (StreamsMetadataStateTest.shouldGetQueryMetadataForGlobalStoreWithKey)."""
    driver, *_ = drive(left=False, config={"application.server": "localhost:7070"})
    with driver:
        metadata = driver.query_metadata_for_key("globals", "FKey1", STR)
        assert (metadata.active_host.endpoint, metadata.standby_hosts, metadata.partition) == (
            "localhost:7070", frozenset(), -1)
        assert ["globals" in m.state_store_names for m in driver.metadata_for_all_clients()] == [True]


def test_the_state_cleaner_leaves_the_global_stores_directory_alone(tmp_path) -> None:
    """Kafka Streams' StateDirectory cleans only task directories, never the global one."""
    bootstrap = f"memory://global-{uuid.uuid4().hex[:8]}"
    MemoryBroker.for_url(bootstrap).create_topics({"global": 1, "in": 1, "out": 1})
    builder = StreamsBuilder()
    table = builder.global_table("global", key_serde=STR, value_serde=STR,
                                 materialized=Materialized("g", persistent=True))
    builder.stream("in", key_serde=STR, value_serde=STR).group_by_key().count(materialized="counts")
    builder.stream("out").join(table, lambda k, _v: k, lambda v, _o: v)
    config = {"application.id": "cleaning", "bootstrap.servers": bootstrap, "state.dir": str(tmp_path),
              "state.cleanup.delay.ms": 0, "poll.ms": 10}
    with KafkaStreams(builder.build(), config) as streams:
        assert streams.wait_for_state(ClientState.RUNNING, timeout=30)
        cleaner = streams._cleaner
        assert cleaner is not None
        eventually(lambda: streams.metadata_for_local_threads()[0].active_tasks, timeout=30, what="tasks")
        cleaner.clean_once()
        assert "global" not in cleaner.deleted and (tmp_path / "cleaning" / "global" / "g").is_dir()


def test_a_record_the_serdes_cannot_read_goes_to_the_deserialization_handler() -> None:
    """As Kafka Streams' global task reads a record (GlobalStateUpdateTask): LogAndFail fails,
    LogAndContinue skips the record and the table keeps its row."""
    with (TopologyTestDriver(_ints_topology(), {"default.dsl.store": "in_memory"}) as driver,
          pytest.raises(DeserializationError, match="value of the record at global-0 offset 0")):
        driver.pipe_raw("global", b"k", b"not four bytes")
    config = {"default.dsl.store": "in_memory",
              "default.deserialization.exception.handler": "streamloop.handlers.LogAndContinueExceptionHandler"}
    with TopologyTestDriver(_ints_topology(), config) as driver:
        driver.create_input_topic("global", STR, INT).pipe_input("k", 1)
        driver.pipe_raw("global", b"k", b"not four bytes")
        assert driver.get_key_value_store("ints").get("k") == 1


def _ints_topology() -> Any:
    builder = StreamsBuilder()
    builder.global_table("global", key_serde=STR, value_serde=INT, materialized="ints")
    return builder.build()
