"""The executors' writes of a direct sink (``streamloop.spark.kafka_writer``) without Spark jobs or
Kafka: each row becomes the record the driver path's collector would send (bytes, partition,
timestamp), and the spec travels to the executors and back."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pyspark")

from streamloop.collector import RecordCollector
from streamloop.processors.nodes import SinkNode
from streamloop.serdes import IntegerSerde, JsonSerde, StringSerde
from streamloop.spark.frames import to_records
from streamloop.spark.kafka_writer import WriteSpec, keyed


def spec(key_serde: Any, value_columns: tuple[str, ...] | None = None, partitions: int = 5) -> WriteSpec:
    return WriteSpec({"bootstrap_servers": "127.0.0.1:1"}, "out", partitions, "key", value_columns, key_serde,
                     JsonSerde(), 1234)


class _Producer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, int, bytes | None, bytes | None, int]] = []

    def append(self, topic: str, partition: int, key: bytes | None, value: bytes | None, timestamp: int,
               headers: Any) -> None:
        self.sent.append((topic, partition, key, value, timestamp))


async def _no_lookup(topic: str) -> int | None:
    return None


@pytest.mark.parametrize("key_serde", [StringSerde(), IntegerSerde()])
def test_each_row_is_written_as_the_driver_paths_collector_sends_its_record(key_serde: Any) -> None:
    rows = [{"key": f"k{i}" if isinstance(key_serde, StringSerde) else i, "amount": i, "tier": "t"} for i in range(40)]
    written = list(keyed(spec(key_serde), [dict(row) for row in rows]))
    producer = _Producer()
    collector = RecordCollector(producer, {"out": 5}, _no_lookup)  # type: ignore[arg-type]
    sink = SinkNode("sink", "out", key_serde, JsonSerde(), None)
    for record in to_records([dict(row) for row in rows], "key", None, 1234):
        assert collector.send("out", record, sink) is None
    assert written == [(partition, key, value, ts) for _topic, partition, key, value, ts in producer.sent]
    assert len({partition for partition, *_ in written}) > 1  # the keys spread over the partitions


def test_value_columns_and_keyless_rows() -> None:
    rows = [{"key": None, "amount": i, "tier": "t", "extra": i} for i in range(6)]
    written = list(keyed(spec(StringSerde(), ("amount",), partitions=3), rows))
    assert [partition for partition, *_ in written] == [0, 1, 2, 0, 1, 2]  # round-robin, as the collector
    assert [JsonSerde().deserialize(value) for _p, _k, value, _t in written] == [{"amount": i} for i in range(6)]
    assert all(key is None and ts == 1234 for _p, key, _v, ts in written)


def test_the_spec_travels_encoded() -> None:
    encoded = spec(IntegerSerde(), ("amount", "tier")).encode()
    decoded = WriteSpec.decode(encoded)
    assert (decoded.topic, decoded.partitions, decoded.timestamp) == ("out", 5, 1234)
    assert decoded.value_columns == ("amount", "tier")
    assert decoded.key_serde.serialize(7) == IntegerSerde().serialize(7)


def test_the_value_columns_order_each_value_whether_or_not_the_rows_hold_only_them() -> None:
    values = [JsonSerde().deserialize(v) for _p, _k, v, _t in keyed(spec(StringSerde(), ("amount", "tier")), [
        {"key": "a", "amount": 1, "tier": "t"}, {"key": "b", "amount": 2, "tier": "u"}])]
    assert values == [{"amount": 1, "tier": "t"}, {"amount": 2, "tier": "u"}]
    # The rows' own order differs from the value columns': the value follows the value columns.
    rows = [{"key": "a", "tier": "t", "amount": 1}]
    reordered = [v for _p, _k, v, _t in keyed(spec(StringSerde(), ("amount", "tier")), rows)]
    assert reordered == [b'{"amount":1,"tier":"t"}']
