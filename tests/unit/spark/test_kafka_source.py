"""``read="executors"`` without Kafka or Spark jobs: range picking, the checks of ``read=`` and
``spark.batch.read``, and the executors' decoding of a range (side rows and the carrier)."""

from __future__ import annotations

from typing import Any

import pytest

from streamloop import KafkaStreams, StreamsBuilder
from streamloop.errors import ConfigError, TopologyError
from streamloop.records import FetchedRecord, TopicPartition
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.spark.kafka_source import (
    CARRIER,
    COUNT,
    KIND,
    MAX_TIMESTAMP,
    OFFSET,
    TIMESTAMP,
    KafkaRange,
    ReadSpec,
    executor_options,
    pick_range,
    unpack_error,
)
from tests.support.apps import streams_config

INT, JSON = IntegerSerde(), JsonSerde()
SCHEMA = "key long, amount long, customer string"
TP = TopicPartition("in", 3)


def test_a_range_runs_from_the_position_to_the_end_offset_bounded_by_max_records() -> None:
    assert pick_range(TP, 10, 25, 100) == KafkaRange("in", 3, 10, 25)
    assert pick_range(TP, 10, 25, 5) == KafkaRange("in", 3, 10, 15)
    assert pick_range(TP, 0, 1, 1) == KafkaRange("in", 3, 0, 1)
    assert pick_range(TP, 25, 25, 5) is None  # nothing past the position
    assert pick_range(TP, 30, 25, 5) is None  # a stale end offset
    with pytest.raises(ValueError, match="max_records"):
        pick_range(TP, 0, 10, 0)


def test_a_range_limit_halves_on_a_timeout_and_doubles_back_after_a_fast_full_range() -> None:
    from streamloop.tasks.exec_work import RangeLimit

    limit = RangeLimit(100)
    assert limit.narrowed(KafkaRange("in", 3, 10, 60)) == KafkaRange("in", 3, 10, 60)
    limit.timed_out(100)
    assert limit.records == 50
    assert limit.narrowed(KafkaRange("in", 3, 10, 110)) == KafkaRange("in", 3, 10, 60)
    limit.timed_out(8)  # a small range timed out: half of it, not of the limit
    assert limit.records == 4
    limit.finished(3, 1.0, 1_000)  # not a full range: says nothing of a bigger one
    limit.finished(4, 300.0, 1_000)  # over a quarter of the timeout: twice as long would not leave a margin
    assert limit.records == 4
    limit.finished(4, 200.0, 1_000)
    assert limit.records == 8
    for _ in range(10):
        limit.finished(limit.records, 1.0, 1_000)
    assert limit.records == 100  # never past max_records
    limit.timed_out(1)
    limit.timed_out(1)
    assert limit.records == 1  # a single record is retried as it is, under task.timeout.ms
    limit.finished(1, 1.0, 0)  # no timeout (0): nothing to fit under, so it stays
    assert limit.records == 1


def test_the_executors_take_only_plain_options_of_the_consumer() -> None:
    options = {"bootstrap_servers": "b:9092", "group_id": "g", "isolation_level": "read_committed",
               "ssl_context": object(), "request_timeout_ms": 1000, "session_timeout_ms": 10}
    assert executor_options(options) == {"bootstrap_servers": "b:9092", "isolation_level": "read_committed",
                                         "request_timeout_ms": 1000}


def test_read_executors_after_a_processor_without_a_schema_or_unknown_is_a_topology_error() -> None:
    builder = StreamsBuilder()
    stream = builder.stream("in", key_serde=INT, value_serde=JSON)
    with pytest.raises(TopologyError, match=r"Spark stage 'late'.*right after.*set read='driver'"):
        stream.map_values(lambda v: v).spark_batch(lambda f: f, schema=SCHEMA, read="executors", name="late")
    with pytest.raises(TopologyError, match=r"Spark stage 'bare'.*no schema="):
        stream.spark_batch(lambda f: f, read="executors", name="bare")
    with pytest.raises(TopologyError, match=r"read= of Spark stage 'odd' must be one of"):
        stream.spark_batch(lambda f: f, schema=SCHEMA, read="workers", name="odd")
    with pytest.raises(TopologyError, match=r"Spark sink 'files'.*right after|Spark stage 'files'.*right after"):
        stream.filter(lambda k, v: True).to_spark("/tmp/x", schema=SCHEMA, read="executors", name="files")
    stream.spark_batch(lambda f: f, schema=SCHEMA, read="executors", name="fine")  # right after its source


