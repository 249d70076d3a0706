"""A Spark stage's ``schema=`` takes each record's fields by name, on ``memory://`` and on Kafka,
with the session's real local Spark: missing fields are null, extra ones dropped, and a record
whose value does not fit goes alone to the processing exception handler."""

from __future__ import annotations

from typing import Any

import pytest

from streamloop import ClientState, KafkaStreams, ProcessingError, StreamsBuilder
from streamloop.errors import SparkSchemaError
from streamloop.handlers import ProcessingHandlerResponse, StreamThreadExceptionResponse
from streamloop.records import TopicPartition
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.testing import eventually_async
from tests.support.apps import streams_config
from tests.support.cluster import Cluster, committed_offset

pytestmark = pytest.mark.asyncio

INT, JSON = IntegerSerde(), JsonSerde()
WAIT = 60
SCHEMA = "key long, amount long, customer string"


class AnsweringHandler:
    """A processing handler that gives one answer and keeps what it was asked."""

    def __init__(self, answer: ProcessingHandlerResponse) -> None:
        self.answer = answer
        self.asked: list[tuple[Any, BaseException]] = []

    def configure(self, config: Any) -> None:
        pass

    def handle(self, context: Any, record: Any, exception: BaseException) -> ProcessingHandlerResponse:
        self.asked.append((context, exception))
        return self.answer


async def orders(cluster: Cluster, names: Any, count: int, bad: int | None = None) -> tuple[str, str]:
    """``count`` orders on one partition, values ``{"customer", "amount"}`` in that order; the
    ``bad`` one has a string amount."""
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    values = [{"customer": f"c{i}", "amount": "lots" if i == bad else i} for i in range(count)]
    await cluster.produce(source, list(enumerate(values)), INT, JSON, partitions=1)
    return source, sink


def make_client(builder: StreamsBuilder, cluster: Cluster, app: str, **overrides: Any) -> KafkaStreams:
    # One batch holds every test record: max.records is the stage's, and the wait is long enough.
    settings = {"spark.batch.max.wait.ms": 2_000, **{k.replace("_", "."): v for k, v in overrides.items()}}
    return KafkaStreams(builder.build(), {**streams_config(cluster.bootstrap, app), **settings})


async def committed(cluster: Cluster, app: str, topic: str) -> int | None:
    return await committed_offset(cluster, app, TopicPartition(topic, 0))


async def _is(value: Any, expected: Any) -> bool:
    return (await value) == expected


async def test_spark_batch_sees_the_schema_fields_by_name(cluster: Cluster, names, spark) -> None:
    source, sink = await orders(cluster, names, 6)
    seen: list[dict[str, Any]] = []

    def tenfold(frame: Any) -> Any:
        seen.extend(row.asDict() for row in frame.collect())
        return frame.select("key", "customer", (frame.amount * 10).alias("amount10"))

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .spark_batch(tenfold, schema=SCHEMA, max_records=6)
            .to(sink, key_serde=INT, value_serde=JSON))
    failures: list[BaseException] = []
    streams = make_client(builder, cluster, names.app)
    streams.set_uncaught_exception_handler(
        lambda exc: failures.append(exc) or StreamThreadExceptionResponse.SHUTDOWN_CLIENT)
    async with streams:
        await eventually_async(lambda: failures or _is(committed(cluster, names.app, source), 6), WAIT,
                               "all committed (or a failure)")
        assert failures == []
        output = await cluster.read_all(sink)
    assert sorted(seen, key=lambda row: row["key"]) == [
        {"key": i, "amount": i, "customer": f"c{i}"} for i in range(6)]
    assert sorted((JSON.deserialize(r.value) for r in output), key=lambda v: v["amount10"]) == [
        {"customer": f"c{i}", "amount10": i * 10} for i in range(6)]


