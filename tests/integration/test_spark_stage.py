"""Spark stages with real Spark (the session's local SparkSession) and the real Kafka broker:
batches run off the loop, offsets are committed only after a batch's output is handed on,
batches in flight are bounded, and failures and timeouts take the task's error paths."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from streamloop import ClientState, KafkaStreams, StreamsBuilder
from streamloop.errors import SparkBatchError, TaskTimeoutError
from streamloop.handlers import LogAndContinueProcessingExceptionHandler, StreamThreadExceptionResponse
from streamloop.records import TopicPartition
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.testing import eventually_async
from streamloop.transport import open_transport
from tests.support.apps import streams_config
from tests.support.cluster import Cluster, committed_offset

pytestmark = [pytest.mark.asyncio, pytest.mark.kafka]

INT, JSON = IntegerSerde(), JsonSerde()
WAIT = 60


@pytest.fixture
def kafka(kafka_bootstrap: str, spark: Any) -> Cluster:
    return Cluster(open_transport({"bootstrap.servers": kafka_bootstrap}), kafka_bootstrap)


def make_client(builder: StreamsBuilder, kafka: Cluster, app: str, **overrides: Any) -> KafkaStreams:
    settings = {"spark.batch.max.wait.ms": 100, **{k.replace("_", "."): v for k, v in overrides.items()}}
    return KafkaStreams(builder.build(), {**streams_config(kafka.bootstrap, app), **settings})


async def committed(kafka: Cluster, app: str, topic: str, partition: int) -> int | None:
    return await committed_offset(kafka, app, TopicPartition(topic, partition))


async def produce(kafka: Cluster, names: Any, count: int, partitions: int = 2) -> tuple[str, str]:
    source, sink = names("in"), names("out")
    await kafka.create_topics({source: partitions, sink: 1})
    # Key i % partitions: record i goes to partition i % partitions.
    await kafka.produce(source, [(i % partitions, {"i": i, "p": i % partitions}) for i in range(count)],
                        INT, JSON, partitions=partitions)
    return source, sink


def values(records: list[Any]) -> list[dict[str, Any]]:
    return [JSON.deserialize(r.value) for r in records]


async def test_a_batch_enriches_records_by_a_join_and_its_rows_flow_downstream(kafka: Cluster, names, spark) -> None:
    source, sink = await produce(kafka, names, 40)
    tiers = spark.createDataFrame([(0, "gold"), (1, "silver")], ["p", "tier"])
    sizes: list[int] = []

    def enrich(frame: Any) -> Any:
        sizes.append(frame.count())
        return frame.join(tiers, "p").select("key", "i", "tier", (frame.i * 10).alias("i10"))

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .spark_batch(enrich, max_records=10, value_columns=["i", "tier", "i10"])
            .to(sink, key_serde=INT, value_serde=JSON))
    async with make_client(builder, kafka, names.app):
        output = await kafka.read(sink, 40, timeout=WAIT)
        for p in (0, 1):
            await eventually_async(lambda p=p: _is(committed(kafka, names.app, source, p), 20), WAIT,
                                   f"partition {p} committed to its end")
    assert sorted(values(output), key=lambda v: v["i"]) == [
        {"i": i, "tier": "gold" if i % 2 == 0 else "silver", "i10": i * 10} for i in range(40)]
    assert {INT.deserialize(r.key) for r in output} == {0, 1}
    assert max(sizes) == 10  # batches were cut at max_records


async def test_a_slow_batch_holds_back_only_its_task_and_its_offsets(kafka: Cluster, names) -> None:
    source, sink = await produce(kafka, names, 40)
    release = threading.Event()
    on_worker: list[str] = []

    def slow_on_partition_0(frame: Any) -> Any:
        on_worker.append(threading.current_thread().name)
        if frame.filter(frame.p == 0).limit(1).count():
            release.wait(WAIT)
        return frame

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .spark_batch(slow_on_partition_0, max_records=5)
            .to(sink, key_serde=INT, value_serde=JSON))
    streams = make_client(builder, kafka, names.app, num_stream_threads=1)
    async with streams:
        try:
            # One stream thread owns both tasks: partition 1's flows through and is committed
            # while partition 0's first batch is stuck on its worker thread.
            first = await kafka.read(sink, 20, timeout=WAIT)
            assert {v["p"] for v in values(first)} == {1}
            await eventually_async(lambda: _is(committed(kafka, names.app, source, 1), 20), WAIT,
                                   "partition 1 committed to its end")
            assert await committed(kafka, names.app, source, 0) in (None, 0)
            assert streams.state is ClientState.RUNNING
        finally:
            release.set()
        output = await kafka.read(sink, 40, timeout=WAIT)
        await eventually_async(lambda: _is(committed(kafka, names.app, source, 0), 20), WAIT,
                               "partition 0 committed once its batches are out")
    assert sorted(v["i"] for v in values(output)) == list(range(40))
    assert not any("StreamThread" in name for name in on_worker)  # never on a stream thread


async def test_a_failing_batch_goes_to_the_uncaught_handler_and_a_restart_redoes_it(kafka: Cluster, names) -> None:
    source, sink = await produce(kafka, names, 20, partitions=1)
    crash = threading.Event()
    crash.set()

    def fails_once_past_10(frame: Any) -> Any:
        if crash.is_set() and frame.filter(frame.i >= 10).limit(1).count():
            raise ValueError("the cluster lost an executor")
        return frame

    def topology() -> StreamsBuilder:
        builder = StreamsBuilder()
        (builder.stream(source, key_serde=INT, value_serde=JSON)
                .spark_batch(fails_once_past_10, max_records=10)
                .to(sink, key_serde=INT, value_serde=JSON))
        return builder

    seen: list[BaseException] = []
    first = make_client(topology(), kafka, names.app)
    first.set_uncaught_exception_handler(
        lambda exc: seen.append(exc) or StreamThreadExceptionResponse.SHUTDOWN_CLIENT)
    await first.start_async()
    try:
        assert await first.wait_for_state_async(ClientState.ERROR, timeout=WAIT)
    finally:
        await first.close_async()
    assert isinstance(seen[0].__cause__, SparkBatchError)
    assert isinstance(seen[0].__cause__.__cause__, ValueError)
    # The first batch was out before the second failed; nothing of the second is committed.
    assert await committed(kafka, names.app, source, 0) in (None, 0, 10)

    crash.clear()
    async with make_client(topology(), kafka, names.app):
        await eventually_async(lambda: _is(committed(kafka, names.app, source, 0), 20), WAIT, "all committed")
    assert set(v["i"] for v in values(await kafka.read_all(sink))) == set(range(20))  # nothing lost


async def test_a_failing_batch_asks_the_processing_handler_for_each_record(kafka: Cluster, names) -> None:
    source, sink = await produce(kafka, names, 20, partitions=1)

    def fails_below_10(frame: Any) -> Any:
        if frame.filter(frame.i < 10).limit(1).count():
            raise ValueError("bad batch")
        return frame

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .spark_batch(fails_below_10, max_records=10)
            .to(sink, key_serde=INT, value_serde=JSON))
    streams = make_client(builder, kafka, names.app,
                          processing_exception_handler=LogAndContinueProcessingExceptionHandler)
    async with streams:
        output = await kafka.read(sink, 10, timeout=WAIT)
        await eventually_async(lambda: _is(committed(kafka, names.app, source, 0), 20), WAIT, "all committed")
        dropped = [m.value for m in streams.metrics()
                   if m.name == "dropped-records-total" and m.group == "stream-thread-metrics"]
    assert sorted(v["i"] for v in values(output)) == list(range(10, 20))
    assert dropped == [10.0]


async def test_batches_in_flight_are_bounded_per_task(kafka: Cluster, names) -> None:
    source, sink = await produce(kafka, names, 60, partitions=1)
    release = threading.Event()
    running: list[int] = []
    entered: list[int] = []

    def blocked(frame: Any) -> Any:
        running.append(1)
        release.wait(WAIT)
        return frame

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .peek(lambda key, value: entered.append(value["i"]))
            .spark_batch(blocked, max_records=5, max_batches_in_flight=2)
            .to(sink, key_serde=INT, value_serde=JSON))
    streams = make_client(builder, kafka, names.app)
    async with streams:
        try:
            await eventually_async(lambda: len(running) == 2, WAIT, "two batches running")
            await eventually_async(lambda: thread_total(streams, "records-polled-total") >= 60, WAIT,
                                   "every record fetched")
            # Two full batches of 5 are running: the task takes no more records in.
            assert len(running) == 2
            assert sorted(entered) == list(range(10))
        finally:
            release.set()
        output = await kafka.read(sink, 60, timeout=WAIT)
    assert sorted(v["i"] for v in values(output)) == list(range(60))


async def test_a_batch_past_its_timeout_is_retried_until_task_timeout_ms(kafka: Cluster, names) -> None:
    source, sink = await produce(kafka, names, 4, partitions=1)
    release = threading.Event()
    attempts: list[int] = []

    def never_done(frame: Any) -> Any:
        attempts.append(1)
        release.wait(WAIT)
        return frame

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .spark_batch(never_done, max_records=4)
            .to(sink, key_serde=INT, value_serde=JSON))
    seen: list[BaseException] = []
    streams = make_client(builder, kafka, names.app, spark_batch_timeout_ms=200, task_timeout_ms=1_500,
                          retry_backoff_ms=50, retry_backoff_max_ms=100)
    streams.set_uncaught_exception_handler(
        lambda exc: seen.append(exc) or StreamThreadExceptionResponse.SHUTDOWN_CLIENT)
    await streams.start_async()
    try:
        assert await streams.wait_for_state_async(ClientState.ERROR, timeout=WAIT)
    finally:
        release.set()
        await streams.close_async()
    assert isinstance(seen[0], TaskTimeoutError)
    assert len(attempts) >= 2  # retried before task.timeout.ms ran out
    assert await committed(kafka, names.app, source, 0) in (None, 0)


async def test_a_batch_past_its_timeout_has_its_spark_job_cancelled_and_the_retry_goes_through(
        kafka: Cluster, names, spark) -> None:
    source, sink = await produce(kafka, names, 4, partitions=1)
    attempts: list[float] = []

    def slow_job_first_time(frame: Any) -> Any:
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            # A Spark job that would run for a minute on the executors, unless cancelled.
            frame.rdd.map(lambda row: time.sleep(60) or row).count()
        return frame

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .spark_batch(slow_job_first_time, max_records=4)
            .to(sink, key_serde=INT, value_serde=JSON))
    streams = make_client(builder, kafka, names.app, spark_batch_timeout_ms=3_000, task_timeout_ms=120_000,
                          retry_backoff_ms=50, retry_backoff_max_ms=100)
    async with streams:
        output = await kafka.read(sink, 4, timeout=WAIT)
        await eventually_async(lambda: not spark.sparkContext.statusTracker().getActiveJobsIds(), WAIT,
                               "the timed-out job cancelled")
        retries = thread_total(streams, "timeout-retries-total")
    assert sorted(v["i"] for v in values(output)) == list(range(4))
    assert retries >= 1
    assert attempts[1] - attempts[0] < 30  # retried after the timeout, not after the job's minute


async def test_close_waits_for_a_running_batch_and_commits_it(kafka: Cluster, names) -> None:
    source, sink = await produce(kafka, names, 10, partitions=1)
    release, started = threading.Event(), threading.Event()

    def slow(frame: Any) -> Any:
        started.set()
        release.wait(WAIT)
        return frame

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .spark_batch(slow, max_records=10)
            .to(sink, key_serde=INT, value_serde=JSON))
    # request.timeout.ms bounds the wait of a closing task: ample here, the batch is released at once.
    streams = make_client(builder, kafka, names.app, request_timeout_ms=WAIT * 1000)
    await streams.start_async()
    try:
        await eventually_async(started.is_set, WAIT, "the batch running")
        closing = asyncio.create_task(streams.close_async())
        await eventually_async(lambda: streams.state is ClientState.PENDING_SHUTDOWN, WAIT, "closing")
        assert not closing.done()
    finally:
        release.set()
    assert await asyncio.wait_for(closing, WAIT)
    assert sorted(v["i"] for v in values(await kafka.read(sink, 10, timeout=WAIT))) == list(range(10))
    assert await committed(kafka, names.app, source, 0) == 10


async def test_close_gives_up_on_a_batch_stuck_past_the_close_timeout_and_commits_only_what_finished(
        kafka: Cluster, names) -> None:
    source, sink = await produce(kafka, names, 10, partitions=1)
    release = threading.Event()

    def stuck_from_5(frame: Any) -> Any:
        if frame.filter(frame.i >= 5).limit(1).count():
            release.wait(WAIT)
        return frame

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .spark_batch(stuck_from_5, max_records=5)
            .to(sink, key_serde=INT, value_serde=JSON))
    streams = make_client(builder, kafka, names.app, request_timeout_ms=3_000)
    await streams.start_async()
    try:
        await eventually_async(lambda: _is(committed(kafka, names.app, source, 0), 5), WAIT,
                               "the first batch committed")
        assert await streams.close_async(timeout=WAIT)  # returns although the second batch never ends
    finally:
        release.set()
    assert await committed(kafka, names.app, source, 0) == 5
    assert sorted(v["i"] for v in values(await kafka.read_all(sink))) == list(range(5))


@pytest.mark.parametrize("shared_max_ms", [10_000, 1])
async def test_the_spark_sink_writes_parquet_before_offsets_are_committed(kafka: Cluster, names, spark,
                                                                           tmp_path, shared_max_ms: int) -> None:
    """With ``spark.batch.shared.max.ms`` 1, every job the two tasks share runs past it: a Spark sink's
    job, which writes as it runs, is not given up then (its write would land beside each part's own)."""
    source, _sink = await produce(kafka, names, 30)
    path = str(tmp_path / "lake")
    builder = StreamsBuilder()
    builder.stream(source, key_serde=INT, value_serde=JSON).to_spark(path, max_records=10)
    async with make_client(builder, kafka, names.app, spark_batch_shared_max_ms=shared_max_ms):
        for p in (0, 1):
            await eventually_async(lambda p=p: _is(committed(kafka, names.app, source, p), 15), WAIT,
                                   f"partition {p} committed")
    rows = spark.read.parquet(path).collect()
    assert sorted(row["i"] for row in rows) == list(range(30))
    assert {row["key"] for row in rows} == {0, 1}


def thread_total(streams: KafkaStreams, name: str) -> float:
    return sum(m.value for m in streams.metrics() if m.name == name and m.group == "stream-thread-metrics")


async def _is(value: Any, expected: Any) -> bool:
    return (await value) == expected


async def test_a_failing_batch_paused_by_the_handler_pauses_at_its_first_record(kafka: Cluster, names) -> None:
    from streamloop.handlers import LogAndPauseProcessingExceptionHandler

    source, sink = await produce(kafka, names, 20, partitions=1)
    failing, earlier_done = threading.Event(), threading.Event()
    failing.set()

    def fails_on_5(frame: Any) -> Any:
        if failing.is_set() and frame.filter(frame.i == 5).limit(1).count():
            raise ValueError("bad batch")
        if frame.filter(frame.i < 5).limit(1).count():
            earlier_done.wait(WAIT)  # the batch before the failing one is still running at the pause
        return frame

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .spark_batch(fails_on_5, max_records=5, max_wait_ms=5_000)
            .to(sink, key_serde=INT, value_serde=JSON))
    streams = make_client(builder, kafka, names.app, processing_exception_handler=LogAndPauseProcessingExceptionHandler)
    async with streams:
        try:
            await eventually_async(lambda: streams.paused_local_tasks(), WAIT, "the task paused")
            # Nothing was done before the pause, so the first commit is the one the pause asked for;
            # records 0..4 are still in flight: it must not pass them.
            await eventually_async(lambda: thread_total(streams, "commit-total") >= 1, WAIT, "the pause's commit")
            assert await committed(kafka, names.app, source, 0) in (None, 0)
        finally:
            earlier_done.set()
        await eventually_async(lambda: _is(committed(kafka, names.app, source, 0), 5), WAIT,
                               "a commit at the failed batch's first record")
        assert sorted(v["i"] for v in values(await kafka.read_all(sink))) == list(range(5))
        failing.clear()
        assert await streams.resume_async("0_0")
        output = await kafka.read(sink, 20, timeout=WAIT)
        await eventually_async(lambda: _is(committed(kafka, names.app, source, 0), 20), WAIT, "all committed")
    assert sorted(v["i"] for v in values(output)) == list(range(20))
