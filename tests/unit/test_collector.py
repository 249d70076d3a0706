"""``RecordCollector``: how a task's output is serialised, partitioned and handed to the producer.

A ``RecordingProducer`` stands in for the thread's producer and keeps every
``append`` in order; the lookup of unknown sink topics is a coroutine function
that counts its calls.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka.partitioner import murmur2

from streamloop.collector import RecordCollector
from streamloop.errors import MissingSinkTopicError, ProduceError, SerializationError
from streamloop.processors.nodes import SinkNode
from streamloop.records import Headers, Record
from streamloop.serdes import BytesSerde, IntegerSerde, JsonSerde, StringSerde

STR, INT, JSON, BYTES = StringSerde(), IntegerSerde(), JsonSerde(), BytesSerde()
SINK = "KSTREAM-SINK-0000000002"


@dataclass(frozen=True)
class Appended:
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    timestamp: int | None
    headers: Headers


@dataclass
class RecordingProducer:
    """Implements the ``Producer`` calls the collector makes, keeping each ``append``."""

    appended: list[Appended] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)

    def append(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
               timestamp_ms: int | None, headers: Headers) -> None:
        self.appended.append(Appended(topic, partition, key, value, timestamp_ms, headers))

    def buffered(self) -> int:
        return len(self.appended)

    async def send_buffered(self) -> None:
        self.calls.append("send_buffered")

    async def flush(self) -> None:
        self.calls.append("flush")


@dataclass
class CountingLookup:
    """The partition-count lookup of unknown topics: answers from ``counts``, counts its calls."""

    counts: dict[str, int] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)

    async def __call__(self, topic: str) -> int | None:
        self.asked.append(topic)
        return self.counts.get(topic)


def make_collector(
    partitions: dict[str, int] | None = None, lookup: CountingLookup | None = None
) -> tuple[RecordCollector, RecordingProducer]:
    producer = RecordingProducer()
    collector = RecordCollector(producer, dict(partitions or {"out": 4}), lookup or CountingLookup())
    return collector, producer


def expected_partition(key: bytes, count: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % count


def send(collector: RecordCollector, record: Record, topic: str = "out",
         partitioner: Callable[[str, Any, Any, int], int | None] | None = None,
         key_serde: Any = STR, value_serde: Any = JSON) -> Awaitable[None] | None:
    return collector.send(topic, record, SinkNode(SINK, topic, key_serde, value_serde, partitioner))


# -- serialisation -------------------------------------------------------------------------


def test_send_serialises_key_and_value_with_the_given_serdes() -> None:
    collector, producer = make_collector()

    send(collector, Record("alice", {"n": 1}, 5), key_serde=STR, value_serde=JSON)
    send(collector, Record(7, b"raw", 6), key_serde=INT, value_serde=BYTES)

    assert [(a.key, a.value) for a in producer.appended] == [
        (b"alice", b'{"n":1}'),
        (b"\x00\x00\x00\x07", b"raw"),
    ]


def test_send_to_a_known_topic_appends_at_once_and_returns_none() -> None:
    collector, producer = make_collector()

    assert send(collector, Record("k", 1, 0)) is None
    assert len(producer.appended) == 1
    assert collector.sent == 1


def test_output_keeps_the_timestamp_and_headers_of_the_record() -> None:
    collector, producer = make_collector()
    headers = [("trace", b"abc"), ("retry", b"1")]

    send(collector, Record("k", 1, 1_700_000_000_123, headers))

    assert producer.appended[0].timestamp == 1_700_000_000_123
    assert producer.appended[0].headers == headers


def test_serde_failure_is_a_serialization_error_naming_the_sink_and_nothing_is_appended() -> None:
    collector, producer = make_collector()

    with pytest.raises(SerializationError,
                       match=f"Sink '{SINK}' \\(topic 'out'\\) cannot write a key of type int") as failed:
        send(collector, Record(42, 1, 0), key_serde=STR)
    assert isinstance(failed.value.__cause__, TypeError)
    assert "StringSerde expects str" in str(failed.value)
    assert producer.appended == []
    assert collector.sent == 0


def test_a_value_serde_failure_appends_nothing_either() -> None:
    collector, producer = make_collector()

    with pytest.raises(SerializationError, match="cannot write a value of type set") as failed:
        send(collector, Record("k", {1}, 0), value_serde=JSON)
    assert failed.value.what == "value"
    assert producer.appended == []


# -- partitioning -----------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["alice", "bob", "customer-17", "", "ünïcödé"])
@pytest.mark.parametrize("count", [1, 3, 4, 12])
def test_default_partition_is_positive_murmur2_of_the_key_bytes_modulo_partitions(key: str, count: int) -> None:
    collector, producer = make_collector({"out": count})

    send(collector, Record(key, 1, 0))

    assert producer.appended[0].partition == expected_partition(key.encode(), count)


def test_same_key_always_lands_in_the_same_partition() -> None:
    collector, producer = make_collector({"out": 8})

    for value in range(5):
        send(collector, Record("sticky", value, 0))

    assert {a.partition for a in producer.appended} == {expected_partition(b"sticky", 8)}


def test_records_without_key_go_round_robin_per_topic() -> None:
    collector, producer = make_collector({"out": 3, "other": 2})

    for value in range(7):
        send(collector, Record(None, value, 0))
    send(collector, Record(None, 99, 0), topic="other")

    assert [a.partition for a in producer.appended if a.topic == "out"] == [0, 1, 2, 0, 1, 2, 0]
    assert [a.partition for a in producer.appended if a.topic == "other"] == [0]


def test_custom_partitioner_gets_topic_key_value_and_count_and_its_answer_is_used() -> None:
    collector, producer = make_collector({"out": 5})
    asked: list[tuple[str, Any, Any, int]] = []

    def partitioner(topic: str, key: Any, value: Any, count: int) -> int:
        asked.append((topic, key, value, count))
        return 3

    send(collector, Record("k", {"n": 1}, 0), partitioner=partitioner)

    assert asked == [("out", "k", {"n": 1}, 5)]
    assert producer.appended[0].partition == 3


def test_custom_partitioner_answering_none_falls_back_to_the_default() -> None:
    collector, producer = make_collector({"out": 6})

    send(collector, Record("k", 1, 0), partitioner=lambda topic, key, value, count: None)

    assert producer.appended[0].partition == expected_partition(b"k", 6)


@pytest.mark.parametrize("answer", [-1, 4, 100])
def test_custom_partitioner_out_of_range_raises_produce_error_naming_the_sink(answer: int) -> None:
    collector, producer = make_collector({"out": 4})

    with pytest.raises(ProduceError, match=f"partitioner of '{SINK}' chose a partition outside 0..3") as info:
        send(collector, Record("k", 1, 0), partitioner=lambda topic, key, value, count: answer)

    assert (info.value.topic, info.value.partition) == ("out", answer)
    assert producer.appended == []


# -- topics chosen per record ------------------------------------------------------------------


@pytest.mark.asyncio
async def test_unknown_topic_is_looked_up_then_the_record_is_appended() -> None:
    lookup = CountingLookup({"dynamic": 2})
    collector, producer = make_collector({"out": 4}, lookup)

    pending = send(collector, Record("k", 1, 10, [("h", b"v")]), topic="dynamic")
    assert pending is not None
    assert producer.appended == []  # nothing before the partition count is known
    await pending

    assert producer.appended == [
        Appended("dynamic", expected_partition(b"k", 2), b"k", b"1", 10, [("h", b"v")])
    ]


@pytest.mark.asyncio
async def test_unknown_topic_is_looked_up_once_and_then_cached() -> None:
    lookup = CountingLookup({"dynamic": 2})
    collector, producer = make_collector({"out": 4}, lookup)

    first = send(collector, Record("a", 1, 0), topic="dynamic")
    assert first is not None
    await first
    later = [send(collector, Record("b", n, 0), topic="dynamic") for n in range(3)]

    assert lookup.asked == ["dynamic"]
    assert later == [None, None, None]
    assert len(producer.appended) == 4


@pytest.mark.asyncio
async def test_known_topics_are_never_looked_up() -> None:
    lookup = CountingLookup({"out": 4})
    collector, _ = make_collector({"out": 4}, lookup)

    send(collector, Record("k", 1, 0))

    assert lookup.asked == []


@pytest.mark.asyncio
async def test_lookup_answering_none_raises_missing_sink_topic_error() -> None:
    lookup = CountingLookup({})
    collector, producer = make_collector({"out": 4}, lookup)

    pending = send(collector, Record("k", 1, 0), topic="nowhere")
    assert pending is not None
    with pytest.raises(MissingSinkTopicError, match=r"\['nowhere'\]") as info:
        await pending

    assert info.value.topics == ["nowhere"]
    assert producer.appended == []


# -- handing over to the producer ---------------------------------------------------------------


@pytest.mark.asyncio
async def test_buffered_send_buffered_and_flush_go_to_the_producer() -> None:
    collector, producer = make_collector()
    send(collector, Record("k", 1, 0))

    assert collector.buffered() == 1
    await collector.send_buffered()
    await collector.flush()

    assert producer.calls == ["send_buffered", "flush"]
