"""A table's own operations (``filter``, ``filter_not``, ``map_values``, ``group_by(...)``
aggregations, table–table joins) through the ``TopologyTestDriver``, checked against the
outputs of Kafka Streams' own tests for the same inputs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from streamloop.errors import TopologyError
from streamloop.processors.api import BaseProcessor
from streamloop.processors.change import ChangeSerde, TableChange, old_value_of
from streamloop.records import Record
from streamloop.serdes import JsonSerde, LongSerde, StringSerde
from streamloop.state import Materialized, TimeWindows
from streamloop.testing import TopologyTestDriver
from streamloop.topology.builder import StreamsBuilder
from streamloop.topology.copartition import check_copartition_groups
from streamloop.topology.tables import KTable

STR, JSON, LONG = StringSerde(), JsonSerde(), LongSerde()
NO_CACHE = {"cache.max.bytes.buffering": 0, "default.key.serde": STR, "default.value.serde": JSON}


def table(builder: StreamsBuilder, topic: str, **kwargs: Any) -> KTable:
    return builder.table(topic, key_serde=STR, value_serde=JSON, **kwargs)


@pytest.fixture
def builder() -> StreamsBuilder:
    return StreamsBuilder()


def run(builder: StreamsBuilder, inputs: list[tuple[str, str, Any]], outputs: list[str],
        config: dict[str, Any] | None = None) -> dict[str, list[tuple[Any, Any]]]:
    """Pipe ``(topic, key, value)`` in order; the key-values written to each output topic."""
    with TopologyTestDriver(builder.build(), config or NO_CACHE) as driver:
        topics = {t: driver.create_input_topic(t, STR, JSON) for t in {t for t, _, _ in inputs}}
        for timestamp, (topic, key, value) in enumerate(inputs):
            topics[topic].pipe_input(key, value, timestamp)
        return {t: driver.create_output_topic(t, STR, JSON).read_key_values() for t in outputs}


# -- filter, filter_not, map_values -------------------------------------------------------

@pytest.mark.parametrize("materialized", [None, "evens"], ids=["unmaterialized", "materialized"])
def test_filter_forwards_a_delete_only_for_keys_that_passed(builder: StreamsBuilder, materialized: str | None) -> None:
    """KTableFilterTest.shouldSendOldValuesWhenEnabledOnUpStreamMaterialization /
    doTestSendingOldValue: with old values sent, an update that fails the predicate deletes
    the key only when its previous value passed; a key that never passed is never seen."""
    t = table(builder, "input")
    t.filter(lambda _k, v: v % 2 == 0, materialized=materialized).to_stream().to("evens")
    t.filter_not(lambda _k, v: v % 2 == 0).to_stream().to("odds")
    out = run(builder, [("input", "A", 1), ("input", "B", 2), ("input", "C", 3), ("input", "D", 4),
                        ("input", "A", None), ("input", "B", None), ("input", "D", 5)], ["evens", "odds"])
    assert out["evens"] == [("B", 2), ("D", 4), ("B", None), ("D", None)]
    assert out["odds"] == [("A", 1), ("C", 3), ("A", None), ("D", 5)]


def test_materialized_filter_is_queryable(builder: StreamsBuilder) -> None:
    """KTableFilterTest.shouldGetValuesOnMaterialization: the store holds only passing rows."""
    table(builder, "input").filter(lambda _k, v: v > 1, materialized="big")
    with TopologyTestDriver(builder.build(), NO_CACHE) as driver:
        topic = driver.create_input_topic("input", STR, JSON)
        for key, value in [("A", 1), ("B", 2), ("C", 3), ("C", 0)]:
            topic.pipe_input(key, value)
        assert dict(driver.get_key_value_store("big").all()) == {"B": 2}


@pytest.mark.parametrize("materialized", [None, Materialized("lengths", value_serde=LONG)],
                         ids=["unmaterialized", "materialized"])
def test_map_values_keeps_deletes(builder: StreamsBuilder, materialized: Materialized | None) -> None:
    """KTableMapValuesTest.testKTable: each update mapped, a delete forwarded as a delete."""
    table(builder, "input").map_values(len, materialized=materialized).to_stream().to("lengths", value_serde=JSON)
    out = run(builder, [("input", "A", "01"), ("input", "B", "02"), ("input", "C", "03"), ("input", "A", None),
                        ("input", "B", "0123")], ["lengths"])
    assert out["lengths"] == [("A", 2), ("B", 2), ("C", 2), ("A", None), ("B", 4)]


def test_map_values_then_filter_sees_mapped_old_values(builder: StreamsBuilder) -> None:
    """KTableMapValuesTest.shouldEnableSendingOldValuesOnParentIfMapValuesNotMaterialized: a filter
    after an unmaterialized map_values needs the mapped old value to know what passed before."""
    table(builder, "input").map_values(lambda v: v * 10).filter(lambda _k, v: v > 15).to_stream().to("out")
    out = run(builder, [("input", "A", 1), ("input", "A", 2), ("input", "A", 1), ("input", "A", 1)], ["out"])
    assert out["out"] == [("A", 20), ("A", None)]


def test_table_functions_must_be_plain(builder: StreamsBuilder) -> None:
    async def predicate(_k: Any, _v: Any) -> bool:
        return True
    t = table(builder, "input")
    with pytest.raises(TopologyError, match="filter\\(\\) must be a plain function"):
        t.filter(predicate)
    with pytest.raises(TypeError, match="map_values\\(\\) needs a callable"):
        t.map_values(3)  # type: ignore[arg-type]


# -- group_by(...).aggregate / count / reduce -----------------------------------------------

def test_aggregate_subtracts_from_the_old_group_and_adds_to_the_new(builder: StreamsBuilder) -> None:
    """KTableAggregateTest.testAggRepartition: a row that moves is subtracted from its old group
    and added to its new one; a row the selector maps to None or to a None key is in no group."""
    def selector(key: str, value: str) -> tuple[Any, Any] | None:
        return {"null": (None, value), "NULL": None}.get(key, (value, value))
    (builder.table("input", key_serde=STR, value_serde=STR).group_by(selector, key_serde=STR, value_serde=STR)
        .aggregate(lambda: "0", lambda _k, v, agg: f"{agg}+{v}", lambda _k, v, agg: f"{agg}-{v}",
                   materialized=Materialized("canonized", value_serde=STR))
        .to_stream().to("out", value_serde=STR))
    with TopologyTestDriver(builder.build(), NO_CACHE) as driver:
        topic = driver.create_input_topic("input", STR, STR)
        for key, value in [("A", "1"), ("A", None), ("A", "1"), ("B", "2"), ("null", "3"), ("B", "4"),
                           ("NULL", "5"), ("B", "7")]:
            topic.pipe_input(key, value)
        assert driver.create_output_topic("out", STR, STR).read_key_values() == [
            ("1", "0+1"), ("1", "0+1-1"), ("1", "0+1-1+1"), ("2", "0+2"), ("2", "0+2-2"), ("4", "0+4"),
            ("4", "0+4-4"), ("7", "0+7")]


def test_aggregate_removes_old_before_adding_new(builder: StreamsBuilder) -> None:
    """KTableAggregateTest.testRemoveOldBeforeAddNew: within a group the old value is subtracted
    before the new one is added, in one step (KIP-904): no intermediate aggregate is forwarded."""
    (builder.table("input", key_serde=STR, value_serde=STR)
        .group_by(lambda k, _v: (k[0], k[1]), key_serde=STR, value_serde=STR)
        .aggregate(lambda: "", lambda _k, v, agg: agg + v, lambda _k, v, agg: agg.replace(v, ""),
                   materialized=Materialized("some", value_serde=STR))
        .to_stream().to("out", value_serde=STR))
    with TopologyTestDriver(builder.build(), NO_CACHE) as driver:
        topic = driver.create_input_topic("input", STR, STR)
        for key, value in [("11", "A"), ("12", "B"), ("11", None), ("12", "C")]:
            topic.pipe_input(key, value)
        assert driver.create_output_topic("out", STR, STR).read_key_values() == [
            ("1", "1"), ("1", "12"), ("1", "2"), ("1", "2")]


def test_count_and_reduce_per_group(builder: StreamsBuilder) -> None:
    """KGroupedTableImplTest.shouldCountAndMaterializeResults / shouldReduceAndMaterializeResults:
    counts and sums per group follow rows moving between groups and rows deleted."""
    t = table(builder, "input")
    grouped = t.group_by(lambda _k, v: (v["region"], v["amount"]), key_serde=STR, value_serde=LONG)
    grouped.count(materialized="count").to_stream().to("counts", value_serde=LONG)
    grouped.reduce(lambda agg, v: agg + v, lambda agg, v: agg - v, materialized="sum")
    rows = [("A", {"region": "eu", "amount": 1}), ("B", {"region": "eu", "amount": 2}),
            ("C", {"region": "us", "amount": 4}), ("A", {"region": "us", "amount": 8}), ("B", None)]
    with TopologyTestDriver(builder.build(), NO_CACHE) as driver:
        topic = driver.create_input_topic("input", STR, JSON)
        for key, value in rows:
            topic.pipe_input(key, value)
        assert dict(driver.get_key_value_store("count").all()) == {"eu": 0, "us": 2}
        assert dict(driver.get_key_value_store("sum").all()) == {"eu": 0, "us": 12}
        counts = driver.create_output_topic("counts", STR, LONG).read_key_values()
    assert counts == [("eu", 1), ("eu", 2), ("us", 1), ("eu", 1), ("us", 2), ("eu", 0)]


def test_grouped_table_survives_a_crash(builder: StreamsBuilder) -> None:
    """The aggregate store is changelogged: after a crash the driver restores it and the
    subtraction of a row's old value still finds its group."""
    table(builder, "input").group_by(lambda _k, v: (v, 1), key_serde=STR, value_serde=LONG) \
        .count(materialized="count")
    with TopologyTestDriver(builder.build(), NO_CACHE) as driver:
        topic = driver.create_input_topic("input", STR, JSON)
        topic.pipe_input("A", "x")
        topic.pipe_input("B", "x")
        driver.crash()
        topic.pipe_input("A", "y")
        assert dict(driver.get_key_value_store("count").all()) == {"x": 1, "y": 1}


