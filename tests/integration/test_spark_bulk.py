"""The bulk path of a Spark stage (``streamloop.tasks.bulk``), on ``memory://`` and on Kafka, with the
session's real local Spark: whole offset ranges per batch, output in offset order per partition,
commits that never pass an unfinished batch (a stop mid-batch re-reads only unfinished ranges),
and failed records handed to the handlers one by one."""

from __future__ import annotations

import threading
from typing import Any, ClassVar

import anyio
import pytest

from streamloop import KafkaStreams, StreamsBuilder
from streamloop.errors import SparkSchemaError
from streamloop.handlers import DeserializationHandlerResponse, ProcessingHandlerResponse
from streamloop.records import TopicPartition
from streamloop.serdes import BytesSerde, IntegerSerde, JsonSerde
from streamloop.tasks.bulk import BatchWindow
from streamloop.testing import eventually_async
from tests.support.apps import streams_config
from tests.support.cluster import Cluster, committed_offset

pytestmark = pytest.mark.asyncio

INT, JSON = IntegerSerde(), JsonSerde()
WAIT = 60


def make_client(builder: StreamsBuilder, cluster: Cluster, app: str, **overrides: Any) -> KafkaStreams:
    settings = {"spark.batch.max.wait.ms": 100, **{k.replace("_", "."): v for k, v in overrides.items()}}
    return KafkaStreams(builder.build(), {**streams_config(cluster.bootstrap, app), **settings})


async def committed(cluster: Cluster, topic: str, app: str, partition: int = 0) -> int | None:
    return await committed_offset(cluster, app, TopicPartition(topic, partition))


async def _is(value: Any, expected: Any) -> bool:
    return (await value) == expected


async def test_output_leaves_in_offset_order_per_partition_with_batches_of_several_tasks(
        cluster: Cluster, names, windows, spark) -> None:
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 4, sink: 1})
    # Record i goes to partition i % 4; its value says where it came from.
    await cluster.produce(source, [(i % 4, {"i": i, "p": i % 4}) for i in range(400)], INT, JSON, partitions=4)
    sizes: list[int] = []

    def enrich(frame: Any) -> Any:
        from pyspark.sql import functions as F

        sizes.append(frame.count())
        # A narrow transformation: the rows stay in the frame's order (a join would not keep it).
        return frame.withColumn("tier", F.concat(F.lit("tier-"), frame.p.cast("string")))

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .spark_batch(enrich, max_records=20, max_batches_in_flight=3)
            .to(sink, key_serde=INT, value_serde=JSON))
    async with make_client(builder, cluster, names.app, num_stream_threads=1):
        output = [JSON.deserialize(r.value) for r in await cluster.read(sink, 400, timeout=WAIT)]
        for p in range(4):
            await eventually_async(lambda p=p: _is(committed(cluster, source, names.app, p), 100), WAIT,
                                   f"partition {p} committed to its end")
    assert len(windows) >= 4 and all(isinstance(w, BatchWindow) for w in windows)
    assert max(sizes) == 20  # batches fill to max_records
    for p in range(4):
        assert [v["i"] for v in output if v["p"] == p] == list(range(p, 400, 4))  # offset order, no gap
    assert all(v["tier"] == f"tier-{v['p']}" for v in output)


async def test_a_stop_mid_batch_commits_only_finished_ranges_and_the_restart_reads_only_the_rest(
        cluster: Cluster, names, spark, windows) -> None:
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    await cluster.produce(source, [(0, {"i": i}) for i in range(30)], INT, JSON, partitions=1)
    release, stuck = threading.Event(), threading.Event()
    stuck.set()
    finished: list[int] = []

    def stuck_on_10(frame: Any) -> Any:
        first = frame.agg({"i": "min"}).collect()[0][0]
        if stuck.is_set() and first == 10:
            release.wait(WAIT)  # the third batch never finishes in the first run
        finished.append(first)
        return frame

    def topology() -> StreamsBuilder:
        builder = StreamsBuilder()
        (builder.stream(source, key_serde=INT, value_serde=JSON)
                .spark_batch(stuck_on_10, max_records=5, max_batches_in_flight=3, max_wait_ms=5_000)
                .to(sink, key_serde=INT, value_serde=JSON))
        return builder

    first = make_client(topology(), cluster, names.app, request_timeout_ms=3_000)
    await first.start_async()
    try:
        # Batches 0-4 and 5-9 are out; 15-19 and 20-24 finish behind the stuck 10-14.
        await eventually_async(lambda: {15, 20} <= set(finished), WAIT, "the batches after the stuck one done")
        await eventually_async(lambda: _is(committed(cluster, source, names.app), 10), WAIT, "0-9 committed")
        assert await committed(cluster, source, names.app) == 10  # never past the unfinished batch
        assert await first.close_async(timeout=WAIT)
    finally:
        release.set()
    assert await committed(cluster, source, names.app) == 10
    assert [JSON.deserialize(r.value)["i"] for r in await cluster.read_all(sink)] == list(range(10))

    stuck.clear()
    async with make_client(topology(), cluster, names.app):
        await eventually_async(lambda: _is(committed(cluster, source, names.app), 30), WAIT, "all committed")
    # Exactly once each: the restart read 10-29 only, the finished ranges were not redone.
    assert [JSON.deserialize(r.value)["i"] for r in await cluster.read_all(sink)] == list(range(30))
    assert all(isinstance(w, BatchWindow) for w in windows)


