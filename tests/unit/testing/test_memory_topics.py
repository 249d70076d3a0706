"""``streamloop.testing.produce``/``read``/``create_topics``: the memory broker's topics from a test or a script."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from streamloop import KafkaStreams, Record, StreamsBuilder
from streamloop.errors import TransportError
from streamloop.serdes import IntegerSerde, JsonSerde, StringSerde
from streamloop.testing import create_topics, eventually, produce, read
from streamloop.transport.memory import MemoryBroker
from tests.support.apps import streams_config


@pytest.fixture
def bootstrap() -> Iterator[str]:
    name = f"topics-{uuid.uuid4().hex[:8]}"
    yield f"memory://{name}"
    MemoryBroker.reset(name)


def test_produced_records_are_read_back_through_the_serdes(bootstrap: str) -> None:
    create_topics(bootstrap, {"orders": 1})

    produce(bootstrap, "orders", [("a", {"n": 1}), ("b", {"n": 2})], StringSerde(), JsonSerde())

    got = read(bootstrap, "orders", StringSerde(), JsonSerde())
    assert [(r.key, r.value) for r in got] == [("a", {"n": 1}), ("b", {"n": 2})]
    assert [r.offset for r in got] == [0, 1]


def test_a_key_goes_to_the_partition_the_engine_would_send_it_to(bootstrap: str) -> None:
    create_topics(bootstrap, {"in": 4, "out": 4})
    builder = StreamsBuilder()
    builder.stream("in").to("out")  # bytes through: the sink partitions by the key's bytes
    streams = KafkaStreams(builder.build(), streams_config(bootstrap, "partitions"))
    streams.start()
    try:
        keys = [f"customer-{i}" for i in range(20)]
        produce(bootstrap, "in", [(key, b"v") for key in keys], StringSerde(), None)
        eventually(lambda: len(read(bootstrap, "out")) == len(keys), timeout=15, what="every record copied")
    finally:
        streams.close(timeout=15)

    placed_in = {r.key: r.partition for r in read(bootstrap, "in", StringSerde())}
    placed_out = {r.key: r.partition for r in read(bootstrap, "out", StringSerde())}
    assert placed_in == placed_out
    assert len(set(placed_in.values())) > 1


def test_records_without_key_are_spread_round_robin(bootstrap: str) -> None:
    create_topics(bootstrap, {"in": 3})

    produce(bootstrap, "in", [(None, i) for i in range(6)], None, IntegerSerde())

    assert sorted(r.partition for r in read(bootstrap, "in")) == [0, 0, 1, 1, 2, 2]


def test_a_record_keeps_its_timestamp_headers_and_the_partition_given(bootstrap: str) -> None:
    create_topics(bootstrap, {"in": 2})

    produce(bootstrap, "in", [Record("k", "v", 1234, (("trace", b"t"),))], StringSerde(), StringSerde(), partition=1)

    [got] = read(bootstrap, "in", StringSerde(), StringSerde())
    assert (got.key, got.value, got.timestamp, got.headers, got.partition) == ("k", "v", 1234, (("trace", b"t"),), 1)


def test_producing_to_a_missing_topic_names_it_and_what_to_do(bootstrap: str) -> None:
    with pytest.raises(TransportError, match=r"'nope' does not exist.*create_topics"):
        produce(bootstrap, "nope", [(b"k", b"v")])


def test_only_the_memory_broker_is_fed(bootstrap: str) -> None:
    with pytest.raises(ValueError, match="memory://"):
        produce("localhost:9092", "in", [(b"k", b"v")])
