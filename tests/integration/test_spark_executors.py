"""``read="executors"`` (``streamloop.tasks.bulk_exec``, ``streamloop.spark.kafka_source``) on Kafka with the
session's local Spark: the executors read each task's offset ranges themselves and the output is
what the driver path gives for the same input; records that do not decode or fit reach the
handlers; the input is committed to its end only once the output was handed on (or, for a
direct sink, written and acknowledged by the executors themselves), and the records never pass
through this process."""

from __future__ import annotations

import sys
from typing import Any, ClassVar

import pytest

from streamloop import ClientState, KafkaStreams, StreamsBuilder
from streamloop.collector import RecordCollector
from streamloop.errors import SparkSchemaError
from streamloop.handlers import DeserializationHandlerResponse, ProcessingHandlerResponse, StreamThreadExceptionResponse
from streamloop.records import TopicPartition
from streamloop.serdes import BytesSerde, IntegerSerde, JsonSerde
from streamloop.spark.stage import SparkBatchStage
from streamloop.tasks import bulk_exec
from streamloop.testing import eventually_async
from tests.support.apps import streams_config
from tests.support.cluster import Cluster, committed_offset

tests_module = sys.modules[__name__]

pytestmark = [pytest.mark.asyncio, pytest.mark.kafka]

INT, JSON = IntegerSerde(), JsonSerde()
# The first range of a session starts Spark's Python workers and their Kafka clients: under make test's
# load that took 57 s once (the ranges all done, the deadline of 60 s reached as the last committed).
WAIT = 120
SCHEMA = "key long, amount long, customer string"


@pytest.fixture
def bootstrap(kafka_bootstrap: str) -> str:
    return kafka_bootstrap  # the executors read from a real broker only


def make_client(builder: StreamsBuilder, cluster: Cluster, app: str, **overrides: Any) -> KafkaStreams:
    settings = {"spark.batch.max.wait.ms": 100, **{k.replace("_", "."): v for k, v in overrides.items()}}
    return KafkaStreams(builder.build(), {**streams_config(cluster.bootstrap, app), **settings})


async def _committed_to(cluster: Cluster, app: str, topic: str, partitions: int, end: int) -> bool:
    for p in range(partitions):
        if await committed_offset(cluster, app, TopicPartition(topic, p)) != end:
            return False
    return True


def big_spenders(frame: Any) -> Any:
    from pyspark.sql import functions as F

    # Narrow: the rows stay in the frame's (offset) order.
    return frame.where(F.col("amount") % 3 != 0).withColumn("tier", F.concat(F.lit("t-"), F.col("customer")))