class Asked:
    """A deserialization and a processing handler that CONTINUE and keep what they were asked."""

    errors: ClassVar[list[BaseException]] = []

    def configure(self, config: Any) -> None:
        pass


class ContinueOnBadBytes(Asked):
    def handle(self, context: Any, record: Any, exception: BaseException) -> DeserializationHandlerResponse:
        Asked.errors.append(exception)
        return DeserializationHandlerResponse.CONTINUE


class ContinueOnMisfits(Asked):
    def handle(self, context: Any, record: Any, exception: BaseException) -> ProcessingHandlerResponse:
        Asked.errors.append(exception)
        return ProcessingHandlerResponse.CONTINUE


async def test_records_that_do_not_decode_or_fit_the_schema_reach_the_handlers_one_by_one_in_order(
        cluster: Cluster, names, spark, windows) -> None:
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    good = [JSON.serialize({"amount": i, "customer": f"c{i}"}) for i in range(12)]
    good[3] = b"{not json"                                           # fails to decode
    good[5] = JSON.serialize({"amount": "lots", "customer": "c5"})   # does not fit bigint
    good[9] = JSON.serialize({"amount": 9.5, "customer": "c9"})      # a double does not fit either
    await cluster.produce(source, list(enumerate(good)), INT, BytesSerde(), partitions=1)
    Asked.errors = []

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .spark_batch(lambda frame: frame, schema="key long, amount long, customer string", max_records=12,
                         max_wait_ms=2_000)
            .to(sink, key_serde=INT, value_serde=JSON))
    async with make_client(builder, cluster, names.app,
                           default_deserialization_exception_handler=ContinueOnBadBytes,
                           processing_exception_handler=ContinueOnMisfits):
        output = [JSON.deserialize(r.value) for r in await cluster.read(sink, 9, timeout=WAIT)]
        await eventually_async(lambda: _is(committed(cluster, source, names.app), 12), WAIT, "all committed")
    assert [v["amount"] for v in output] == [0, 1, 2, 4, 6, 7, 8, 10, 11]
    # The handlers are shown the serde's own error, then each record's SparkSchemaError.
    assert isinstance(Asked.errors[0], ValueError)
    misfits = Asked.errors[1:]
    assert all(isinstance(m, SparkSchemaError) for m in misfits)
    assert [(m.offset, m.field, m.found) for m in misfits] == [(5, "amount", "str"), (9, "amount", "float")]  # type: ignore[attr-defined]
    assert isinstance(windows[0], BatchWindow)


async def test_a_stage_after_another_processor_keeps_the_per_record_path(cluster: Cluster, names, spark,
                                                                        windows) -> None:
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    await cluster.produce(source, [(0, {"i": i}) for i in range(10)], INT, JSON, partitions=1)
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .filter(lambda _k, v: v["i"] % 2 == 0)
            .spark_batch(lambda frame: frame, max_records=5)
            .to(sink, key_serde=INT, value_serde=JSON))
    async with make_client(builder, cluster, names.app):
        output = [JSON.deserialize(r.value)["i"] for r in await cluster.read(sink, 5, timeout=WAIT)]
    assert sorted(output) == [0, 2, 4, 6, 8]
    assert windows == [None]



class ExecutorLost(Exception):
    """Stands for the error pyspark raises when Spark loses an executor mid-job (its text is the JVM's)."""


async def test_a_transient_spark_failure_on_the_bulk_path_is_retried_not_handed_to_the_handler(
        cluster: Cluster, names, spark, windows) -> None:
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    await cluster.produce(source, [(i, {"amount": i}) for i in range(20)], INT, JSON, partitions=1)
    Asked.errors = []
    calls: list[int] = []

    def flaky(frame: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise ExecutorLost("Job aborted due to stage failure: Lost task 0.3 in stage 2.0 (TID 7) (127.0.0.1 "
                               "executor 1): ExecutorLostFailure (executor 1 exited caused by one of the running "
                               "tasks) Reason: Command exited with code 137")
        return frame

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .spark_batch(flaky, max_records=20, max_wait_ms=2_000)
            .to(sink, key_serde=INT, value_serde=JSON))
    async with make_client(builder, cluster, names.app, processing_exception_handler=ContinueOnMisfits,
                           retry_backoff_ms=10):
        output = [JSON.deserialize(r.value) for r in await cluster.read(sink, 20, timeout=WAIT)]
        await eventually_async(lambda: _is(committed(cluster, source, names.app), 20), WAIT, "all committed")
    assert sorted(v["amount"] for v in output) == list(range(20))
    assert Asked.errors == []  # retried under task.timeout.ms, never a record's processing error
    assert len(calls) >= 2
    assert isinstance(windows[0], BatchWindow)