# -- table-table joins ----------------------------------------------------------------------

JOIN_INPUTS = [("left", "k", 1), ("left", "k", 2), ("right", "k", "a"), ("left", "k", 3), ("right", "k", "b"),
               ("left", "k", None), ("right", "j", "c"), ("right", "k", None), ("left", "j", 4), ("right", "j", None)]


def joined(left: Any, right: Any) -> list[Any]:
    return [left, right]


@pytest.mark.parametrize(("kind", "expected"), [
    # KTableKTableInnerJoinTest.testJoin: only keys both sides have; a delete of either side deletes.
    ("join", [("k", [2, "a"]), ("k", [3, "a"]), ("k", [3, "b"]), ("k", None), ("j", [4, "c"]), ("j", None)]),
    # KTableKTableLeftJoinTest.testJoin: every left row, with None while the right side lacks the key.
    ("left_join", [("k", [1, None]), ("k", [2, None]), ("k", [2, "a"]), ("k", [3, "a"]), ("k", [3, "b"]),
                   ("k", None), ("j", [4, "c"]), ("j", [4, None])]),
    # KTableKTableOuterJoinTest.testJoin: every row of either side; a delete once both sides lack the key.
    ("outer_join", [("k", [1, None]), ("k", [2, None]), ("k", [2, "a"]), ("k", [3, "a"]), ("k", [3, "b"]),
                    ("k", [None, "b"]), ("j", [None, "c"]), ("k", None), ("j", [4, "c"]), ("j", [4, None])]),
])
def test_table_table_joins(builder: StreamsBuilder, kind: str, expected: list[tuple[str, Any]]) -> None:
    left, right = table(builder, "left"), table(builder, "right")
    getattr(left, kind)(right, joined).to_stream().to("out")
    assert run(builder, JOIN_INPUTS, ["out"])["out"] == expected