async def test_a_record_that_does_not_fit_goes_alone_to_the_handler_and_continue_skips_it(
        cluster: Cluster, names, spark) -> None:
    source, sink = await orders(cluster, names, 6, bad=3)
    handler = AnsweringHandler(ProcessingHandlerResponse.CONTINUE)
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .spark_batch(lambda frame: frame, schema=SCHEMA, max_records=6, name="orders")
            .to(sink, key_serde=INT, value_serde=JSON))
    async with make_client(builder, cluster, names.app, processing_exception_handler=handler):
        await eventually_async(lambda: _is(committed(cluster, names.app, source), 6), WAIT, "all committed")
        output = await cluster.read_all(sink)
    assert sorted(JSON.deserialize(r.value)["amount"] for r in output) == [0, 1, 2, 4, 5]
    assert len(handler.asked) == 1
    context, error = handler.asked[0]
    assert isinstance(error, SparkSchemaError)
    assert (error.stage, error.field, error.expected, error.found) == ("orders", "amount", "bigint", "str")
    assert (error.topic, error.partition, error.offset) == (source, 0, 3)
    assert (context.topic, context.offset) == (source, 3)


async def test_a_record_that_does_not_fit_fails_the_task_under_log_and_fail(cluster: Cluster, names, spark) -> None:
    source, sink = await orders(cluster, names, 6, bad=3)
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .spark_batch(lambda frame: frame, schema=SCHEMA, max_records=6, name="orders")
            .to(sink, key_serde=INT, value_serde=JSON))
    failures: list[BaseException] = []
    streams = make_client(builder, cluster, names.app)
    streams.set_uncaught_exception_handler(
        lambda exc: failures.append(exc) or StreamThreadExceptionResponse.SHUTDOWN_CLIENT)
    await streams.start_async()
    try:
        assert await streams.wait_for_state_async(ClientState.ERROR, timeout=WAIT)
    finally:
        await streams.close_async()
    assert isinstance(failures[0], ProcessingError)
    assert isinstance(failures[0].__cause__, SparkSchemaError)
    message = str(failures[0].__cause__)
    for part in ("'orders'", "'amount'", "bigint", f"{source}-0 offset 3"):
        assert part in message
    assert (await committed(cluster, names.app, source) or 0) <= 3  # never past the bad record


async def test_a_pause_at_a_record_that_does_not_fit_keeps_the_output_of_the_records_before_it(
        cluster: Cluster, names, spark) -> None:
    source, sink = await orders(cluster, names, 6, bad=3)
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .spark_batch(lambda frame: frame, schema=SCHEMA, max_records=6)
            .to(sink, key_serde=INT, value_serde=JSON))
    streams = make_client(builder, cluster, names.app,
                          processing_exception_handler=AnsweringHandler(ProcessingHandlerResponse.PAUSE))
    async with streams:
        await eventually_async(lambda: _is(committed(cluster, names.app, source), 3), WAIT,
                               "committed up to the paused record")
        assert streams.paused_local_tasks()
        before = sorted(JSON.deserialize(r.value)["amount"] for r in await cluster.read_all(sink))
        assert await streams.resume_async("0_0", skip=True)
        await eventually_async(lambda: _is(committed(cluster, names.app, source), 6), WAIT, "all committed")
        after = [JSON.deserialize(r.value)["amount"] for r in await cluster.read_all(sink)]
    # The batch's rows left with record 2, before the pause; records 4 and 5 are read again on
    # resume, so their output may come twice (at-least-once), but none is lost.
    assert before == [0, 1, 2, 4, 5]
    assert sorted(set(after)) == [0, 1, 2, 4, 5]


async def test_the_spark_sink_writes_the_schema_fields_by_name(cluster: Cluster, names, spark, tmp_path) -> None:
    source, _sink = await orders(cluster, names, 6)
    path = str(tmp_path / "lake")
    builder = StreamsBuilder()
    builder.stream(source, key_serde=INT, value_serde=JSON).to_spark(path, schema=SCHEMA, max_records=6)
    failures: list[BaseException] = []
    streams = make_client(builder, cluster, names.app)
    streams.set_uncaught_exception_handler(
        lambda exc: failures.append(exc) or StreamThreadExceptionResponse.SHUTDOWN_CLIENT)
    async with streams:
        await eventually_async(lambda: failures or _is(committed(cluster, names.app, source), 6), WAIT,
                               "all committed (or a failure)")
        assert failures == []
    rows = spark.read.parquet(path)
    assert rows.columns == ["key", "amount", "customer"]
    assert sorted((row.asDict() for row in rows.collect()), key=lambda row: row["key"]) == [
        {"key": i, "amount": i, "customer": f"c{i}"} for i in range(6)]
