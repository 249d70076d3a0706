"""A pipeline end to end, on the memory broker and on real Kafka (same scenarios)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from streamloop import ClientState, DeserializationError, KafkaStreams, MissingSourceTopicError, StreamsBuilder
from streamloop.handlers import StreamThreadExceptionResponse
from streamloop.serdes import IntegerSerde, JsonSerde, StringSerde
from streamloop.testing import eventually_async
from streamloop.transport.base import ProducerSettings
from tests.support.apps import doubling_topology, expected_doubling, make_streams
from tests.support.cluster import Cluster, by_partition

pytestmark = pytest.mark.asyncio

INT, JSON = IntegerSerde(), JsonSerde()


def decode(records: list) -> list[tuple[int, dict]]:
    return [(INT.deserialize(r.key), JSON.deserialize(r.value)) for r in records]


async def setup_topics(cluster: Cluster, names, partitions: int = 4) -> tuple[str, str]:
    source, sink = names("input"), names("output")
    await cluster.create_topics({source: partitions, sink: partitions})
    return source, sink


async def test_pipeline_end_to_end(cluster: Cluster, names) -> None:
    source, sink = await setup_topics(cluster, names)
    records = [(i, {"n": i}) for i in range(400)]
    await cluster.produce(source, records, INT, JSON, partitions=4)
    expected = expected_doubling(records)
    streams = make_streams(doubling_topology(source, sink), cluster.bootstrap, names.app, num_stream_threads=2)
    async with streams:
        output = decode(await cluster.read(sink, len(expected)))
    assert sorted(output) == sorted(expected)
    assert streams.state is ClientState.NOT_RUNNING


async def test_output_keeps_per_partition_order(cluster: Cluster, names) -> None:
    source, sink = await setup_topics(cluster, names, partitions=2)
    records = [(i % 2, {"n": 2 * i}) for i in range(300)]
    await cluster.produce(source, records, INT, JSON, partitions=2)
    async with make_streams(doubling_topology(source, sink), cluster.bootstrap, names.app):
        output = await cluster.read(sink, len(records))
    # Input partition = key; each key's output lands in one partition, in input order.
    for recs in by_partition(output).values():
        for key in (0, 1):
            values = [JSON.deserialize(r.value)["n"] for r in recs if INT.deserialize(r.key) == key]
            if values:
                assert values == [v["n"] for k, v in records if k == key]
    assert len(output) == len(records)


async def test_two_threads_share_four_partitions(cluster: Cluster, names) -> None:
    source, sink = await setup_topics(cluster, names)
    streams = make_streams(doubling_topology(source, sink), cluster.bootstrap, names.app, num_stream_threads=2)
    async with streams:
        assert await streams.wait_for_state_async(ClientState.RUNNING, timeout=30)
        threads = streams.metadata_for_local_threads()
        assert sorted(t.thread_name for t in threads) == [
            f"{streams.client_id}-StreamThread-1", f"{streams.client_id}-StreamThread-2"]
        tasks = [sorted(str(task.task_id) for task in t.active_tasks) for t in threads]
        assert sorted(len(t) for t in tasks) == [2, 2]
        assert sorted(t for ts in tasks for t in ts) == ["0_0", "0_1", "0_2", "0_3"]


def local_tasks(streams: KafkaStreams) -> set[str]:
    return {str(task.task_id) for t in streams.metadata_for_local_threads() for task in t.active_tasks}


async def test_second_client_takes_half_the_tasks(cluster: Cluster, names) -> None:
    source, sink = await setup_topics(cluster, names)
    records = [(i, {"n": i}) for i in range(200)]
    await cluster.produce(source, records, INT, JSON, partitions=4)
    first = make_streams(doubling_topology(source, sink), cluster.bootstrap, names.app)
    second = make_streams(doubling_topology(source, sink), cluster.bootstrap, names.app)
    async with first:
        await eventually_async(lambda: len(local_tasks(first)) == 4, 30, "first client owns 4 tasks")
        async with second:
            await eventually_async(
                lambda: first.state is ClientState.RUNNING and second.state is ClientState.RUNNING
                and len(local_tasks(first)) == 2 and len(local_tasks(second)) == 2,
                30, "the two clients split the tasks 2/2")
            assert local_tasks(first) | local_tasks(second) == {"0_0", "0_1", "0_2", "0_3"}
            more = [(i, {"n": i}) for i in range(200, 400)]
            await cluster.produce(source, more, INT, JSON, partitions=4)
            expected = expected_doubling(records + more)
            output = decode(await cluster.read(sink, len(expected)))
    assert set(map(repr, expected)) <= set(map(repr, output))


async def test_crash_and_restart_loses_nothing(cluster: Cluster, names) -> None:
    """A thread dies mid-stream (no commit of its last work); a restarted client re-reads from the
    last commit and the output holds every input (duplicates allowed: at-least-once)."""
    source, sink = await setup_topics(cluster, names, partitions=2)
    records = [(i, {"n": 2 * i}) for i in range(600)]
    await cluster.produce(source, records, INT, JSON, partitions=2)
    crashed = {"done": False}

    def crash_once(key: int, value: dict) -> None:
        if value["n"] == 2 * 450 and not crashed["done"]:
            crashed["done"] = True
            raise RuntimeError("simulated crash")

    def topology():
        builder = StreamsBuilder()
        (builder.stream(source, key_serde=INT, value_serde=JSON)
                .peek(crash_once)
                .map_values(lambda v: {"n": v["n"], "double": v["n"] * 2})
                .to(sink, key_serde=INT, value_serde=JSON))
        return builder.build()

    first = make_streams(topology(), cluster.bootstrap, names.app, commit_interval_ms=20)
    await first.start_async()
    assert await first.wait_for_state_async(ClientState.ERROR, timeout=30)
    await first.close_async()
    second = make_streams(topology(), cluster.bootstrap, names.app)
    async with second:
        expected = expected_doubling(records)
        await eventually_async(
            lambda: _contains(cluster, sink, expected), 30, "every input in the output")


async def _contains(cluster: Cluster, sink: str, expected: list) -> bool:
    output = {repr(x) for x in decode(await cluster.read_all(sink))}
    return all(repr(x) in output for x in expected)


async def test_slow_async_processor_in_one_task_does_not_slow_another(cluster: Cluster, names) -> None:
    source, sink = await setup_topics(cluster, names, partitions=2)
    release = threading.Event()  # set by the test, read on the stream thread's loop

    async def slow_on_partition_zero(value: dict) -> dict:
        while value["p"] == 0 and not release.is_set():
            await asyncio.sleep(0.01)  # an I/O wait that outlasts the other partition's whole run
        return value

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .map_values(slow_on_partition_zero)
            .to(sink, key_serde=INT, value_serde=JSON))
    records = [(i, {"p": i % 2, "i": i}) for i in range(400)]
    await cluster.produce(source, records, INT, JSON, partitions=2)
    streams = make_streams(builder.build(), cluster.bootstrap, names.app)
    await streams.start_async()
    try:
        output = await cluster.read(sink, 200, timeout=20)
        assert {JSON.deserialize(r.value)["p"] for r in output} == {1}
        assert not release.is_set()
    finally:
        release.set()
        assert await streams.close_async(timeout=30)


async def test_missing_source_topic_is_a_clear_error(cluster: Cluster, names) -> None:
    builder = StreamsBuilder()
    builder.stream(names("nope"), value_serde=StringSerde()).to(names("nope-out"))
    streams = KafkaStreams(builder.build(), {"application.id": names.app, "bootstrap.servers": cluster.bootstrap})
    with pytest.raises(MissingSourceTopicError, match=names("nope")):
        await streams.start_async()


async def test_unreadable_record_fails_the_thread_naming_topic_partition_offset(cluster: Cluster, names) -> None:
    source, sink = await setup_topics(cluster, names, partitions=1)
    producer = cluster.transport.producer(ProducerSettings("bad-record-producer"))
    await producer.start()
    producer.append(source, 0, INT.serialize(1), b'{"n": 2}', None, ())
    producer.append(source, 0, INT.serialize(2), b"{not json", None, ())
    await producer.flush()
    await producer.close()
    errors: list[BaseException] = []
    streams = make_streams(doubling_topology(source, sink), cluster.bootstrap, names.app)

    def handler(exc: BaseException):
        errors.append(exc)
        return StreamThreadExceptionResponse.SHUTDOWN_CLIENT

    streams.set_uncaught_exception_handler(handler)
    await streams.start_async()
    assert await streams.wait_for_state_async(ClientState.ERROR, timeout=30)
    await streams.close_async()
    assert len(errors) == 1
    error = errors[0]
    assert isinstance(error, DeserializationError)
    assert (error.topic, error.partition, error.offset) == (source, 0, 1)
    assert f"{source}-0 offset 1" in str(error)


async def test_metrics_count_a_known_workload(cluster: Cluster, names) -> None:
    source, sink = await setup_topics(cluster, names, partitions=2)
    records = [(i, {"n": i}) for i in range(100)]
    await cluster.produce(source, records, INT, JSON, partitions=2)
    streams = make_streams(doubling_topology(source, sink), cluster.bootstrap, names.app)
    async with streams:
        await cluster.read(sink, 50)

        def thread_metric(name: str) -> float:
            return sum(m.value for m in streams.metrics() if m.group == "stream-thread-metrics" and m.name == name)

        await eventually_async(lambda: thread_metric("process-total") == 100, 30, "100 records processed")
        await eventually_async(lambda: thread_metric("commit-total") >= 1, 30, "a commit")
        assert thread_metric("records-polled-total") >= 100
        assert thread_metric("poll-total") >= 1
        assert thread_metric("timeout-retries-total") == 0
        per_task = {m.tags["task-id"]: m.value for m in streams.metrics()
                    if m.group == "stream-task-metrics" and m.name == "records-processed-total"}
        assert per_task == {"0_0": 50, "0_1": 50}
        assert streams.metric("alive-stream-threads") == 1