def test_materialized_join_is_queryable_and_joins_with_a_filtered_table(builder: StreamsBuilder) -> None:
    """KTableKTableInnerJoinTest.testQueryableJoin, with the right side an unmaterialized filter
    (read through its parent's store, filtered on the fly)."""
    left, right = table(builder, "left"), table(builder, "right").filter(lambda _k, v: v != "skip")
    left.join(right, joined, materialized="joined")
    with TopologyTestDriver(builder.build(), NO_CACHE) as driver:
        lt, rt = driver.create_input_topic("left", STR, JSON), driver.create_input_topic("right", STR, JSON)
        rt.pipe_input("a", "x")
        rt.pipe_input("b", "skip")
        lt.pipe_input("a", 1)
        lt.pipe_input("b", 2)
        assert dict(driver.get_key_value_store("joined").all()) == {"a": [1, "x"]}
        rt.pipe_input("b", "y")
        rt.pipe_input("a", "skip")
        assert dict(driver.get_key_value_store("joined").all()) == {"b": [2, "y"]}


def test_join_results_coalesce_in_the_cache(builder: StreamsBuilder) -> None:
    """With the cache on, a materialized join forwards the last result per key at a commit."""
    left, right = table(builder, "left"), table(builder, "right")
    left.join(right, joined, materialized="joined").to_stream().to("out")
    config = {**NO_CACHE, "cache.max.bytes.buffering": 1 << 20, "commit.interval.ms": 60_000}
    with TopologyTestDriver(builder.build(), config) as driver:
        lt, rt = driver.create_input_topic("left", STR, JSON), driver.create_input_topic("right", STR, JSON)
        rt.pipe_input("k", "a", 0)
        for value in range(5):
            lt.pipe_input("k", value, 1)
        out = driver.create_output_topic("out", STR, JSON)
        assert out.read_key_values() == []
        driver.advance_wall_clock_time(60_000)
        lt.pipe_input("x", 0, 2)
        assert out.read_key_values() == [("k", [4, "a"])]


