"""A sink without serdes writes with the stream's serdes, on the memory broker and on real Kafka.

A value that no known serde and no default can write fails at its first record, naming the
sink and both fixes; the client's error handling decides as for any failed record.
"""

from __future__ import annotations

import asyncio

import pytest

from streamloop import ClientState, KafkaStreams, StreamsBuilder
from streamloop.errors import ProcessingError, SerializationError
from streamloop.handlers import LogAndContinueProcessingExceptionHandler, StreamThreadExceptionResponse
from streamloop.serdes import IntegerSerde, JsonSerde, StringSerde
from streamloop.testing import eventually_async
from tests.support.apps import make_streams
from tests.support.cluster import Cluster

pytestmark = pytest.mark.asyncio

STR, JSON, INT = StringSerde(), JsonSerde(), IntegerSerde()


def failures_of(streams: KafkaStreams) -> list[BaseException]:
    errors: list[BaseException] = []

    def handler(exc: BaseException) -> StreamThreadExceptionResponse:
        errors.append(exc)
        return StreamThreadExceptionResponse.SHUTDOWN_CLIENT

    streams.set_uncaught_exception_handler(handler)
    return errors


async def test_to_without_serdes_writes_with_the_serdes_the_stream_was_read_with(cluster: Cluster, names) -> None:
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 2, sink: 2})
    records = [(f"user-{i}", {"n": i}) for i in range(20)]
    await cluster.produce(source, records, STR, JSON, partitions=2)
    builder = StreamsBuilder()
    builder.stream(source, key_serde=STR, value_serde=JSON).filter(lambda k, v: v["n"] % 2 == 0).to(sink)
    streams = make_streams(builder.build(), cluster.bootstrap, names.app)
    errors = failures_of(streams)
    expected = [(k, v) for k, v in records if v["n"] % 2 == 0]

    async with streams:
        reading = asyncio.ensure_future(cluster.read(sink, len(expected)))
        try:
            await eventually_async(lambda: reading.done() or errors, 45, f"{len(expected)} records in {sink}")
        finally:
            if not reading.done():
                reading.cancel()
        assert errors == [], f"the client failed: {errors[0]!r}"
        output = reading.result()

    assert sorted((STR.deserialize(r.key), JSON.deserialize(r.value)) for r in output) == sorted(
        expected, key=lambda kv: kv[0])


async def test_a_value_no_serde_can_write_fails_at_its_first_record_naming_the_sink(cluster: Cluster, names) -> None:
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    await cluster.produce(source, [("a", {"n": 1}), ("b", {"n": 2})], STR, JSON, partitions=1)
    builder = StreamsBuilder()
    builder.stream(source, key_serde=STR, value_serde=JSON).map_values(lambda v: v["n"]).to(sink, name="to-out")
    streams = make_streams(builder.build(), cluster.bootstrap, names.app)
    errors = failures_of(streams)

    async with streams:
        await eventually_async(lambda: streams.state is ClientState.ERROR, 45, "the client in ERROR")

    assert len(errors) == 1
    assert isinstance(errors[0], ProcessingError)
    assert (errors[0].topic, errors[0].offset) == (source, 0)
    cause = errors[0].__cause__
    assert isinstance(cause, SerializationError)
    assert (cause.sink, cause.topic, cause.what) == ("to-out", sink, "value")
    assert "a value of type int" in str(cause)
    assert "value_serde=" in str(cause) and "default.value.serde" in str(cause)
    assert await cluster.read_all(sink) == []


async def test_with_records_in_flight_the_processing_handler_decides_about_a_record_the_sink_cannot_write(
        cluster: Cluster, names) -> None:
    """With ``num.threads.per.task`` > 1 a record's output is held until its turn, but it is
    serialised while the record runs, so a serde failure reaches the handler as it does without."""
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    values = [{"n": 0}, {"n": 1}, {"n": 0}, {"n": 2}, {"n": 0}]
    await cluster.produce(source, [("k", v) for v in values], STR, JSON, partitions=1)
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=STR, value_serde=JSON)
            .map_values(lambda v: v["n"] or b"zero")    # ints, which no serde here can write, but for 0
            .to(sink))
    streams = make_streams(builder.build(), cluster.bootstrap, names.app, num_threads_per_task=2,
                           processing_exception_handler=LogAndContinueProcessingExceptionHandler)
    errors = failures_of(streams)

    async with streams:
        reading = asyncio.ensure_future(cluster.read(sink, 3))
        try:
            await eventually_async(lambda: reading.done() or errors, 45, f"3 records in {sink}")
        finally:
            if not reading.done():
                reading.cancel()
        assert errors == [], f"the client failed: {errors[0]!r}"
        output = reading.result()
        assert streams.state is ClientState.RUNNING

    assert [(STR.deserialize(r.key), r.value) for r in output] == [("k", b"zero")] * 3
