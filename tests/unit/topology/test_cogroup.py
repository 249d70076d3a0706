"""``KGroupedStream.cogroup``: several grouped streams into one aggregate, one store, checked
against the outputs of Kafka Streams' CogroupedKStreamImplTest for the same inputs.

One difference on purpose: an aggregate's record here has the timestamp of the record that
updated it (as every aggregation of this engine: its stores keep no timestamps), where Kafka
Streams gives the larger of that and the aggregate's; the tests compare keys and values."""

from __future__ import annotations

from typing import Any

import pytest

from streamloop.errors import TopologyError
from streamloop.serdes import IntegerSerde, LongSerde, StringSerde
from streamloop.state import Materialized, SessionWindows, SlidingWindows, TimeWindows, Windowed
from streamloop.testing import TopologyTestDriver
from streamloop.topology.builder import StreamsBuilder
from streamloop.topology.cogroup import CogroupedKStream
from streamloop.topology.copartition import check_copartition_groups

STR, LONG, INT = StringSerde(), LongSerde(), IntegerSerde()
CONFIG = {"cache.max.bytes.buffering": 0, "default.key.serde": STR, "default.value.serde": STR}


def concat(_key: str, value: str, aggregate: str) -> str:
    return aggregate + value


def pipe(builder: StreamsBuilder, inputs: list[tuple[str, str, Any, int]], output: str = "output",
         value_serde: Any = STR, input_serdes: dict[str, Any] | None = None) -> list[tuple[Any, Any]]:
    with TopologyTestDriver(builder.build(), CONFIG) as driver:
        serdes = input_serdes or {}
        topics = {t: driver.create_input_topic(t, STR, serdes.get(t, STR)) for t, _, _, _ in inputs}
        for topic, key, value, timestamp in inputs:
            topics[topic].pipe_input(key, value, timestamp)
        return driver.create_output_topic(output, STR, value_serde).read_key_values()


def two_grouped(builder: StreamsBuilder) -> tuple[Any, Any]:
    one = builder.stream("one", key_serde=STR, value_serde=STR).group_by_key()
    two = builder.stream("two", key_serde=STR, value_serde=STR).group_by_key()
    return one, two


def test_single_stream_cogroup_aggregates_like_aggregate() -> None:
    """Matches CogroupedKStreamImplTest.shouldCogroupAndAggregateSingleKStreams."""
    builder = StreamsBuilder()
    one = builder.stream("one", key_serde=STR, value_serde=STR).group_by_key()
    cogrouped = one.cogroup(concat)
    assert isinstance(cogrouped, CogroupedKStream)
    cogrouped.aggregate(lambda: "").to_stream().to("output")
    out = pipe(builder, [("one", "k1", "A", 0), ("one", "k2", "B", 0), ("one", "k2", "B", 0), ("one", "k1", "A", 0)])
    assert out == [("k1", "A"), ("k2", "B"), ("k2", "BB"), ("k1", "AA")]


def test_null_values_are_dropped() -> None:
    """Matches CogroupedKStreamImplTest.testCogroupHandleNullValues."""
    builder = StreamsBuilder()
    one = builder.stream("one", key_serde=STR, value_serde=STR).group_by_key()
    one.cogroup(concat).aggregate(lambda: "").to_stream().to("output")
    out = pipe(builder, [("one", "k1", "A", 0), ("one", "k2", "B", 0), ("one", "k2", None, 0),
                         ("one", "k2", "B", 0), ("one", "k1", "A", 0)])
    assert out == [("k1", "A"), ("k2", "B"), ("k2", "BB"), ("k1", "AA")]