def test_joins_check_their_inputs(builder: StreamsBuilder) -> None:
    left = table(builder, "left")
    windowed = builder.stream("s", key_serde=STR).group_by_key().windowed_by(
        TimeWindows.of_size_with_no_grace(10)).count()
    with pytest.raises(TopologyError, match="needs a key-value table"):
        left.join(windowed, joined)
    with pytest.raises(TopologyError, match="needs a KTable"):
        left.join(builder.stream("t"), joined)  # type: ignore[arg-type]


def test_a_stream_joins_unmaterialized_table_operations(builder: StreamsBuilder) -> None:
    """KStreamKTableJoin reads the table through its value getter: a filter, map_values or join
    without a store of its own is read from its parents' stores with the operation applied."""
    users = table(builder, "users").filter(lambda _k, v: v != "banned").map_values(str.upper)
    profiles = users.left_join(table(builder, "ages"), joined)
    builder.stream("clicks", key_serde=STR, value_serde=JSON).left_join(profiles, joined).to("out")
    with TopologyTestDriver(builder.build(), NO_CACHE) as driver:
        driver.create_input_topic("users", STR, JSON).pipe_records([("a", "ada"), ("b", "banned"), ("d", "dan")])
        driver.create_input_topic("ages", STR, JSON).pipe_records([("a", 36), ("b", 50)])
        driver.create_input_topic("clicks", STR, JSON).pipe_records([("a", 1), ("b", 2), ("c", 3), ("d", 4)])
        assert driver.create_output_topic("out", STR, JSON).read_key_values() == [
            ("a", [1, ["ADA", 36]]), ("b", [2, None]), ("c", [3, None]), ("d", [4, ["DAN", None]])]