class PauseOnBadBytes(Asked):
    asked: ClassVar[list[int]] = []

    def handle(self, context: Any, record: Any, exception: BaseException) -> DeserializationHandlerResponse:
        PauseOnBadBytes.asked.append(record.offset)
        return DeserializationHandlerResponse.PAUSE


@pytest.mark.parametrize("skip", [True, False], ids=["skip", "again"])
async def test_a_resume_before_the_paused_batch_is_released_reads_on_from_the_pause_and_commits_no_further(
        cluster: Cluster, names, spark, windows, monkeypatch: pytest.MonkeyPatch, skip: bool) -> None:
    """A handler PAUSEs at offset 15 of a batch of 0..29, and the resume comes before that batch is
    released (its handlers were asked; its output waits, as behind another batch's release): the
    batch is done only below the pause. The partition is read again from the pause (not from the
    batch's first offset: 0..14 leave once), and the position stays at the resume point until the
    records read again are done (a commit at 30 would pass the bad record at 20 before any handler
    was asked about it)."""
    from streamloop.tasks.task import StreamTask

    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    values = [JSON.serialize({"i": i}) for i in range(30)]
    values[15] = values[20] = b"\xff"
    await cluster.produce(source, list(enumerate(values)), INT, BytesSerde(), partitions=1)
    PauseOnBadBytes.asked = []
    resumed: dict[str, Any] = {}
    reread, stuck = threading.Event(), threading.Event()

    release = BatchWindow._release

    async def held_until_the_resume(self: BatchWindow) -> None:
        # As behind another batch's release (its lock): the resume runs before this batch is released.
        if self._task.paused_at is not None and "event" not in resumed:
            resumed["event"] = anyio.Event()
            await resumed["event"].wait()
        await release(self)

    resume = StreamTask.resume

    def resume_and_release(self: StreamTask, skip: bool) -> None:
        resume(self, skip)
        if "event" in resumed:
            resumed["event"].set()

    def held_on_the_reread(frame: Any) -> Any:
        if frame.agg({"i": "min"}).collect()[0][0] >= 16:
            stuck.set()
            reread.wait(WAIT)  # the records read again stay in flight until the test looked
        return frame

    monkeypatch.setattr(BatchWindow, "_release", held_until_the_resume)
    monkeypatch.setattr(StreamTask, "resume", resume_and_release)
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .spark_batch(held_on_the_reread, max_records=30, max_wait_ms=5_000)
            .to(sink, key_serde=INT, value_serde=JSON))
    async with make_client(builder, cluster, names.app, default_deserialization_exception_handler=PauseOnBadBytes) \
            as client:
        try:
            await eventually_async(lambda: bool(client.paused_local_tasks()), WAIT, "paused at offset 15")
            assert await client.resume_async("0_0", skip=skip)
            await eventually_async(lambda: stuck.is_set(), WAIT, "the records past the pause read again")
            expected = 16 if skip else 15
            await eventually_async(lambda: _is(committed(cluster, source, names.app), expected), WAIT,
                                   f"committed up to {expected}")
            reread.set()
            if not skip:  # asked about 15 again: past it this time
                await eventually_async(lambda: PauseOnBadBytes.asked == [15, 15] and bool(client.paused_local_tasks()),
                                       WAIT, "paused at offset 15 again")
                assert await client.resume_async("0_0", skip=True)
            await eventually_async(lambda: PauseOnBadBytes.asked[-1:] == [20] and bool(client.paused_local_tasks()),
                                   WAIT, "paused at offset 20")
            assert await client.resume_async("0_0", skip=True)
            await eventually_async(lambda: _is(committed(cluster, source, names.app), 30), WAIT, "all committed")
        finally:
            reread.set()
    assert PauseOnBadBytes.asked == ([15, 20] if skip else [15, 15, 20])
    output = [JSON.deserialize(r.value)["i"] for r in await cluster.read_all(sink)]
    # Below the pause, once; the batch's rows past it left with record 14, so those may come twice.
    assert sorted(i for i in output if i < 15) == list(range(15))
    assert set(output) == set(range(30)) - {15, 20}
    assert all(isinstance(w, BatchWindow) for w in windows)
