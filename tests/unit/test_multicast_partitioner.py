"""Multicast stream partitioners (KIP-837): ``StreamPartitioner.partitions`` in the record collector,
``Produced`` on ``to()`` and ``Repartitioned`` on ``repartition()``, on the test driver."""

from __future__ import annotations

from collections.abc import Set
from typing import Any

import pytest

from streamloop import (
    BroadcastPartitioner,
    Produced,
    Repartitioned,
    StreamPartitioner,
    StreamsBuilder,
    TopologyError,
)
from streamloop.errors import ProduceError
from streamloop.processors.nodes import SinkNode
from streamloop.records import Record
from streamloop.serdes import StringSerde
from streamloop.testing import TopologyTestDriver
from tests.unit.test_collector import JSON, STR, expected_partition, make_collector

S = StringSerde()


class Even(StreamPartitioner):
    def partitions(self, topic: str, key: Any, value: Any, num_partitions: int) -> Set[int] | None:
        return {p for p in range(num_partitions) if p % 2 == 0}


class Answers(StreamPartitioner):
    def __init__(self, answer: object) -> None:
        self.answer = answer

    def partitions(self, topic: str, key: Any, value: Any, num_partitions: int) -> Any:
        return self.answer


def sink(partitioner: object) -> SinkNode:
    return SinkNode("KSTREAM-SINK-0000000002", "out", STR, JSON, partitioner)  # type: ignore[arg-type]  # the test passes wrong ones too


def test_a_record_goes_to_each_partition_chosen_in_ascending_order() -> None:
    """Matches RecordCollectorTest.shouldSendOnlyToEvenPartitions."""
    collector, producer = make_collector({"out": 3})
    for i in range(3):
        collector.send("out", Record(f"k{i}", i, i), sink(Even()))
    assert [(a.partition, a.value) for a in producer.appended] == [
        (0, b"0"), (2, b"0"), (0, b"1"), (2, b"1"), (0, b"2"), (2, b"2")]
    assert collector.sent == 6


def test_broadcast_writes_every_partition() -> None:
    """Matches RecordCollectorTest.shouldBroadcastToAllPartitions."""
    collector, producer = make_collector({"out": 3})
    for i in range(3):
        collector.send("out", Record(f"k{i}", i, i), sink(BroadcastPartitioner()))
    assert [a.partition for a in producer.appended] == [0, 1, 2] * 3


def test_an_empty_set_drops_the_record_and_counts_it() -> None:
    """Matches RecordCollectorTest.shouldDropAllRecords."""
    collector, producer = make_collector({"out": 3})
    for i in range(3):
        collector.send("out", Record(f"k{i}", i, i), sink(Answers(set())))
    assert producer.appended == []
    assert (collector.sent, collector.dropped) == (0, 3)
    # A task's own collector under exactly-once counts into the thread's one.
    sibling = collector.sibling(producer)  # type: ignore[arg-type]  # the recording stand-in
    sibling.send("out", Record("k", 1, 0), sink(Answers(set())))
    assert (collector.dropped, sibling.dropped) == (4, 4)


def test_the_threads_dropped_records_count_the_partitioners_drops() -> None:
    from streamloop.config import StreamsConfig
    from streamloop.tasks import wiring

    collector, _producer = make_collector({"out": 3})
    errors = wiring.error_handling(StreamsConfig({"application.id": "a", "bootstrap.servers": "memory://x"}),
                                   collector)
    collector.send("out", Record("k", 1, 0), sink(Answers(set())))
    assert errors.records_dropped == 1


def test_none_from_partitions_is_the_default_partitioning() -> None:
    """Matches RecordCollectorTest.shouldUseDefaultPartitionerAsPartitionReturnsEmptyOptional."""
    collector, producer = make_collector({"out": 6})
    collector.send("out", Record("k", 1, 0), sink(Answers(None)))
    assert [a.partition for a in producer.appended] == [expected_partition(b"k", 6)]


def test_the_older_partition_method_is_used_by_the_default_partitions() -> None:
    """Matches RecordCollectorTest.shouldUseDefaultPartitionerViaPartitions (the other way round:
    a partitioner that only overrides ``partition`` still works through ``partitions``)."""

    class Fourth(StreamPartitioner):
        def partition(self, topic: str, key: Any, value: Any, num_partitions: int) -> int | None:
            return 3

    collector, producer = make_collector({"out": 4})
    collector.send("out", Record("k", 1, 0), sink(Fourth()))
    assert [a.partition for a in producer.appended] == [3]


@pytest.mark.parametrize("answer", [{0, 4}, {-1}, {True}, 2, "0", [0.5]])
def test_a_wrong_answer_raises_produce_error_naming_the_sink_and_sends_nothing(answer: object) -> None:
    collector, producer = make_collector({"out": 4})
    with pytest.raises(ProduceError, match="partitioner of 'KSTREAM-SINK-0000000002'"):
        collector.send("out", Record("k", 1, 0), sink(Answers(answer)))
    assert producer.appended == []


def test_a_partitioner_that_is_neither_callable_nor_a_stream_partitioner_is_refused_when_added() -> None:
    builder = StreamsBuilder()
    with pytest.raises(TopologyError, match="stream partitioner of 'out-sink' must be a StreamPartitioner"):
        builder.stream("in").to("out", partitioner=3, name="out-sink")  # type: ignore[arg-type]  # the mistake under test
    with pytest.raises(TopologyError, match="must be a StreamPartitioner"):
        Produced.stream_partitioner("every")  # type: ignore[arg-type]  # the mistake under test


def test_produced_and_keywords_together_are_refused() -> None:
    builder = StreamsBuilder()
    with pytest.raises(TopologyError, match="got a Produced and key_serde="):
        builder.stream("in").to("out", Produced.with_(S, S), key_serde=S)


def test_to_with_produced_multicasts_on_the_driver() -> None:
    builder = StreamsBuilder()
    builder.stream("in", key_serde=S, value_serde=S).to(
        "out", Produced.with_(S, S).with_stream_partitioner(Even()).with_name("fan-out"))
    topology = builder.build()
    assert "Sink: fan-out (topic: out)" in topology.describe()
    with TopologyTestDriver(topology, partitions={"out": 4}) as driver:
        driver.create_input_topic("in", S, S).pipe_input("a", "x")
        records = driver.create_output_topic("out", S, S).read_records()
    assert [(r.partition, r.key, r.value) for r in records] == [(0, "a", "x"), (2, "a", "x")]


def test_repartition_with_a_broadcasting_partitioner_gives_every_task_a_copy() -> None:
    """Matches KStreamRepartitionIntegrationTest.shouldRepartitionToMultiplePartitions (on the driver)."""
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=S, value_serde=S)
            .repartition(Repartitioned.as_("everywhere").with_stream_partitioner(BroadcastPartitioner())
                         .with_number_of_partitions(4))
            .to("out"))
    with TopologyTestDriver(builder.build(), partitions={"out": 4}) as driver:
        inputs = driver.create_input_topic("in", S, S)
        inputs.pipe_input("1", "A")
        inputs.pipe_input("2", "B")
        records = driver.create_output_topic("out", S, S).read_records()
    # Each of the 4 repartition tasks forwards its copy to the key's partition of "out".
    assert sorted((r.key, r.value) for r in records) == [("1", "A")] * 4 + [("2", "B")] * 4
    for key in ("1", "2"):
        assert {r.partition for r in records if r.key == key} == {expected_partition(key.encode(), 4)}