def test_two_streams_with_shared_keys_update_one_aggregate() -> None:
    """Matches CogroupedKStreamImplTest.shouldCogroupAndAggregateTwoKStreamsWithSharedKeys."""
    builder = StreamsBuilder()
    one, two = two_grouped(builder)
    one.cogroup(concat).cogroup(two, concat).aggregate(lambda: "").to_stream().to("output")
    out = pipe(builder, [("one", "k1", "A", 0), ("one", "k2", "A", 1), ("one", "k1", "A", 10), ("one", "k2", "A", 100),
                         ("two", "k2", "B", 100), ("two", "k2", "B", 200), ("two", "k1", "B", 1),
                         ("two", "k2", "B", 500), ("two", "k1", "B", 500), ("two", "k2", "B", 500),
                         ("two", "k3", "B", 500), ("two", "k2", "B", 100)])
    assert out == [("k1", "A"), ("k2", "A"), ("k1", "AA"), ("k2", "AA"), ("k2", "AAB"), ("k2", "AABB"),
                   ("k1", "AAB"), ("k2", "AABBB"), ("k1", "AABB"), ("k2", "AABBBB"), ("k3", "B"), ("k2", "AABBBBB")]


def test_streams_of_different_value_types_with_their_own_aggregators() -> None:
    """Matches CogroupedKStreamImplTest.shouldCoGroupStreamsWithDifferentInputTypes: strings parsed
    on one side, integers on the other, into one integer sum kept with the Materialized's serde."""
    builder = StreamsBuilder()
    one = builder.stream("one", key_serde=STR, value_serde=STR).group_by_key()
    two = builder.stream("two", key_serde=STR, value_serde=INT).group_by_key()
    table = (one.cogroup(lambda _k, v, agg: agg + int(v))
             .cogroup(two, lambda _k, v, agg: agg + v)
             .aggregate(lambda: 0, materialized=Materialized("store1", value_serde=INT)))
    table.to_stream().to("output")
    inputs = [("one", "k1", "1", 0), ("one", "k2", "1", 1), ("one", "k1", "1", 10), ("one", "k2", "1", 100),
              ("two", "k2", 2, 100), ("two", "k2", 2, 200), ("two", "k1", 2, 1), ("two", "k2", 2, 500),
              ("two", "k1", 2, 500), ("two", "k2", 3, 500), ("two", "k3", 2, 500), ("two", "k2", 2, 100)]
    out = pipe(builder, inputs, value_serde=INT, input_serdes={"two": INT})
    assert out == [("k1", 1), ("k2", 1), ("k1", 2), ("k2", 2), ("k2", 4), ("k2", 6), ("k1", 4), ("k2", 8),
                   ("k1", 6), ("k2", 11), ("k3", 2), ("k2", 13)]


def test_mixed_aggregators() -> None:
    """Matches CogroupedKStreamImplTest.testCogroupKeyMixedAggregators (MockAggregator's
    TOSTRING_REMOVER on one side, TOSTRING_ADDER on the other, MockInitializer's "0")."""
    builder = StreamsBuilder()
    one, two = two_grouped(builder)
    (one.cogroup(lambda _k, v, agg: f"{agg}-{v}")
        .cogroup(two, lambda _k, v, agg: f"{agg}+{v}")
        .aggregate(lambda: "0", materialized="store1")).to_stream().to("output")
    out = pipe(builder, [("one", "k1", "1", 0), ("one", "k2", "1", 1), ("one", "k1", "1", 10), ("one", "k2", "1", 100),
                         ("two", "k1", "2", 500), ("two", "k2", "2", 500), ("two", "k1", "2", 500),
                         ("two", "k2", "2", 100)])
    assert out == [("k1", "0-1"), ("k2", "0-1"), ("k1", "0-1-1"), ("k2", "0-1-1"), ("k1", "0-1-1+2"),
                   ("k2", "0-1-1+2"), ("k1", "0-1-1+2+2"), ("k2", "0-1-1+2+2")]