@pytest.fixture
def executor_windows(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The executors' windows the tasks chose, and a driver path that fails if a record reaches it."""
    chosen: list[Any] = []
    original = bulk_exec.ExecutorWindow.__init__

    def spy(self: Any, *args: Any) -> None:
        original(self, *args)
        chosen.append(self)

    monkeypatch.setattr(bulk_exec.ExecutorWindow, "__init__", spy)
    return chosen


async def run_pipeline(cluster: Cluster, app: str, source: str, sink: str, read: str, expected: int,
                       partitions: int, end: int, rows_back: bool = False,
                       **settings: Any) -> list[tuple[int, dict[str, Any]]]:
    builder = StreamsBuilder()
    stage = (builder.stream(source, key_serde=INT, value_serde=JSON)
                    .spark_batch(big_spenders, schema=SCHEMA, max_records=40, read=read))
    if rows_back:  # a processor between the stage and its sink: the rows come back to this process
        stage = stage.map_values(lambda value: value)
    stage.to(sink, key_serde=INT, value_serde=JSON)
    async with make_client(builder, cluster, app, **settings):
        await eventually_async(lambda: _committed_to(cluster, app, source, partitions, end), WAIT,
                               f"{source} committed to its end by {read}")
        output = await cluster.read(sink, expected, timeout=WAIT)
    return [(INT.deserialize(r.key), JSON.deserialize(r.value)) for r in output]


async def test_the_executors_give_the_driver_paths_output_and_no_record_passes_through_the_driver(
        cluster: Cluster, names: Any, spark: Any, executor_windows: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    source, by_driver, by_executors = names("in"), names("driver"), names("executors")
    await cluster.create_topics({source: 2, by_driver: 1, by_executors: 1})
    await cluster.produce(source, [(i, {"amount": i, "customer": f"c{i % 7}", "extra": i}) for i in range(150)],
                          INT, JSON, partitions=2)
    expected = sum(1 for i in range(150) if i % 3)
    driver = await run_pipeline(cluster, names.app + "-d", source, by_driver, "driver", expected, 2, 75)
    assert not executor_windows

    def no_driver_batches(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a record reached the driver path")

    monkeypatch.setattr(SparkBatchStage, "run_fetched", no_driver_batches)
    monkeypatch.setattr(SparkBatchStage, "run_parts", no_driver_batches)
    executors = await run_pipeline(cluster, names.app + "-e", source, by_executors, "executors", expected, 2, 75,
                                   rows_back=True)
    assert len(executor_windows) == 2 and sum(w.ranges for w in executor_windows) >= 4  # 75 records, 40 a range
    assert all(not w._task.input.buffered() for w in executor_windows)
    assert all(w.sink is None for w in executor_windows)  # a processor after the stage: the rows came back
    # Same rows; per partition in offset order on both paths (partitions interleave differently).
    for p in range(2):
        assert [v for k, v in executors if k % 2 == p] == [v for k, v in driver if k % 2 == p]
    assert sorted(v["amount"] for _k, v in executors) == [i for i in range(150) if i % 3]
    assert executors[0][1]["tier"].startswith("t-") and "extra" not in executors[0][1]


async def test_a_direct_sink_is_written_by_the_executors_as_the_driver_would_write_it(
        cluster: Cluster, names: Any, spark: Any, executor_windows: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The stage's only child is a sink: the executors write the topic themselves, with the
    driver path's partitions (murmur2 of the key bytes), timestamps, keys and values, and the
    input is committed to its end only after those writes; no row comes back to this process."""
    source, by_driver, by_executors = names("in"), names("driver"), names("executors")
    await cluster.create_topics({source: 2, by_driver: 3, by_executors: 3})
    await cluster.produce(source, [(i, {"amount": i, "customer": f"c{i % 7}"}) for i in range(150)], INT, JSON,
                          partitions=2)
    expected = sum(1 for i in range(150) if i % 3)
    await run_pipeline(cluster, names.app + "-d", source, by_driver, "driver", expected, 2, 75)
    driver = _written(await cluster.read_all(by_driver))
    monkeypatch.setattr(RecordCollector, "send_serialized", _refused)
    await run_pipeline(cluster, names.app + "-e", source, by_executors, "executors", expected, 2, 75)
    assert len(executor_windows) == 2 and all(w.sink is not None for w in executor_windows)
    executors = _written(await cluster.read_all(by_executors))
    assert sorted(executors) == sorted(driver) == [0, 1, 2]
    # Each output record carries the timestamp of its batch's carrier, an input record: batches
    # (and so carriers) are cut by timing on the driver path, so timestamps are compared only so.
    stamps = {r.timestamp for r in await cluster.read_all(source)}
    for p, records in driver.items():
        assert {t for t, _k, _v in executors[p]} <= stamps
        # A key comes from one source partition, so each key's records keep their order on both
        # paths; the two source partitions' ranges interleave differently.
        assert sorted((k, v) for _t, k, v in executors[p]) == sorted((k, v) for _t, k, v in records)
        for key in {k for _t, k, _v in records}:
            assert [v for _t, k, v in executors[p] if k == key] == [v for _t, k, v in records if k == key]


def _written(records: list[Any]) -> dict[int, list[tuple[int, bytes | None, bytes | None]]]:
    by_partition: dict[int, list[tuple[int, bytes | None, bytes | None]]] = {}
    for r in records:
        by_partition.setdefault(r.partition, []).append((r.timestamp, r.key, r.value))
    return by_partition


def _refused(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a row of a direct sink's output came back to this process")


class Asked:
    """Handlers that CONTINUE and keep what they were asked about."""

    asked: ClassVar[list[tuple[str, int, BaseException]]] = []

    def configure(self, config: Any) -> None:
        pass


class ContinueOnBadBytes(Asked):
    def handle(self, context: Any, record: Any, exception: BaseException) -> DeserializationHandlerResponse:
        Asked.asked.append(("deserialization", record.offset, exception))
        return DeserializationHandlerResponse.CONTINUE


class ContinueOnMisfits(Asked):
    def handle(self, context: Any, record: Any, exception: BaseException) -> ProcessingHandlerResponse:
        Asked.asked.append(("processing", context.offset, exception))
        return ProcessingHandlerResponse.CONTINUE


async def test_records_that_do_not_decode_or_fit_reach_the_handlers_in_offset_order(
        cluster: Cluster, names: Any, spark: Any, executor_windows: list[Any]) -> None:
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    values = [JSON.serialize({"amount": i, "customer": f"c{i}"}) for i in range(12)]
    values[3] = b"{not json"                                           # fails to decode
    values[5] = JSON.serialize({"amount": "lots", "customer": "c5"})   # does not fit bigint
    await cluster.produce(source, list(enumerate(values)), INT, BytesSerde(), partitions=1)
    Asked.asked = []
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .spark_batch(lambda frame: frame, schema=SCHEMA, max_records=100, read="executors")
            .to(sink, key_serde=INT, value_serde=JSON))
    async with make_client(builder, cluster, names.app, default_deserialization_exception_handler=ContinueOnBadBytes,
                           processing_exception_handler=ContinueOnMisfits):
        output = [JSON.deserialize(r.value) for r in await cluster.read(sink, 10, timeout=WAIT)]
        await eventually_async(lambda: _committed_to(cluster, names.app, source, 1, 12), WAIT, "all committed")
    assert [v["amount"] for v in output] == [0, 1, 2, 4, 6, 7, 8, 9, 10, 11]
    assert [(kind, offset) for kind, offset, _e in Asked.asked] == [("deserialization", 3), ("processing", 5)]
    assert isinstance(Asked.asked[0][2], ValueError)  # the serde's own error, brought back from the executor
    misfit = Asked.asked[1][2]
    assert isinstance(misfit, SparkSchemaError) and (misfit.field, misfit.found) == ("amount", "str")
    assert len(executor_windows) == 1 and executor_windows[0].sink is not None  # the executors wrote it


def pass_through(source: str, sink: str) -> StreamsBuilder:
    """The rows as they came, in ranges of 20, to a direct sink: the executors write them."""
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .spark_batch(lambda frame: frame, schema=SCHEMA, max_records=20, read="executors")
            .to(sink, key_serde=INT, value_serde=JSON))
    return builder


async def produce_with_bad_bytes(cluster: Cluster, source: str, count: int, *bad: int) -> None:
    """``count`` orders to partition 0 of ``source``, those at the ``bad`` offsets bytes that do not decode."""
    values = [JSON.serialize({"amount": i, "customer": "c"}) for i in range(count)]
    for offset in bad:
        values[offset] = b"\xff"
    await cluster.produce(source, list(enumerate(values)), INT, BytesSerde(), partitions=1)


def _persisted(spark: Any) -> int:
    """Persisted RDDs of the session's context (a frame the engine persisted and did not let go of)."""
    return int(spark.sparkContext._jsc.getPersistentRDDs().size())


class PauseOnBadBytes(Asked):
    def handle(self, context: Any, record: Any, exception: BaseException) -> DeserializationHandlerResponse:
        Asked.asked.append(("deserialization", record.offset, exception))
        return DeserializationHandlerResponse.PAUSE


async def test_the_next_range_is_read_while_one_is_written_and_a_pause_drops_what_was_read_ahead(
        cluster: Cluster, names: Any, spark: Any, executor_windows: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A range's read job runs while the range before it is written (so a cycle costs about one job,
    not two); a handler that PAUSEs in a range drops the range read ahead of it, and the resume reads
    on from the paused record, nothing past it written before."""
    import threading

    from streamloop.tasks import exec_work

    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    await produce_with_bad_bytes(cluster, source, 80, 45)
    reads, writes = exec_work.RangeWork.read_ranges, exec_work.RangeWork.write_ranges
    discard = bulk_exec.ExecutorWindow._discard
    read_started: dict[int, threading.Event] = {}
    seen_during_first_write: list[bool] = []
    written: list[int] = []
    dropped = threading.Event()
    before = _persisted(spark)

    def spy_read(self: Any, ranges: Any, tag: str) -> Any:
        read_started.setdefault(ranges[0].start, threading.Event()).set()
        if ranges[0].start == 60:  # the read ahead of the paused range: its job starts once it was dropped
            dropped.wait(WAIT)
        return reads(self, ranges, tag)

    async def spy_discard(self: Any, ahead: Any) -> None:
        await discard(self, ahead)
        dropped.set()

    def spy_write(self: Any, frame: Any, ranges: Any, leaving: Any, *args: Any) -> Any:
        start = ranges[leaving[0]].start
        if start == 0:  # the second range's read starts while the first is written (30 s: a cold session's read)
            seen_during_first_write.append(read_started.setdefault(20, threading.Event()).wait(30))
        written.append(start)
        return writes(self, frame, ranges, leaving, *args)

    monkeypatch.setattr(exec_work.RangeWork, "read_ranges", spy_read)
    monkeypatch.setattr(exec_work.RangeWork, "write_ranges", spy_write)
    monkeypatch.setattr(bulk_exec.ExecutorWindow, "_discard", spy_discard)
    Asked.asked = []
    builder = pass_through(source, sink)
    async with make_client(builder, cluster, names.app, default_deserialization_exception_handler=PauseOnBadBytes) \
            as client:
        await eventually_async(lambda: bool(client.paused_local_tasks()), WAIT, "the task paused at offset 45")
        # The paused range's output leaves with its records before the paused one (carrier 44).
        await eventually_async(lambda: _committed_to(cluster, names.app, source, 1, 45), WAIT, "committed to 45")
        assert 60 in read_started  # the range after the paused one had been read ahead...
        (paused,) = client.paused_local_tasks()
        assert await client.resume_async(paused.task_id, skip=True)
        await eventually_async(lambda: _committed_to(cluster, names.app, source, 1, 80), WAIT, "all committed")
    assert seen_during_first_write == [True]
    assert written == [0, 20, 40, 46, 66]  # ...and dropped: read on from 46 after the resume
    assert [(kind, offset) for kind, offset, _e in Asked.asked] == [("deserialization", 45)]
    keys = sorted({INT.deserialize(r.key) for r in await cluster.read_all(sink)})
    assert keys == [k for k in range(80) if k != 45]
    # The dropped read's job ran after its cancel (it had not started): what it persisted is let go of.
    await eventually_async(lambda: _persisted(spark) == before, WAIT, "the dropped read's frame unpersisted")


async def test_a_read_that_runs_past_the_timeout_is_retried_with_half_its_offsets(
        cluster: Cluster, names: Any, spark: Any, executor_windows: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A range too big for the cluster's pace (its read runs past ``spark.batch.timeout.ms``) is
    retried with half its offsets, not whole until ``task.timeout.ms`` fails the task; the ranges
    read cover the input once, in order, and every record is written and committed."""
    from streamloop.errors import SparkBatchTimeoutError
    from streamloop.tasks import exec_work

    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    await cluster.produce(source, [(i, {"amount": i, "customer": "c"}) for i in range(40)], INT, JSON, partitions=1)
    reads = exec_work.RangeWork.read_ranges
    asked: list[tuple[int, int]] = []
    read: list[tuple[int, int]] = []

    def slow_past_ten(self: Any, ranges: Any, tag: str) -> Any:
        (kafka_range,) = ranges
        asked.append((kafka_range.start, kafka_range.end))
        if kafka_range.size > 10:  # what off_loop raises when a job runs past spark.batch.timeout.ms
            raise SparkBatchTimeoutError("slow", kafka_range.size, 120_000)
        read.append((kafka_range.start, kafka_range.end))
        return reads(self, ranges, tag)

    monkeypatch.setattr(exec_work.RangeWork, "read_ranges", slow_past_ten)
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .spark_batch(lambda frame: frame, schema=SCHEMA, max_records=40, read="executors")
            .to(sink, key_serde=INT, value_serde=JSON))
    async with make_client(builder, cluster, names.app, task_timeout_ms=60_000, retry_backoff_ms=50) as client:
        await eventually_async(lambda: _committed_to(cluster, names.app, source, 1, 40), WAIT, "all committed")
        assert client.state is ClientState.RUNNING
    assert asked[:3] == [(0, 40), (0, 20), (0, 10)]
    # Read once each, in order (doubling back after a fast range: a range of 20 is asked again, then cut).
    assert [start for start, _end in read] == [0, *[end for _start, end in read][:-1]] and read[-1][1] == 40
    keys = sorted(INT.deserialize(r.key) for r in await cluster.read_all(sink))
    assert keys == list(range(40))


async def test_a_resume_reads_every_record_past_the_pause_when_the_next_range_is_cut(
        cluster: Cluster, names: Any, spark: Any, executor_windows: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A range that paused at its first record, resumed past it: the range after the resume is cut
    (its read timed out), and the position moves to the cut range's end, not to the end of the
    range that paused (offsets 31-39 were neither read nor written, and were committed, once)."""
    from streamloop.errors import SparkBatchTimeoutError
    from streamloop.tasks import exec_work

    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    await produce_with_bad_bytes(cluster, source, 60, 20)
    reads = exec_work.RangeWork.read_ranges

    def slow_after_the_pause(self: Any, ranges: Any, tag: str) -> Any:
        (kafka_range,) = ranges
        if kafka_range.start == 21 and kafka_range.size > 10:  # as off_loop raises past spark.batch.timeout.ms
            raise SparkBatchTimeoutError("slow", kafka_range.size, 120_000)
        return reads(self, ranges, tag)

    monkeypatch.setattr(exec_work.RangeWork, "read_ranges", slow_after_the_pause)
    Asked.asked = []
    builder = pass_through(source, sink)
    async with make_client(builder, cluster, names.app, default_deserialization_exception_handler=PauseOnBadBytes,
                           task_timeout_ms=60_000, retry_backoff_ms=50) as client:
        await eventually_async(lambda: bool(client.paused_local_tasks()), WAIT, "the task paused at offset 20")
        (paused,) = client.paused_local_tasks()
        assert await client.resume_async(paused.task_id, skip=True)
        await eventually_async(lambda: _committed_to(cluster, names.app, source, 1, 60), WAIT, "all committed")
        await cluster.read(sink, 59, timeout=WAIT)
    assert [(kind, offset) for kind, offset, _e in Asked.asked] == [("deserialization", 20)]
    keys = sorted({INT.deserialize(r.key) for r in await cluster.read_all(sink)})
    assert keys == [k for k in range(60) if k != 20]


async def test_a_resume_while_the_paused_range_is_written_still_asks_about_the_records_past_the_pause(
        cluster: Cluster, names: Any, spark: Any, executor_windows: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A range's output is written after its handler said PAUSE (it leaves with the record below the
    paused one); a resume during that write moves the position past the paused record, not to the
    range's end: a bad record above the pause in the same range still reaches the handler."""
    import threading

    from streamloop.tasks import exec_work

    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    await produce_with_bad_bytes(cluster, source, 80, 45, 50)
    writes = exec_work.RangeWork.write_ranges
    resumed = threading.Event()
    waited: list[bool] = []

    def held_after_the_pause(self: Any, frame: Any, ranges: Any, leaving: Any, *args: Any) -> Any:
        if ranges[leaving[0]].start == 40:  # written after the PAUSE at 45: until the resume
            waited.append(resumed.wait(WAIT))
        return writes(self, frame, ranges, leaving, *args)

    monkeypatch.setattr(exec_work.RangeWork, "write_ranges", held_after_the_pause)
    Asked.asked = []
    builder = pass_through(source, sink)
    async with make_client(builder, cluster, names.app, default_deserialization_exception_handler=PauseOnBadBytes) \
            as client:
        try:
            await eventually_async(lambda: bool(client.paused_local_tasks()), WAIT, "the task paused at offset 45")
            (paused,) = client.paused_local_tasks()
            assert await client.resume_async(paused.task_id, skip=True)
        finally:
            resumed.set()
        await eventually_async(lambda: len(Asked.asked) == 2 and bool(client.paused_local_tasks()), WAIT,
                               "the task paused at offset 50")
        assert await client.resume_async(paused.task_id, skip=True)
        await eventually_async(lambda: _committed_to(cluster, names.app, source, 1, 80), WAIT, "all committed")
    assert waited == [True]
    assert [(kind, offset) for kind, offset, _e in Asked.asked] == [("deserialization", 45), ("deserialization", 50)]
    keys = sorted({INT.deserialize(r.key) for r in await cluster.read_all(sink)})
    assert keys == [k for k in range(80) if k not in (45, 50)]


async def test_a_range_read_is_let_go_of_when_the_loop_fails_before_it_is_written(
        cluster: Cluster, names: Any, spark: Any, executor_windows: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Between a range's read and its handlers the loop looks for the next range (the broker's end
    offset): when that fails, the read range's persisted frame is unpersisted, not left cached."""
    import dataclasses

    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    await cluster.produce(source, [(i, {"amount": i, "customer": "c"}) for i in range(20)], INT, JSON, partitions=1)
    before = _persisted(spark)
    calls: list[int] = []
    original = bulk_exec.ExecutorWindow.__init__

    def failing_second_end_offsets(self: Any, task: Any, tp: Any, source: Any, node: Any, stage: Any, reads: Any,
                                   *args: Any) -> None:
        async def end_offsets(partitions: Any) -> Any:
            calls.append(len(calls))
            if len(calls) == 2:  # after the first range's read, before its handlers
                raise ConnectionError("the broker went away")
            return await reads.end_offsets(partitions)

        original(self, task, tp, source, node, stage, dataclasses.replace(reads, end_offsets=end_offsets), *args)

    monkeypatch.setattr(bulk_exec.ExecutorWindow, "__init__", failing_second_end_offsets)
    builder = pass_through(source, sink)
    client = make_client(builder, cluster, names.app)
    client.set_uncaught_exception_handler(lambda exc: StreamThreadExceptionResponse.SHUTDOWN_CLIENT)
    await client.start_async()
    try:
        assert await client.wait_for_state_async(ClientState.ERROR, timeout=WAIT)
    finally:
        await client.close_async()
    assert len(calls) == 2
    assert _persisted(spark) == before
    assert await committed_offset(cluster, names.app, TopicPartition(source, 0)) is None


async def test_a_to_spark_stage_on_the_executors_writes_nothing_past_a_pause(
        cluster: Cluster, names: Any, spark: Any, executor_windows: list[Any], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Any) -> None:
    """A ``to_spark`` job writes as it runs, so a range is never run ahead of the one below it: while
    the task is paused at offset 45 no job of the range after it ran, even with handlers that take
    their time (a dead-letter produce); the resume writes the rest."""
    import anyio

    from streamloop.tasks import exec_work, range_outcomes

    source, path = names("in"), str(tmp_path / "lake")
    await cluster.create_topics({source: 1})
    await produce_with_bad_bytes(cluster, source, 80, 45)
    run = exec_work.RangeWork.run
    started: list[int] = []

    def spy_run(self: Any, kafka_range: Any, tag: str) -> Any:
        started.append(kafka_range.start)
        return run(self, kafka_range, tag)

    report = range_outcomes.RangeOutcomes.report_failures

    async def slow_report(self: Any, outcome: Any) -> None:
        await anyio.sleep(0.5)  # a handler's own I/O: the loop runs its other tasks meanwhile
        await report(self, outcome)

    monkeypatch.setattr(exec_work.RangeWork, "run", spy_run)
    monkeypatch.setattr(range_outcomes.RangeOutcomes, "report_failures", slow_report)
    Asked.asked = []
    builder = StreamsBuilder()
    builder.stream(source, key_serde=INT, value_serde=JSON).to_spark(path, schema=SCHEMA, max_records=20,
                                                                       read="executors")
    async with make_client(builder, cluster, names.app, default_deserialization_exception_handler=PauseOnBadBytes) \
            as client:
        await eventually_async(lambda: bool(client.paused_local_tasks()), WAIT, "the task paused at offset 45")
        while_paused = list(started)
        (paused,) = client.paused_local_tasks()
        assert await client.resume_async(paused.task_id, skip=True)
        await eventually_async(lambda: _committed_to(cluster, names.app, source, 1, 80), WAIT, "all committed")
    assert while_paused == [0, 20, 40]
    assert [(kind, offset) for kind, offset, _e in Asked.asked] == [("deserialization", 45)]
    keys = sorted({row["key"] for row in spark.read.parquet(path).collect()})
    assert keys == [k for k in range(80) if k != 45]


async def test_a_failed_record_that_fails_the_thread_commits_nothing_past_it(
        cluster: Cluster, names: Any, spark: Any, executor_windows: list[Any]) -> None:
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    await produce_with_bad_bytes(cluster, source, 50, 45)
    builder = pass_through(source, sink)
    client = make_client(builder, cluster, names.app)  # FAIL: the default deserialization handler
    client.set_uncaught_exception_handler(lambda exc: StreamThreadExceptionResponse.SHUTDOWN_CLIENT)
    await client.start_async()
    try:
        await cluster.read(sink, 40, timeout=WAIT)
        assert await client.wait_for_state_async(ClientState.ERROR, timeout=WAIT)
    finally:
        await client.close_async()
    # Ranges [0, 20) and [20, 40) were written and committed; the one holding the bad record was
    # not written at all (the handler is asked before the executors write) nor committed.
    assert await committed_offset(cluster, names.app, TopicPartition(source, 0)) == 40
    assert len(await cluster.read_all(sink)) == 40
    assert executor_windows[0].sink is not None


async def test_a_threads_tasks_read_and_write_their_ranges_in_shared_jobs(
        cluster: Cluster, names: Any, spark: Any, executor_windows: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """With a row-wise function, the tasks of one stream thread read their next ranges in one Spark
    job and write them in one (``streamloop.tasks.range_jobs``): fewer jobs than ranges, the records
    the driver path writes, each with the timestamp of its own task's range."""
    from streamloop.spark import row_wise

    source, by_driver, by_executors = names("in"), names("driver"), names("executors")
    await cluster.create_topics({source: 2, by_driver: 3, by_executors: 3})
    stamps = {0: 1_700_000_000_000, 1: 1_700_000_555_000}  # one per source partition: a key's parity
    for p, stamp in stamps.items():
        await cluster.produce(source, [(i, {"amount": i, "customer": f"c{i % 7}"}) for i in range(p, 300, 2)], INT,
                              JSON, partitions=2, timestamp=stamp)
    expected = sum(1 for i in range(300) if i % 3)
    monkeypatch.setattr(tests_module, "big_spenders", row_wise(big_spenders))
    await run_pipeline(cluster, names.app + "-d", source, by_driver, "driver", expected, 2, 150)
    driver = _written(await cluster.read_all(by_driver))
    monkeypatch.setattr(RecordCollector, "send_serialized", _refused)
    await run_pipeline(cluster, names.app + "-e", source, by_executors, "executors", expected, 2, 150)
    assert len(executor_windows) == 2
    jobs = executor_windows[0]._jobs
    assert jobs is not None and jobs is executor_windows[1]._jobs  # one stream thread: shared
    ranges = sum(w.ranges for w in executor_windows)
    assert ranges >= 8 and jobs.writes >= 1 and jobs.reads < ranges  # 150 records a partition, 40 a range
    executors = _written(await cluster.read_all(by_executors))
    assert sorted(executors) == sorted(driver)
    for p, records in driver.items():
        assert sorted((k, v) for _t, k, v in executors[p]) == sorted((k, v) for _t, k, v in records)
        for t, k, _v in executors[p]:
            assert k is not None and t == stamps[INT.deserialize(k) % 2]  # its own range's carrier's time
        for key in {k for _t, k, _v in records}:
            assert [v for _t, k, v in executors[p] if k == key] == [v for _t, k, v in records if k == key]


async def test_a_function_marked_row_wise_that_is_not_has_each_range_written_on_its_own(
        cluster: Cluster, names: Any, spark: Any, executor_windows: list[Any]) -> None:
    """A shuffle in a function marked row-wise: the shared write's plan check refuses it, so each
    task writes its own range from the shared read (its own timestamp), and the stage stops sharing."""
    from pyspark.sql import functions as F

    from streamloop.spark import row_wise

    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 2, sink: 1})
    stamps = {0: 1_700_000_000_000, 1: 1_700_000_555_000}
    for p, stamp in stamps.items():
        await cluster.produce(source, [(i, {"amount": i, "customer": "c"}) for i in range(p, 100, 2)], INT, JSON,
                              partitions=2, timestamp=stamp)

    @row_wise
    def shuffled(frame: Any) -> Any:
        return frame.repartition(3).withColumn("tier", F.lit("t"))

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .spark_batch(shuffled, schema=SCHEMA, max_records=20, read="executors")
            .to(sink, key_serde=INT, value_serde=JSON))
    async with make_client(builder, cluster, names.app):
        await eventually_async(lambda: _committed_to(cluster, names.app, source, 2, 50), WAIT, "all committed")
        await cluster.read(sink, 100, timeout=WAIT)
    output = await cluster.read_all(sink)
    assert sorted(INT.deserialize(r.key) for r in output) == list(range(100))  # each range written once
    assert all(r.timestamp == stamps[INT.deserialize(r.key) % 2] for r in output)
    assert len(executor_windows) == 2
    job = executor_windows[0]._stage.executor_job()[0]
    assert not job.row_wise  # found out at the first shared write


async def test_a_write_from_a_thread_that_did_not_register_the_sink_finds_it(cluster: Cluster, names: Any,
                                                                              spark: Any) -> None:
    """Spark looks a Python data source up in the JVM thread's active session, which a worker
    thread other than the one that registered it has none of: the engine's jobs run on any of
    anyio's worker threads (seen under make test's load as DATA_SOURCE_NOT_FOUND on a write)."""
    import threading

    from streamloop.spark.kafka_writer import WriteSpec, write_frame

    sink = names("out")
    await cluster.create_topics({sink: 1})
    spec = WriteSpec({"bootstrap_servers": cluster.bootstrap}, sink, 1, "key", None, INT, JSON, 1_700_000_000_000)
    frame = spark.createDataFrame([(1, 10)], "key long, amount long")
    write_frame(spark, frame, spec)  # registers the sink from this thread
    failures: list[BaseException] = []

    def elsewhere() -> None:
        try:
            write_frame(spark, frame, spec)
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert failures == []
    assert len(await cluster.read(sink, 2, timeout=WAIT)) == 2
