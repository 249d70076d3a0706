"""``KStream.repartition(Repartitioned...)``: names, partition counts, co-partitioning, and records
through the test driver. The cases follow Kafka Streams' ``KStreamRepartitionIntegrationTest``
and ``KStreamImplTest`` (named in each test)."""

from __future__ import annotations

from typing import Any

import pytest

from streamloop import JoinWindows, Repartitioned, StreamsBuilder
from streamloop.errors import TopologyError
from streamloop.processors.api import BaseProcessor
from streamloop.records import Record
from streamloop.serdes import IntegerSerde, StringSerde
from streamloop.testing import TopologyTestDriver

STR, INT = StringSerde(), IntegerSerde()


def internal_partitions(builder: StreamsBuilder, sources: dict[str, int]) -> dict[str, int]:
    topology = builder.build()
    topology.set_application_id("app")
    return {t: n for t, (n, _) in topology.internal_topics(sources).items()}


def test_a_named_repartition_writes_app_name_repartition_with_the_given_partitions() -> None:
    """``KStreamRepartitionIntegrationTest.shouldCreateRepartitionTopicWithSpecifiedNumberOfPartitions``
    and ``shouldUseStreamPartitionerForRepartitionOperation``'s naming: ``<app>-<name>-repartition``,
    nodes ``<name>-repartition-sink`` / ``-source``."""
    builder = StreamsBuilder()
    builder.stream("in").repartition(Repartitioned.as_("by-user").with_number_of_partitions(3)).to("out")

    assert internal_partitions(builder, {"in": 1}) == {"app-by-user-repartition": 3}
    text = builder.build().describe()
    assert "Sink: by-user-repartition-sink (topic: app-by-user-repartition)" in text
    assert "Source: by-user-repartition-source (topics: [app-by-user-repartition])" in text


def test_without_a_count_the_topic_takes_the_partitions_of_the_sub_topology_that_writes_it() -> None:
    """``KStreamRepartitionIntegrationTest.shouldInheritRepartitionTopicPartitionNumberFromUpstreamTopic
    WhenNumberOfPartitionsIsNotSpecified``; generated names burn a sink, a filter and a source index."""
    builder = StreamsBuilder()
    builder.stream("in").repartition().to("out")

    assert internal_partitions(builder, {"in": 4}) == {"app-KSTREAM-REPARTITION-0000000001-repartition": 4}
    text = builder.build().describe()
    assert "Sink: KSTREAM-SINK-0000000002 (topic: app-KSTREAM-REPARTITION-0000000001-repartition)" in text
    assert "Source: KSTREAM-SOURCE-0000000004 (topics: [app-KSTREAM-REPARTITION-0000000001-repartition])" in text
    assert "Sink: KSTREAM-SINK-0000000005 (topic: out)" in text


def test_grouping_after_a_repartition_needs_no_second_repartition_topic() -> None:
    """``KStreamRepartitionIntegrationTest.shouldCreateOnlyOneRepartitionTopicWhenRepartitionIsFollowedByGroupByKey``."""
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=STR)
            .select_key(lambda _k, v: v)
            .repartition(Repartitioned.as_("by-value").with_number_of_partitions(2))
            .group_by_key()
            .count())

    topics = internal_partitions(builder, {"in": 1})
    assert {t: n for t, n in topics.items() if t.endswith("-repartition")} == {"app-by-value-repartition": 2}
    assert [n for t, n in topics.items() if t.endswith("-changelog")] == [2]  # the count's tasks: 2


def test_a_fixed_count_that_differs_from_a_joined_topic_is_refused() -> None:
    """``KStreamRepartitionIntegrationTest.shouldThrowAnExceptionWhenNumberOfPartitionsOfRepartition
    OperationDoNotMatchSourceTopicWhenJoining``; with the same count the join is accepted."""
    for count, ok in ((2, False), (4, True)):
        builder = StreamsBuilder()
        left = builder.stream("left", key_serde=STR, value_serde=STR).repartition(
            Repartitioned.as_("left").with_number_of_partitions(count))
        right = builder.stream("right", key_serde=STR, value_serde=STR)
        left.join(right, lambda a, b: a + b, JoinWindows.of_time_difference_with_no_grace(100)).to("out")
        if ok:
            assert internal_partitions(builder, {"left": 4, "right": 4})["app-left-repartition"] == 4
        else:
            with pytest.raises(TopologyError, match=r"'app-left-repartition' \(2\), 'right' \(4\)"):
                internal_partitions(builder, {"left": 4, "right": 4})


def test_repartitioned_is_immutable_and_checks_its_arguments() -> None:
    base = Repartitioned.with_(STR, INT)
    named = base.with_name("x").with_number_of_partitions(5)
    assert (base.name, base.partitions, named.name, named.partitions) == (None, None, "x", 5)
    assert named.key_serde is base.key_serde
    with pytest.raises(TopologyError, match="at least 1"):
        Repartitioned.number_of_partitions(0)
    with pytest.raises(TopologyError, match="takes a Repartitioned"):
        StreamsBuilder().stream("in").repartition("x")  # type: ignore[arg-type]


class Where(BaseProcessor):
    def __init__(self, seen: list[tuple[Any, int | None]]) -> None:
        self.seen = seen

    def process(self, record: Record) -> None:
        self.seen.append((record.key, self.context.partition))


def test_records_go_through_the_topic_to_the_partitions_the_stream_partitioner_picks() -> None:
    """``KStreamRepartitionIntegrationTest.shouldUseStreamPartitionerForRepartitionOperation``;
    a None key goes through too (Kafka Streams' repartition filter lets every record pass)."""
    seen: list[tuple[Any, int | None]] = []
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=INT, value_serde=STR)
            .repartition(Repartitioned.as_("spread").with_number_of_partitions(3)
                         .with_stream_partitioner(lambda _topic, key, _value, n: 0 if key is None else key % n))
            .process(lambda: Where(seen)))

    with TopologyTestDriver(builder.build()) as driver:
        source = driver.create_input_topic("in", INT, STR)
        for key in (4, 5, 6, None):
            source.pipe_input(key, "v")
    assert sorted(seen, key=str) == sorted([(4, 1), (5, 2), (6, 0), (None, 0)], key=str)