def test_named_cogroup_describes_as_kafka_streams() -> None:
    """Matches CogroupedKStreamImplTest.shouldNameProcessorsAndStoreBasedOnNamedParameter: one
    store for all inputs, ``<name>-cogroup-agg-<i>`` per input and ``<name>-cogroup-merge``."""
    builder = StreamsBuilder()
    one, two = two_grouped(builder)
    one.cogroup(concat).cogroup(two, concat).aggregate(lambda: "", name="test", materialized="store") \
        .to_stream().to("output")
    assert builder.build().describe() == (
        "Topologies:\n"
        "   Sub-topology: 0\n"
        "    Source: KSTREAM-SOURCE-0000000000 (topics: [one])\n"
        "      --> test-cogroup-agg-0\n"
        "    Source: KSTREAM-SOURCE-0000000001 (topics: [two])\n"
        "      --> test-cogroup-agg-1\n"
        "    Processor: test-cogroup-agg-0 (stores: [store])\n"
        "      --> test-cogroup-merge\n"
        "      <-- KSTREAM-SOURCE-0000000000\n"
        "    Processor: test-cogroup-agg-1 (stores: [store])\n"
        "      --> test-cogroup-merge\n"
        "      <-- KSTREAM-SOURCE-0000000001\n"
        "    Processor: test-cogroup-merge (stores: [])\n"
        "      --> KTABLE-TOSTREAM-0000000002\n"
        "      <-- test-cogroup-agg-0, test-cogroup-agg-1\n"
        "    Processor: KTABLE-TOSTREAM-0000000002 (stores: [])\n"
        "      --> KSTREAM-SINK-0000000003\n"
        "      <-- test-cogroup-merge\n"
        "    Sink: KSTREAM-SINK-0000000003 (topic: output)\n"
        "      <-- KTABLE-TOSTREAM-0000000002\n\n")


def test_key_changed_input_is_repartitioned_and_one_changelog_is_made() -> None:
    """Matches CogroupedKStreamImplTest.shouldInsertRepartitionsTopicForUpstreamKeyModification: the
    input whose key changed goes through a repartition topic into the cogroup's sub-topology;
    the cogroup has one store, so one changelog (and node names COGROUPKSTREAM-…)."""
    builder = StreamsBuilder()
    one = builder.stream("one", key_serde=STR, value_serde=STR).map(lambda k, v: (v, k)).group_by_key()
    two = builder.stream("two", key_serde=STR, value_serde=STR).group_by_key()
    one.cogroup(concat).cogroup(two, concat).aggregate(lambda: "").to_stream().to("output")
    topology = builder.build()
    text = topology.describe()
    assert "(stores: [COGROUPKSTREAM-AGGREGATE-STATE-STORE-0000000006])" in text
    assert text.count("COGROUPKSTREAM-MERGE-0000000009") == 4
    subs = topology.subtopologies
    assert len(subs) == 2
    cogroup_sub = next(s for s in subs if "COGROUPKSTREAM-MERGE-0000000009" in s.node_names)
    assert sorted(cogroup_sub.source_topics) == ["KSTREAM-REPARTITION-0000000002-repartition", "two"]
    with TopologyTestDriver(topology, CONFIG):
        internal = topology.internal_topics({"one": 3, "two": 3})
    changelogs = [t for t in internal if t.endswith("-changelog")]
    assert changelogs == ["topology-test-driver-COGROUPKSTREAM-AGGREGATE-STATE-STORE-0000000006-changelog"]
    assert internal["topology-test-driver-KSTREAM-REPARTITION-0000000002-repartition"][0] == 3
    # Keyed by the values of "one": "k1" gets both the repartitioned and the direct records.
    out = pipe(builder, [("one", "A", "k1", 0), ("two", "k1", "B", 1), ("one", "C", "k2", 2)])
    assert out == [("k1", "A"), ("k1", "AB"), ("k2", "C")]


def test_inputs_must_be_copartitioned() -> None:
    """The cogroup's inputs are one co-partition group (Kafka Streams' copartitionSources)."""
    builder = StreamsBuilder()
    one, two = two_grouped(builder)
    one.cogroup(concat).cogroup(two, concat).aggregate(lambda: "")
    topology = builder.build()
    check_copartition_groups(topology, {"one": 2, "two": 2})
    with pytest.raises(TopologyError, match=r"cogroup\(\) needs co-partitioned inputs.*'one' \(2\), 'two' \(3\)"):
        check_copartition_groups(topology, {"one": 2, "two": 3})


