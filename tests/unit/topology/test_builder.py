"""``StreamsBuilder`` and ``Topology``: node names, ``describe()``, sub-topologies, malformed topologies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from streamloop.errors import TopologyError
from streamloop.processors.api import BaseProcessor
from streamloop.processors.nodes import Node
from streamloop.records import Record
from streamloop.serdes import StringSerde
from streamloop.topology.builder import KStream, StreamsBuilder
from streamloop.topology.copartition import check_copartitioning
from streamloop.topology.topology import Topology


def keep_all(_key: Any, _value: Any) -> bool:
    return True


def identity_pair(key: Any, value: Any) -> tuple[Any, Any]:
    return key, value


class PassThrough(BaseProcessor):
    def process(self, record: Record) -> None:
        self.context.forward(record)


def node_factory(name: str) -> Callable[[], Node]:
    def factory() -> Node:  # pragma: no cover - these topologies are never run
        raise AssertionError(f"{name} should not be built")

    return factory


# -- node names ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("operation", "prefix"),
    [
        (lambda s: s.filter(keep_all), "KSTREAM-FILTER"),
        (lambda s: s.filter_not(keep_all), "KSTREAM-FILTER"),
        (lambda s: s.map(identity_pair), "KSTREAM-MAP"),
        (lambda s: s.select_key(lambda k, v: k), "KSTREAM-KEY-SELECT"),
        (lambda s: s.map_values(lambda v: v), "KSTREAM-MAPVALUES"),
        (lambda s: s.flat_map(lambda k, v: [(k, v)]), "KSTREAM-FLATMAP"),
        (lambda s: s.flat_map_values(lambda v: [v]), "KSTREAM-FLATMAPVALUES"),
        (lambda s: s.peek(keep_all), "KSTREAM-PEEK"),
        (lambda s: s.foreach(keep_all), "KSTREAM-FOREACH"),
        (lambda s: s.process(PassThrough), "KSTREAM-PROCESSOR"),
        (lambda s: s.to("out"), "KSTREAM-SINK"),
    ],
)
def test_dsl_operation_is_named_with_its_kafka_prefix_and_the_next_index(
    operation: Callable[[KStream], Any], prefix: str
) -> None:
    builder = StreamsBuilder()
    operation(builder.stream("in"))

    assert list(builder.build().node_names()) == ["KSTREAM-SOURCE-0000000000", f"{prefix}-0000000001"]


def test_indexes_count_up_across_the_whole_builder() -> None:
    builder = StreamsBuilder()
    builder.stream("a").filter(keep_all).to("x")
    builder.stream("b").map_values(str).to("y")

    assert list(builder.build().node_names()) == [
        "KSTREAM-SOURCE-0000000000",
        "KSTREAM-FILTER-0000000001",
        "KSTREAM-SINK-0000000002",
        "KSTREAM-SOURCE-0000000003",
        "KSTREAM-MAPVALUES-0000000004",
        "KSTREAM-SINK-0000000005",
    ]


def test_given_name_replaces_the_generated_one() -> None:
    builder = StreamsBuilder()
    builder.stream("in", name="orders").filter(keep_all, name="valid-orders").to("out", name="to-out")

    assert list(builder.build().node_names()) == ["orders", "valid-orders", "to-out"]


def test_named_node_still_uses_up_an_index() -> None:
    # Kafka Streams burns the index too, so naming one node does not rename the others.
    builder = StreamsBuilder()
    builder.stream("in").filter(keep_all, name="valid").to("out")

    assert list(builder.build().node_names())[-1] == "KSTREAM-SINK-0000000002"


def test_merge_node_is_named_merge_and_has_both_parents() -> None:
    builder = StreamsBuilder()
    builder.stream("a").merge(builder.stream("b")).to("out")
    topology = builder.build()

    assert topology.spec("KSTREAM-MERGE-0000000002").parents == (
        "KSTREAM-SOURCE-0000000000",
        "KSTREAM-SOURCE-0000000001",
    )


def test_branch_adds_a_branch_node_and_one_child_per_predicate() -> None:
    builder = StreamsBuilder()
    builder.stream("in").branch(keep_all, keep_all)

    assert list(builder.build().node_names()) == [
        "KSTREAM-SOURCE-0000000000",
        "KSTREAM-BRANCH-0000000001",
        "KSTREAM-BRANCHCHILD-0000000002",
        "KSTREAM-BRANCHCHILD-0000000003",
    ]


def test_split_names_its_branches_by_position_and_the_default_branch_zero() -> None:
    builder = StreamsBuilder()

    branches = builder.stream("in").split().branch(keep_all).branch(keep_all).default_branch()

    assert list(branches) == ["1", "2", "0"]


def test_split_prefixes_branch_names_with_its_name() -> None:
    builder = StreamsBuilder()

    branches = builder.stream("in").split(name="route-").branch(keep_all, name="big").default_branch(name="rest")

    assert list(branches) == ["route-big", "route-rest"]


# -- describe() --------------------------------------------------------------------


def test_describe_prints_kafka_streams_topology_description() -> None:
    builder = StreamsBuilder()
    builder.stream("in").filter(keep_all).to("out")

    assert builder.build().describe() == (
        "Topologies:\n"
        "   Sub-topology: 0\n"
        "    Source: KSTREAM-SOURCE-0000000000 (topics: [in])\n"
        "      --> KSTREAM-FILTER-0000000001\n"
        "    Processor: KSTREAM-FILTER-0000000001 (stores: [])\n"
        "      --> KSTREAM-SINK-0000000002\n"
        "      <-- KSTREAM-SOURCE-0000000000\n"
        "    Sink: KSTREAM-SINK-0000000002 (topic: out)\n"
        "      <-- KSTREAM-FILTER-0000000001\n"
        "\n"
    )


def test_describe_lists_every_child_and_none_for_a_leaf_processor() -> None:
    builder = StreamsBuilder()
    stream = builder.stream(["a", "b"])
    stream.to("x")
    stream.foreach(keep_all)

    text = builder.build().describe()

    assert "    Source: KSTREAM-SOURCE-0000000000 (topics: [a, b])\n" \
           "      --> KSTREAM-FOREACH-0000000002, KSTREAM-SINK-0000000001\n" in text
    assert "    Processor: KSTREAM-FOREACH-0000000002 (stores: [])\n      --> none\n" in text


def test_describe_shows_a_topic_extractor_sink_without_a_topic() -> None:
    builder = StreamsBuilder()
    builder.stream("in").to(lambda key, value, record: f"out-{key}")

    assert ("    Sink: KSTREAM-SINK-0000000001 (extractor class: tests.unit.topology.test_builder."
            "test_describe_shows_a_topic_extractor_sink_without_a_topic.<locals>.<lambda>)\n"
            "      <-- KSTREAM-SOURCE-0000000000\n\n") in builder.build().describe()


def test_describe_lists_nodes_largest_subtree_first_then_by_name() -> None:
    builder = StreamsBuilder()
    stream = builder.stream("in")
    stream.to("short")  # sink 1: a sub-tree of one
    stream.filter(keep_all).map_values(str).to("long")  # filter 2 (size 3), map 3 (size 2), sink 4

    assert builder.build().describe() == (
        "Topologies:\n"
        "   Sub-topology: 0\n"
        "    Source: KSTREAM-SOURCE-0000000000 (topics: [in])\n"
        "      --> KSTREAM-FILTER-0000000002, KSTREAM-SINK-0000000001\n"
        "    Processor: KSTREAM-FILTER-0000000002 (stores: [])\n"
        "      --> KSTREAM-MAPVALUES-0000000003\n"
        "      <-- KSTREAM-SOURCE-0000000000\n"
        "    Processor: KSTREAM-MAPVALUES-0000000003 (stores: [])\n"
        "      --> KSTREAM-SINK-0000000004\n"
        "      <-- KSTREAM-FILTER-0000000002\n"
        "    Sink: KSTREAM-SINK-0000000001 (topic: short)\n"
        "      <-- KSTREAM-SOURCE-0000000000\n"
        "    Sink: KSTREAM-SINK-0000000004 (topic: long)\n"
        "      <-- KSTREAM-MAPVALUES-0000000003\n"
        "\n"
    )


def test_str_of_a_topology_is_its_description() -> None:
    builder = StreamsBuilder()
    builder.stream("in").to("out")
    topology = builder.build()

    assert str(topology) == topology.describe()


# -- sub-topologies ------------------------------------------------------------------


def test_independent_streams_form_separate_subtopologies_in_source_order() -> None:
    builder = StreamsBuilder()
    builder.stream("a").filter(keep_all).to("x")
    builder.stream("b").to("y")

    subs = builder.build().subtopologies

    assert [(s.id, s.source_topics, s.sink_topics) for s in subs] == [(0, ("a",), ("x",)), (1, ("b",), ("y",))]
    assert subs[0].node_names == ("KSTREAM-SOURCE-0000000000", "KSTREAM-FILTER-0000000001", "KSTREAM-SINK-0000000002")


def test_merge_joins_two_streams_into_one_subtopology() -> None:
    builder = StreamsBuilder()
    builder.stream("a").merge(builder.stream("b")).to("out")

    subs = builder.build().subtopologies

    assert len(subs) == 1
    assert subs[0].source_topics == ("a", "b")


def test_merge_of_later_streams_keeps_an_earlier_independent_subtopology_first() -> None:
    builder = StreamsBuilder()
    builder.stream("solo").to("x")
    builder.stream("a").merge(builder.stream("b")).to("y")

    assert [s.source_topics for s in builder.build().subtopologies] == [("solo",), ("a", "b")]


def test_describe_prints_one_section_per_subtopology() -> None:
    builder = StreamsBuilder()
    builder.stream("a").to("x")
    builder.stream("b").to("y")

    text = builder.build().describe()

    assert "   Sub-topology: 0\n    Source: KSTREAM-SOURCE-0000000000 (topics: [a])" in text
    assert "   Sub-topology: 1\n    Source: KSTREAM-SOURCE-0000000002 (topics: [b])" in text


def test_source_and_sink_topics_of_the_topology() -> None:
    builder = StreamsBuilder()
    builder.stream(["b", "a"]).to("z")
    builder.stream("c").to("y")
    builder.stream("d").to(lambda k, v, r: "dynamic")

    topology = builder.build()

    assert topology.source_topics == ["b", "a", "c", "d"]
    assert topology.sink_topics == ["y", "z"]


def test_subtopology_of_finds_the_subtopology_reading_a_topic() -> None:
    builder = StreamsBuilder()
    builder.stream("a").to("x")
    builder.stream("b").to("y")

    assert builder.build().subtopology_of("b").id == 1


def test_subtopology_of_an_unknown_topic_raises_topology_error() -> None:
    builder = StreamsBuilder()
    builder.stream("a").to("x")

    with pytest.raises(TopologyError, match="'nope' is not a source"):
        builder.build().subtopology_of("nope")


def test_copartitioned_sources_give_one_task_per_partition() -> None:
    builder = StreamsBuilder()
    builder.stream("a").merge(builder.stream("b")).to("x")
    builder.stream("c").to("y")

    assert check_copartitioning(builder.build(), {"a": 4, "b": 4, "c": 2}) == {0: 4, 1: 2}


def test_copartitioned_sources_with_different_partition_counts_raise_topology_error() -> None:
    builder = StreamsBuilder()
    builder.stream("a").merge(builder.stream("b")).to("x")

    with pytest.raises(TopologyError, match="same number of partitions"):
        check_copartitioning(builder.build(), {"a": 4, "b": 3})


# -- malformed topologies --------------------------------------------------------------


def test_empty_topology_raises_topology_error() -> None:
    with pytest.raises(TopologyError, match="empty"):
        StreamsBuilder().build()


def test_duplicate_node_name_raises_topology_error_naming_it() -> None:
    stream = StreamsBuilder().stream("in")
    stream.filter(keep_all, name="valid")

    with pytest.raises(TopologyError, match="'valid' is already added"):
        stream.map_values(str, name="valid")


def test_unknown_parent_raises_topology_error_naming_it() -> None:
    topology = Topology().add_source("source", "in")

    with pytest.raises(TopologyError, match="Parent 'missing' of 'p' is not in the topology"):
        topology.add_processor("p", PassThrough, "missing")


def test_topic_read_by_two_sources_raises_topology_error_naming_it() -> None:
    builder = StreamsBuilder()
    builder.stream("a")

    with pytest.raises(TopologyError, match=r"\['a'\] are already read by source 'KSTREAM-SOURCE-0000000000'"):
        builder.stream(["b", "a"])


def test_branch_without_predicates_raises_topology_error() -> None:
    with pytest.raises(TopologyError, match="at least one predicate"):
        StreamsBuilder().stream("in").branch()


def test_split_without_branches_raises_topology_error() -> None:
    with pytest.raises(TopologyError, match="at least one branch"):
        StreamsBuilder().stream("in").split().no_default_branch()


def test_split_takes_no_branch_after_it_is_closed() -> None:
    split = StreamsBuilder().stream("in").split().branch(keep_all)
    split.default_branch()

    with pytest.raises(TopologyError, match="already closed"):
        split.branch(keep_all)


def test_sink_cannot_be_a_parent() -> None:
    topology = Topology().add_source("source", "in").add_sink("sink", "out", "source")

    with pytest.raises(TopologyError, match="Sink 'sink' cannot be the parent of 'p'"):
        topology.add_processor("p", PassThrough, "sink")


def test_source_without_topics_raises_topology_error() -> None:
    with pytest.raises(TopologyError, match="'source' needs at least one topic"):
        Topology().add_source("source", [])


def test_processor_without_parent_raises_topology_error() -> None:
    with pytest.raises(TopologyError, match="'p' needs at least one parent"):
        Topology().add_processor("p", PassThrough)


def test_processor_with_a_non_callable_supplier_raises_topology_error() -> None:
    topology = Topology().add_source("source", "in")

    with pytest.raises(TopologyError, match="'p' needs a supplier"):
        topology.add_processor("p", PassThrough(), "source")  # type: ignore[arg-type]


def test_sink_without_parent_raises_topology_error() -> None:
    with pytest.raises(TopologyError, match="'sink' needs at least one parent"):
        Topology().add_sink("sink", "out")


def test_sink_with_an_empty_topic_raises_topology_error() -> None:
    topology = Topology().add_source("source", "in")

    with pytest.raises(TopologyError, match="'sink' needs a topic name"):
        topology.add_sink("sink", "", "source")


def test_node_not_connected_to_a_source_raises_topology_error() -> None:
    topology = Topology().add_source("source", "in").add_node("orphan", node_factory("orphan"))

    with pytest.raises(TopologyError, match=r"\['orphan'\] are not connected to any source"):
        topology.validate()


def test_source_with_a_non_serde_raises_type_error_naming_the_node() -> None:
    with pytest.raises(TypeError, match="value serde of 'KSTREAM-SOURCE-0000000000'"):
        StreamsBuilder().stream("in", value_serde=42)  # type: ignore[arg-type]


def test_source_accepts_a_serde_class() -> None:
    builder = StreamsBuilder()
    builder.stream("in", key_serde=StringSerde).to("out")

    assert isinstance(builder.build().spec("KSTREAM-SOURCE-0000000000").key_serde, StringSerde)


def test_non_callable_function_is_rejected_before_the_topology_runs() -> None:
    builder = StreamsBuilder()

    with pytest.raises(TypeError, match="needs a callable"):
        builder.stream("in").filter(42).to("out")  # type: ignore[arg-type]
        builder.build()


@pytest.mark.parametrize(("concurrency", "ordering"), [(0, None), (2.5, None), (True, None), (4, "random")])
def test_a_bad_per_processor_concurrency_is_a_topology_error_naming_the_processor(concurrency, ordering) -> None:
    from streamloop.errors import TopologyError

    builder = StreamsBuilder()
    with pytest.raises(TopologyError, match="step"):
        builder.stream("in").map_values(lambda v: v, name="step", concurrency=concurrency, ordering=ordering)


def test_the_strictest_ordering_and_largest_concurrency_of_a_subtopology_apply() -> None:
    builder = StreamsBuilder()
    (builder.stream("in")
            .map_values(lambda v: v, concurrency=8, ordering="unordered")
            .filter(lambda k, v: True, concurrency=32, ordering="key")
            .to("out"))
    assert builder.build().concurrency_of(0) == (32, "key")


def test_blocking_is_for_plain_functions() -> None:
    async def already_async(value: object) -> object:
        return value

    with pytest.raises(TypeError, match="blocking=True is for plain functions"):
        StreamsBuilder().stream("in").map_values(already_async, blocking=True)