def _direct(read: str | None = "executors") -> Any:
    builder = StreamsBuilder()
    builder.stream("in", key_serde=INT, value_serde=JSON).spark_batch(
        lambda f: f, schema=SCHEMA, name="direct", read=read).to("out", value_serde=JSON)
    return builder.build()


def test_spark_batch_read_is_checked_when_the_client_is_created() -> None:
    bootstrap = "localhost:9"  # never reached: the check runs at construction
    builder = StreamsBuilder()
    builder.stream("in", key_serde=INT, value_serde=JSON).map_values(lambda v: v).spark_batch(
        lambda f: f, schema=SCHEMA, name="late").to("out", value_serde=JSON)
    config = {**streams_config(bootstrap, "app"), "spark.batch.read": "executors"}
    with pytest.raises(ConfigError, match=r"Spark stage 'late' cannot read on the executors.*read='driver'"):
        KafkaStreams(builder.build(), config)
    ok = StreamsBuilder()  # the stage says so itself: the default does not apply to it
    ok.stream("in", key_serde=INT, value_serde=JSON).map_values(lambda v: v).spark_batch(
        lambda f: f, schema=SCHEMA, name="late", read="driver").to("out", value_serde=JSON)
    KafkaStreams(ok.build(), config)
    with pytest.raises(ConfigError, match=r"'spark.batch.read'.*must be one of"):
        KafkaStreams(_direct(None), {**config, "spark.batch.read": "workers"})
    with pytest.raises(ConfigError, match=r"processing.guarantee.*'direct'.*at_least_once"):
        KafkaStreams(_direct(), {**streams_config(bootstrap, "app"), "processing.guarantee": "exactly_once_v2"})
    with pytest.raises(ConfigError, match=r"'direct'.*memory broker"):
        KafkaStreams(_direct(), streams_config("memory://x", "app"))
    # The driver path under exactly-once stays as it was.
    KafkaStreams(_direct("driver"), {**streams_config(bootstrap, "app"), "processing.guarantee": "exactly_once_v2"})


def _decode(values: list[bytes | None]) -> list[tuple[Any, ...]]:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from streamloop.spark.kafka_reader import decode_range

    schema = StructType([StructField("key", LongType()), StructField("amount", LongType()),
                         StructField("customer", StringType())])
    spec = ReadSpec({}, (KafkaRange("in", 0, 0, len(values)),), INT, JSON, "key", schema)
    raws = [FetchedRecord("in", 0, i, 1000 + i, INT.serialize(i), v) for i, v in enumerate(values)]
    return list(decode_range(iter(raws), spec, len(schema.fields)))


NAMES = ["key", "amount", "customer", KIND, OFFSET, TIMESTAMP, "raw_key", "raw_value", "headers", "error", COUNT,
         MAX_TIMESTAMP]


def _named(row: tuple[Any, ...]) -> dict[str, Any]:
    return dict(zip(NAMES, row, strict=True))


def test_the_executors_decode_a_range_as_the_driver_does_and_keep_failures_as_side_rows() -> None:
    pytest.importorskip("pyspark")
    values = [JSON.serialize({"amount": i, "customer": f"c{i}", "extra": 1}) for i in range(6)]
    values[2] = b"{nope"
    values[4] = JSON.serialize({"amount": "x"})
    rows = [_named(r) for r in _decode(values)]
    assert [(r["key"], r["amount"], r["customer"]) for r in rows if r[KIND] is None] == [
        (0, 0, "c0"), (1, 1, "c1"), (3, 3, "c3"), (5, 5, "c5")]
    failed = [r for r in rows if r[KIND] not in (None, CARRIER)]
    assert [(r[KIND], r[OFFSET], r["raw_value"]) for r in failed] == [("value", 2, b"{nope"), ("schema", 4, values[4])]
    assert isinstance(unpack_error(failed[0]["error"]), ValueError)
    assert unpack_error(failed[1]["error"]).mismatch().field == "amount"
    # The output leaves with the last record before the first failure (offset 1), as on the driver path.
    (summary,) = [r for r in rows if r[KIND] == CARRIER]
    assert (summary[OFFSET], summary[TIMESTAMP], summary[COUNT], summary[MAX_TIMESTAMP]) == (1, 1001, 6, 1005)


def test_a_range_whose_first_record_fails_leaves_with_its_last_good_record() -> None:
    pytest.importorskip("pyspark")
    values = [b"{nope", JSON.serialize({"amount": 1}), JSON.serialize({"amount": 2})]
    (summary,) = [_named(r) for r in _decode(values) if r[3] == CARRIER]
    assert summary[OFFSET] == 2
    (none_good,) = [_named(r) for r in _decode([b"{nope"]) if r[3] == CARRIER]
    assert none_good[OFFSET] == -1