def test_the_store_is_queryable_and_its_table_joinable() -> None:
    builder = StreamsBuilder()
    one, two = two_grouped(builder)
    table = one.cogroup(concat).cogroup(two, concat).aggregate(lambda: "", materialized="totals")
    assert table.queryable_store_name == "totals"
    builder.stream("lookups", key_serde=STR, value_serde=STR).join(table, lambda v, t: f"{v}={t}").to("output")
    with TopologyTestDriver(builder.build(), CONFIG) as driver:
        driver.create_input_topic("one", STR, STR).pipe_input("k", "A", 0)
        driver.create_input_topic("two", STR, STR).pipe_input("k", "B", 1)
        driver.create_input_topic("lookups", STR, STR).pipe_input("k", "q", 2)
        assert driver.get_key_value_store("totals").get("k") == "AB"
        assert driver.create_output_topic("output", STR, STR).read_key_values() == [("k", "q=AB")]


def test_a_filter_after_a_cogroup_gets_old_values_from_every_input() -> None:
    """A table operation that needs old values (filter) switches on every input's processor: a
    key that stops passing by a record of either input is deleted downstream."""
    builder = StreamsBuilder()
    one = builder.stream("one", key_serde=STR, value_serde=LONG).group_by_key()
    two = builder.stream("two", key_serde=STR, value_serde=LONG).group_by_key()
    summed = (one.cogroup(lambda _k, v, a: a + v).cogroup(two, lambda _k, v, a: a - v)
              .aggregate(lambda: 0, materialized=Materialized("sums", value_serde=LONG)))
    summed.filter(lambda _k, v: v > 0).to_stream().to("output", value_serde=LONG)
    out = pipe(builder, [("one", "k", 5, 0), ("two", "k", 7, 1), ("one", "k", 3, 2)], value_serde=LONG,
               input_serdes={"one": LONG, "two": LONG})
    assert out == [("k", 5), ("k", None), ("k", 1)]


def test_bad_cogroups_are_refused() -> None:
    builder = StreamsBuilder()
    one, two = two_grouped(builder)
    cogrouped = one.cogroup(concat)
    with pytest.raises(TopologyError, match="in this cogroup already"):
        cogrouped.cogroup(one, concat)
    with pytest.raises(TopologyError, match="needs a KGroupedStream"):
        cogrouped.cogroup("two", concat)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="needs a callable"):
        cogrouped.cogroup(two, None)  # type: ignore[arg-type]

    async def later(_k: Any, _v: Any, agg: Any) -> Any:
        return agg
    with pytest.raises(TopologyError, match="must be a plain function"):
        cogrouped.cogroup(two, later)
    with pytest.raises(TypeError, match="needs a callable"):
        cogrouped.aggregate(None)  # type: ignore[arg-type]
    other = StreamsBuilder().stream("x").group_by_key()
    with pytest.raises(TopologyError, match="same StreamsBuilder"):
        cogrouped.cogroup(other, concat)
    with pytest.raises(TopologyError, match="needs TimeWindows"):
        cogrouped.windowed_by(None)  # type: ignore[arg-type]


def test_time_windowed_cogroup_shares_one_stream_time() -> None:
    """A window closed by one input's records is closed for the others: the record of "two" at
    5 comes after "one" moved stream time to 20, past window [0, 10)'s end (no grace)."""
    builder = StreamsBuilder()
    one, two = two_grouped(builder)
    windows = TimeWindows.of_size_with_no_grace(10)
    (one.cogroup(concat).cogroup(two, concat).windowed_by(windows)
        .aggregate(lambda: "", materialized="windowed")).to_stream() \
        .map(lambda w, v: (f"{w.key}@{w.start}", v)).to("output")
    out = pipe(builder, [("one", "k", "A", 1), ("two", "k", "B", 3), ("one", "k", "C", 20), ("two", "k", "D", 5),
                         ("two", "k", "E", 25)])
    assert out == [("k@0", "A"), ("k@0", "AB"), ("k@20", "C"), ("k@20", "CE")]