def test_join_inputs_must_be_copartitioned(builder: StreamsBuilder) -> None:
    left, right = table(builder, "left"), table(builder, "right")
    left.filter(lambda _k, _v: True).left_join(right.map_values(str), joined)
    topology = builder.build()
    check_copartition_groups(topology, {"left": 3, "right": 3})
    with pytest.raises(TopologyError, match=r"left_join\(\) needs co-partitioned inputs.*'left' \(3\), 'right' \(2\)"):
        check_copartition_groups(topology, {"left": 3, "right": 2})


def sub_topologies(builder: StreamsBuilder) -> Iterator[tuple[str, ...]]:
    for sub in builder.build().subtopologies:
        yield sub.source_topics


def test_a_join_runs_both_tables_in_one_task_and_group_by_repartitions(builder: StreamsBuilder) -> None:
    left, right = table(builder, "left"), table(builder, "right")
    left.join(right, joined).group_by(lambda k, v: (v[1], k)).count()
    subs = list(sub_topologies(builder))
    assert subs[0] == ("left", "right")
    assert len(subs) == 2 and subs[1][0].endswith("-repartition")


def test_materialized_join_and_filter_stores_are_restored(builder: StreamsBuilder) -> None:
    """Stores of materialized table operations are changelogged like an aggregation's: after a crash
    and a rebalance the restored stores hold the rows, and the next update's old value (a delete
    of a row that passed) is right."""
    left, right = table(builder, "left"), table(builder, "right")
    joined = left.join(right, joined_sum, materialized=Materialized("joined", value_serde=JSON))
    joined.filter(lambda _k, v: v > 10, materialized=Materialized("big", value_serde=JSON)).to_stream().to("big")
    with TopologyTestDriver(builder.build(), NO_CACHE) as driver:
        lt, rt = driver.create_input_topic("left", STR, JSON), driver.create_input_topic("right", STR, JSON)
        for key in ("a", "b"):
            lt.pipe_input(key, 5)
            rt.pipe_input(key, 10)
        driver.crash()
        driver.rebalance(driver.task_ids[0])
        assert dict(driver.get_key_value_store("joined").all()) == {"a": 15, "b": 15}
        assert dict(driver.get_key_value_store("big").all()) == {"a": 15, "b": 15}
        lt.pipe_input("a", 0)
        assert dict(driver.get_key_value_store("big").all()) == {"b": 15}
        assert driver.create_output_topic("big", STR, JSON).read_key_values() == [
            ("a", 15), ("b", 15), ("a", None)]


def joined_sum(left: int, right: int) -> int:
    return left + right


@pytest.mark.parametrize("change", [TableChange("", None), TableChange(None, ""), TableChange("new", "old"),
                                    TableChange(None, None)])
def test_a_table_change_goes_through_its_serde_unchanged(change: TableChange) -> None:
    serde = ChangeSerde(None).with_default(STR)
    assert serde.deserialize(serde.serialize(change)) == change
    assert serde.serialize(None) is None and serde.deserialize(None) is None


def test_group_by_without_serdes_writes_the_repartition_topic_with_the_defaults(builder: StreamsBuilder) -> None:
    table(builder, "input").group_by(lambda k, v: (v["team"], k)).aggregate(
        list, lambda _k, v, agg: sorted([*agg, v]), lambda _k, v, agg: [x for x in agg if x != v],
        materialized="teams")
    with TopologyTestDriver(builder.build(), NO_CACHE) as driver:  # default serdes: strings, JSON
        topic = driver.create_input_topic("input", STR, JSON)
        for key, team in [("ada", "red"), ("bob", "red"), ("ada", "blue")]:
            topic.pipe_input(key, {"team": team})
        assert dict(driver.get_key_value_store("teams").all()) == {"red": ["bob"], "blue": ["ada"]}


class Capture(BaseProcessor):
    """Keeps ``(key, value, old value)`` of each record it gets."""

    seen: ClassVar[list[tuple[Any, Any, Any]]] = []

    def process(self, record: Record) -> None:
        Capture.seen.append((record.key, record.value, old_value_of(record)))


