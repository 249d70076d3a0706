"""``spark_batch`` / ``to_spark`` in the DSL: checked arguments, and a window sized from the batching."""

from __future__ import annotations

from typing import Any

import pytest

from streamloop import StreamsBuilder, TopologyError
from streamloop.spark.stage import BatchSettings


def test_batching_comes_from_the_stage_or_else_the_config() -> None:
    config = {"spark.batch.max.records": 100, "spark.batch.max.wait.ms": 50, "spark.batch.max.in.flight": 3}

    assert BatchSettings().resolve(config) == (100, 50, 3)
    assert BatchSettings(max_records=10, max_in_flight=2).resolve(config) == (10, 50, 2)
    assert BatchSettings(max_records=1, max_in_flight=1).window(config) == 2  # never one by one


def test_the_sub_topology_holds_every_batch_allowed_in_flight_in_partition_order() -> None:
    builder = StreamsBuilder()
    (builder.stream("in").filter(lambda k, v: True, ordering="unordered")
            .spark_batch(lambda frame: frame, max_records=50).to("out"))
    topology = builder.build()

    assert topology.concurrency_of(0, {"spark.batch.max.in.flight": 4}) == (200, "partition")
    assert topology.concurrency_of(0, {}) == (100, "partition")  # the key's default: 2 in flight
    assert "KSTREAM-SPARK-BATCH" in topology.describe()


@pytest.mark.parametrize("arguments, message", [
    ({"max_records": 0}, "max_records"),
    ({"max_wait_ms": -1}, "max_wait_ms"),
    ({"max_batches_in_flight": True}, "max_batches_in_flight"),
])
def test_bad_batching_is_a_topology_error_naming_the_argument(arguments: dict, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        StreamsBuilder().stream("in").spark_batch(lambda frame: frame, **arguments)


def test_spark_batch_needs_a_function() -> None:
    with pytest.raises(TypeError, match="callable"):
        StreamsBuilder().stream("in").spark_batch("not a function")  # type: ignore[arg-type]


@pytest.mark.parametrize("arguments", [{}, {"path": "/lake", "table": "orders"}])
def test_the_spark_sink_needs_a_path_or_a_table(arguments: dict) -> None:
    with pytest.raises(TopologyError, match="exactly one of path= or table="):
        StreamsBuilder().stream("in").to_spark(**arguments)


def test_the_spark_sink_checks_its_write_mode() -> None:
    with pytest.raises(TopologyError, match="mode"):
        StreamsBuilder().stream("in").to_spark("/lake", mode="upsert")


def test_a_spark_stage_after_another_in_one_sub_topology_is_refused() -> None:
    builder = StreamsBuilder()
    first = builder.stream("in").spark_batch(lambda frame: frame, name="first").map_values(lambda v: v)

    with pytest.raises(TopologyError, match="follows Spark stage 'first'"):
        first.spark_batch(lambda frame: frame)
    with pytest.raises(TopologyError, match="follows Spark stage 'first'"):
        first.to_spark("/lake")
    builder.stream("again").spark_batch(lambda frame: frame)  # another sub-topology is fine


def test_a_stage_reading_on_the_executors_takes_its_ranges_from_spark_batch_read_max_records() -> None:
    from types import SimpleNamespace

    from streamloop.ids import TaskId
    from streamloop.spark.session import SparkSessions
    from streamloop.spark.stage import SparkBatchStage

    def batching(settings: BatchSettings, read: str | None, **config: Any) -> int:
        stage = SparkBatchStage("s", lambda frame: frame, settings, "key", None, schema="key long", read=read)
        sessions = SparkSessions({k.replace("_", "."): v for k, v in config.items()}, "app")
        stage.init(SimpleNamespace(spark=sessions, application_id="app", task_id=TaskId(0, 0)))  # type: ignore[arg-type]
        return stage.batching()[0]

    assert batching(BatchSettings(), "executors") == 250_000  # the default: a job's fixed cost spread wider
    assert batching(BatchSettings(), "executors", spark_batch_read_max_records=7, spark_batch_max_records=3) == 7
    assert batching(BatchSettings(), "driver", spark_batch_read_max_records=7, spark_batch_max_records=3) == 3
    assert batching(BatchSettings(max_records=5), "executors", spark_batch_read_max_records=7) == 5  # the stage's own
    assert batching(BatchSettings(), None, spark_batch_read="executors", spark_batch_read_max_records=7) == 7