def test_time_windowed_cogroup_keys_are_windowed() -> None:
    builder = StreamsBuilder()
    one, two = two_grouped(builder)
    table = one.cogroup(concat).cogroup(two, concat).windowed_by(TimeWindows.of_size_and_grace(10, 5)) \
        .aggregate(lambda: "", materialized="w")
    seen: list[Any] = []
    table.to_stream().foreach(lambda k, v: seen.append((k, v)))
    with TopologyTestDriver(builder.build(), CONFIG) as driver:
        driver.create_input_topic("one", STR, STR).pipe_input("k", "A", 12)
        driver.create_input_topic("two", STR, STR).pipe_input("k", "B", 14)
    assert seen == [(Windowed("k", 10, 20), "A"), (Windowed("k", 10, 20), "AB")]


# -- session and sliding windows --------------------------------------------------------

def plus(_key: str, value: str, aggregate: str) -> str:
    return f"{aggregate}+{value}"  # MockAggregator.TOSTRING_ADDER


def minus(_key: str, value: str, aggregate: str) -> str:
    return f"{aggregate}-{value}"  # MockAggregator.TOSTRING_REMOVER


def merge(_key: str, one: str, two: str) -> str:
    return f"{one}+{two}"


def last_per_window(builder: StreamsBuilder,
                    inputs: list[tuple[str, str, str, int]]) -> dict[tuple[str, int, int], Any]:
    table_updates: dict[tuple[str, int, int], Any] = {}
    with TopologyTestDriver(builder.build(), CONFIG) as driver:
        topics = {t: driver.create_input_topic(t, STR, STR) for t, _, _, _ in inputs}
        for topic, key, value, timestamp in inputs:
            topics[topic].pipe_input(key, value, timestamp)
        for record in driver.create_output_topic("output", STR, STR).read_records():
            key, start, end = record.key.split("@")
            table_updates[(key, int(start), int(end))] = record.value
    return table_updates


def session_cogroup(builder: StreamsBuilder) -> None:
    one, two = two_grouped(builder)
    (one.cogroup(plus).cogroup(two, minus)
        .windowed_by(SessionWindows.of_inactivity_gap_and_grace(100, 10_000))
        .aggregate(lambda: "0", merge, materialized="sessions")
        .to_stream().map(lambda w, v: (f"{w.key}@{w.start}@{w.end}", v)).to("output"))


def test_session_windowed_cogroup_of_one_input_merges_sessions() -> None:
    """Matches SessionWindowedCogroupedKStreamImplTest.sessionWindowAggregateTest2StreamsTest: a
    session's aggregate is the merger of the sessions a record joins, from the initializer."""
    builder = StreamsBuilder()
    session_cogroup(builder)
    out = last_per_window(builder, [("one", "k1", "A", 0), ("one", "k1", "A", 84), ("one", "k1", "A", 113),
                                    ("one", "k1", "A", 199), ("one", "k1", "B", 300), ("one", "k11", "B", 301),
                                    ("one", "k11", "B", 400), ("one", "k1", "B", 400)])
    assert out[("k1", 0, 199)] == "0+0+0+0+A+A+A+A"
    assert out[("k1", 300, 400)] == "0+0+B+B"
    assert out[("k11", 301, 400)] == "0+0+B+B"