def test_left_join_sends_old_values(builder: StreamsBuilder) -> None:
    """KTableKTableLeftJoinTest.testSendingOldValue, step by step (values and old values; a result's
    timestamp here is its update's, not the later of both sides')."""
    joined = table(builder, "t1").left_join(table(builder, "t2"), lambda a, b: f"{a}+{'null' if b is None else b}")
    joined.filter(lambda _k, _v: True).to_stream().process(Capture)  # a filter makes the join send old values
    Capture.seen = []

    def step(topic: str, pairs: list[tuple[Any, Any]]) -> list[tuple[Any, Any, Any]]:
        for key, value in pairs:
            inputs[topic].pipe_input(key, value)
        seen, Capture.seen = Capture.seen, []
        return seen
    keys = ["0", "1", "2", "3"]
    with TopologyTestDriver(builder.build(), NO_CACHE) as driver:
        inputs = {t: driver.create_input_topic(t, STR, JSON) for t in ("t1", "t2")}
        assert step("t1", [("0", "X0"), ("1", "X1"), (None, "SomeVal")]) == [
            ("0", "X0+null", None), ("1", "X1+null", None)]
        assert step("t2", [("0", "Y0"), ("1", "Y1"), (None, "AnotherVal")]) == [
            ("0", "X0+Y0", "X0+null"), ("1", "X1+Y1", "X1+null")]
        assert step("t1", [(k, f"XX{k}") for k in keys]) == [
            ("0", "XX0+Y0", "X0+Y0"), ("1", "XX1+Y1", "X1+Y1"), ("2", "XX2+null", None), ("3", "XX3+null", None)]
        assert step("t2", [(k, f"YY{k}") for k in keys]) == [
            ("0", "XX0+YY0", "XX0+Y0"), ("1", "XX1+YY1", "XX1+Y1"), ("2", "XX2+YY2", "XX2+null"),
            ("3", "XX3+YY3", "XX3+null")]
        assert step("t1", [(k, f"XXX{k}") for k in keys]) == [
            (k, f"XXX{k}+YY{k}", f"XX{k}+YY{k}") for k in keys]
        assert step("t2", [("0", None), ("1", None)]) == [
            ("0", "XXX0+null", "XXX0+YY0"), ("1", "XXX1+null", "XXX1+YY1")]
        assert step("t1", [(k, f"XXXX{k}") for k in keys]) == [
            ("0", "XXXX0+null", "XXX0+null"), ("1", "XXXX1+null", "XXX1+null"), ("2", "XXXX2+YY2", "XXX2+YY2"),
            ("3", "XXXX3+YY3", "XXX3+YY3")]
        assert step("t1", [(k, None) for k in keys]) == [
            ("0", None, "XXXX0+null"), ("1", None, "XXXX1+null"), ("2", None, "XXXX2+YY2"),
            ("3", None, "XXXX3+YY3")]


def test_a_repartition_topic_a_join_reads_gets_the_partitions_of_the_joined_topic(builder: StreamsBuilder) -> None:
    """As Kafka Streams' CopartitionedTopicsEnforcer: a regrouped table (read from a repartition
    topic) joined with a table of a 2-partition topic gets a 2-partition repartition topic, even
    though the topic it was regrouped from has 4."""
    counts = table(builder, "orders").group_by(lambda _k, v: (v["user"], 1)).count()
    counts.join(table(builder, "users"), joined).to_stream().to("out")
    table(builder, "other").group_by(lambda _k, v: (v, 1)).count()  # joined with nothing: keeps 4
    topology = builder.build()
    topology.set_application_id("app")
    partitions = {t: n for t, (n, _) in topology.internal_topics({"orders": 4, "users": 2, "other": 4}).items()
                  if t.endswith("-repartition")}
    assert sorted(partitions.values()) == [2, 4]
    check_copartition_groups(topology, {"orders": 4, "users": 2})  # orders is not read by the join