def test_session_windowed_cogroup_mixes_the_inputs_aggregators() -> None:
    """Matches SessionWindowedCogroupedKStreamImplTest.sessionWindowMixAggregatorsTest and
    sessionWindowMixAggregatorsManyWindowsTest."""
    builder = StreamsBuilder()
    session_cogroup(builder)
    out = last_per_window(builder, [("one", "k1", "A", 0), ("one", "k11", "A", 0), ("one", "k11", "A", 1),
                                    ("one", "k1", "A", 2), ("two", "k1", "B", 3), ("two", "k11", "B", 3),
                                    ("two", "k11", "B", 444), ("two", "k1", "B", 444)])
    assert out[("k1", 0, 3)] == "0+0+0+A+A-B"
    assert out[("k11", 444, 444)] == "0-B"
    builder = StreamsBuilder()
    session_cogroup(builder)
    out = last_per_window(builder, [("one", "k1", "A", 0), ("one", "k11", "A", 0), ("one", "k11", "A", 1),
                                    ("one", "k1", "A", 2), ("two", "k1", "B", 3), ("two", "k11", "B", 500),
                                    ("two", "k11", "B", 501), ("two", "k1", "B", 501)])
    assert out[("k1", 0, 3)] == "0+0+0+A+A-B"
    assert out[("k11", 500, 501)] == "0+0-B-B"
    assert out[("k1", 501, 501)] == "0-B"


@pytest.mark.parametrize("windows", [TimeWindows.of_size_and_grace(10, 5), TimeWindows.of_size_with_no_grace(10)
                                     .advance_by(5), SlidingWindows.of_time_difference_and_grace(10, 5),
                                     SessionWindows.of_inactivity_gap_and_grace(10, 5)],
                         ids=["tumbling", "hopping", "sliding", "session"])
def test_a_windowed_cogroup_of_one_input_is_that_input_windowed(windows: Any) -> None:
    """With one input a windowed cogroup is the input's own windowed aggregate: same windows,
    same late records dropped, same updates."""
    inputs = [("one", k, v, ts) for k, v, ts in [("a", "1", 3), ("a", "2", 12), ("b", "3", 7), ("a", "4", 30),
                                                 ("a", "5", 9), ("a", "6", 26), ("b", "7", 1), ("a", "8", 31)]]
    results = []
    for cogrouped in (True, False):
        builder = StreamsBuilder()
        grouped = builder.stream("one", key_serde=STR, value_serde=STR).group_by_key()
        if cogrouped:
            windowed: Any = grouped.cogroup(concat).windowed_by(windows)
        else:
            windowed = grouped.windowed_by(windows)
        if isinstance(windows, SessionWindows):
            table = windowed.aggregate(lambda: "", *(() if cogrouped else (concat,)), lambda _k, a, b: a + b,
                                       materialized="w")
        else:
            table = windowed.aggregate(lambda: "", *(() if cogrouped else (concat,)), materialized="w")
        table.to_stream().map(lambda w, v: (f"{w.key}@{w.start}@{w.end}", v)).to("output")
        with TopologyTestDriver(builder.build(), CONFIG) as driver:
            topic = driver.create_input_topic("one", STR, STR)
            for _, key, value, timestamp in inputs:
                topic.pipe_input(key, value, timestamp)
            results.append(driver.create_output_topic("output", STR, STR).read_key_values())
    assert results[0] == results[1]
    assert results[0]  # something was aggregated


@pytest.mark.parametrize("windows", [SessionWindows.of_inactivity_gap_with_no_grace(10),
                                     SlidingWindows.of_time_difference_with_no_grace(10)], ids=["session", "sliding"])
def test_session_and_sliding_cogroups_share_one_stream_time(windows: Any) -> None:
    """As with time windows: "one" moves stream time to 100, so "two"'s record at 5 is late."""
    builder = StreamsBuilder()
    one, two = two_grouped(builder)
    windowed: Any = one.cogroup(concat).cogroup(two, concat).windowed_by(windows)
    extra = (lambda _k, a, b: a + b,) if isinstance(windows, SessionWindows) else ()
    windowed.aggregate(lambda: "", *extra, materialized="w").to_stream() \
        .map(lambda w, v: (f"{w.key}@{w.start}", v)).to("output")
    out = pipe(builder, [("one", "k", "A", 100), ("two", "k", "B", 5), ("two", "k", "C", 101)])
    assert ("k@0", "B") not in out and all("B" not in v for _, v in out if v is not None)
    assert out[-1][1] == "AC"
