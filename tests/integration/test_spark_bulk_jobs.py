"""One Spark job for the batches of several tasks of a stream thread (``streamloop.tasks.bulk_jobs``),
on ``memory://`` and on Kafka, with the session's real local Spark: each task's part is split back
to it in order, each task commits its own offset range (never past its own unfinished part, even
when a later shared job finished), a job that raises fails only the task whose records cause
it, and with ``spark.batch.eager`` a job runs as soon as no other job of the stage runs."""

from __future__ import annotations

import threading
from typing import Any, ClassVar

import pytest

from streamloop import KafkaStreams, StreamsBuilder
from streamloop.errors import SparkBatchError
from streamloop.handlers import ProcessingHandlerResponse
from streamloop.records import TopicPartition
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.spark.stage import SparkBatchStage
from streamloop.tasks.bulk import BatchWindow
from streamloop.testing import eventually_async
from tests.support.apps import streams_config
from tests.support.cluster import Cluster, committed_offset

pytestmark = pytest.mark.asyncio

INT, JSON = IntegerSerde(), JsonSerde()
WAIT = 60


@pytest.fixture
def job_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of tasks' parts in each shared Spark job run."""
    sizes: list[int] = []
    original = SparkBatchStage.run_parts

    async def spy(self: SparkBatchStage, parts: Any) -> Any:
        sizes.append(len(parts))
        return await original(self, parts)

    monkeypatch.setattr(SparkBatchStage, "run_parts", spy)
    return sizes


def make_client(builder: StreamsBuilder, cluster: Cluster, app: str, **overrides: Any) -> KafkaStreams:
    settings = {k.replace("_", "."): v for k, v in overrides.items()}
    return KafkaStreams(builder.build(), {**streams_config(cluster.bootstrap, app), "num.stream.threads": 1,
                                          **settings})


async def committed(cluster: Cluster, topic: str, app: str, partition: int) -> int | None:
    return await committed_offset(cluster, app, TopicPartition(topic, partition))


async def _is(value: Any, expected: Any) -> bool:
    return (await value) == expected


async def test_one_job_serves_several_tasks_and_each_gets_its_own_rows_back_in_order(
        cluster: Cluster, names, spark, windows, job_sizes) -> None:
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 4, sink: 1})
    await cluster.produce(source, [(i % 4, {"i": i, "p": i % 4}) for i in range(200)], INT, JSON, partitions=4)
    seen: list[set[int]] = []

    def enrich(frame: Any) -> Any:
        from pyspark.sql import functions as F

        # The function sees one task's records per frame, as with a job per task.
        seen.append({row.p for row in frame.select("p").distinct().collect()})
        return frame.withColumn("tier", F.concat(F.lit("tier-"), frame.p.cast("string")))

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .spark_batch(enrich, max_records=1_000, max_wait_ms=500)
            .to(sink, key_serde=INT, value_serde=JSON))
    # Not eager: what is shown here is the sharing, whatever turn of the loop each task's fetch lands in.
    async with make_client(builder, cluster, names.app, spark_batch_eager=False):
        output = [JSON.deserialize(r.value) for r in await cluster.read(sink, 200, timeout=WAIT)]
        for p in range(4):
            await eventually_async(lambda p=p: _is(committed(cluster, source, names.app, p), 50), WAIT,
                                   f"partition {p} committed to its end")
    assert len(windows) == 4 and all(isinstance(w, BatchWindow) for w in windows)
    assert len({id(w._jobs) for w in windows}) == 1  # the thread's tasks share the stage's jobs
    assert max(job_sizes) > 1  # a job held the parts of several tasks
    assert all(len(parts) == 1 for parts in seen)
    assert len(output) == 200
    for p in range(4):
        assert [v["i"] for v in output if v["p"] == p] == list(range(p, 200, 4))  # offset order, no gap
    assert all(v["tier"] == f"tier-{v['p']}" for v in output)


async def test_a_stop_with_shared_jobs_in_flight_commits_each_task_only_up_to_its_own_unfinished_part(
        cluster: Cluster, names, spark, windows, job_sizes) -> None:
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 2, sink: 1})
    # Partition 0 holds i = 0..9, partition 1 holds i = 100..109.
    await cluster.produce(source, [(p, {"i": 100 * p + n}) for n in range(10) for p in (0, 1)], INT, JSON,
                          partitions=2)
    release, stuck = threading.Event(), threading.Event()
    stuck.set()
    finished: list[int] = []

    def stuck_on_100(frame: Any) -> Any:
        first = frame.agg({"i": "min"}).collect()[0][0]
        if stuck.is_set() and first == 100:
            release.wait(WAIT)  # partition 1's first part never finishes in the first run
        finished.append(first)
        return frame

    def topology() -> StreamsBuilder:
        builder = StreamsBuilder()
        # Jobs of 8 records: with both partitions fetched at once, each task's first 8 fill a job
        # alone and their last 2 share the third; fetched in pieces, partition 0's parts may share
        # a job with partition 1's stuck one, which is given up after shared.max.ms, each part
        # then running alone.
        (builder.stream(source, key_serde=INT, value_serde=JSON)
                .spark_batch(stuck_on_100, max_records=8, max_batches_in_flight=3, max_wait_ms=1_000)
                .to(sink, key_serde=INT, value_serde=JSON))
        return builder

    first = make_client(topology(), cluster, names.app, request_timeout_ms=3_000,
                        spark_batch_shared_max_ms=2_000)
    await first.start_async()
    try:
        await eventually_async(lambda: _is(committed(cluster, source, names.app, 0), 10), WAIT,
                               "partition 0 committed to its end")
        assert 2 in job_sizes  # a job held both tasks' parts
        assert await committed(cluster, source, names.app, 1) is None  # never past its unfinished part
        assert await first.close_async(timeout=WAIT)
    finally:
        release.set()
    assert await committed(cluster, source, names.app, 1) is None
    assert [JSON.deserialize(r.value)["i"] for r in await cluster.read_all(sink)] == list(range(10))

    stuck.clear()
    async with make_client(topology(), cluster, names.app):
        await eventually_async(lambda: _is(committed(cluster, source, names.app, 1), 10), WAIT, "all committed")
    # Exactly once each: the restart read partition 1 only, partition 0 was not redone.
    output = [JSON.deserialize(r.value)["i"] for r in await cluster.read_all(sink)]
    assert output == [*range(10), *range(100, 110)]


class ContinueOnFailure:
    errors: ClassVar[list[tuple[int, int, BaseException]]] = []

    def configure(self, config: Any) -> None:
        pass

    def handle(self, context: Any, record: Any, exception: BaseException) -> ProcessingHandlerResponse:
        ContinueOnFailure.errors.append((context.partition, context.offset, exception))
        return ProcessingHandlerResponse.CONTINUE


async def test_a_job_that_raises_fails_only_the_task_whose_records_cause_it(
        cluster: Cluster, names, spark, windows, job_sizes) -> None:
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 2, sink: 1})
    await cluster.produce(source, [(p, {"i": 100 * p + n}) for n in range(6) for p in (0, 1)], INT, JSON,
                          partitions=2)
    ContinueOnFailure.errors = []

    def fails_on_3(frame: Any) -> Any:
        if 3 in {row.i for row in frame.select("i").collect()}:
            raise ValueError("record 3 is bad")
        return frame

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .spark_batch(fails_on_3, max_records=100, max_wait_ms=1_000)
            .to(sink, key_serde=INT, value_serde=JSON))
    async with make_client(builder, cluster, names.app, processing_exception_handler=ContinueOnFailure,
                           spark_batch_eager=False):
        output = [JSON.deserialize(r.value)["i"] for r in await cluster.read(sink, 6, timeout=WAIT)]
        for p in (0, 1):
            await eventually_async(lambda p=p: _is(committed(cluster, source, names.app, p), 6), WAIT,
                                   f"partition {p} committed to its end")
    assert 2 in job_sizes  # the failing job held both tasks' parts
    assert output == list(range(100, 106))  # partition 1's part ran again alone, and went out
    # Partition 0's part failed as a whole (each of its records asked about, in order); no other.
    assert [(p, o) for p, o, _e in ContinueOnFailure.errors] == [(0, n) for n in range(6)]
    assert all(isinstance(e, SparkBatchError) for _p, _o, e in ContinueOnFailure.errors)


@pytest.fixture
def job_records(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of records in each shared Spark job run, in the order the jobs started."""
    sizes: list[int] = []
    original = SparkBatchStage.run_parts

    async def spy(self: SparkBatchStage, parts: Any) -> Any:
        sizes.append(sum(len(part.raws) for part in parts))
        return await original(self, parts)

    monkeypatch.setattr(SparkBatchStage, "run_parts", spy)
    return sizes


async def test_an_eager_job_runs_when_no_other_runs_and_the_next_fills_meanwhile(
        cluster: Cluster, names, spark, windows, job_records) -> None:
    """max.wait.ms is a minute here, longer than the test waits: only the eager rule runs a job.
    The first record's job runs alone and is held; the records that come meanwhile fill the open
    job, which runs, all of them in one job, once the first one finished."""
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    release, held = threading.Event(), threading.Event()

    def held_at_0(frame: Any) -> Any:
        if 0 in {row.i for row in frame.select("i").collect()}:
            held.set()
            release.wait(WAIT)
        return frame

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .spark_batch(held_at_0, max_records=1_000, max_wait_ms=60_000)
            .to(sink, key_serde=INT, value_serde=JSON))
    async with make_client(builder, cluster, names.app):
        try:
            await cluster.produce(source, [(0, {"i": 0})], INT, JSON, partitions=1)
            await eventually_async(held.is_set, 30, "the first job ran without waiting max.wait.ms")
            await cluster.produce(source, [(0, {"i": n}) for n in range(1, 20)], INT, JSON, partitions=1)

            def open_records() -> int:
                batch = windows[0]._open
                return batch.part.job.records if batch is not None else 0

            await eventually_async(lambda: open_records() == 19, 30, "the next job filled while one ran")
            assert job_records == [1]  # the open job waits while one runs
        finally:
            release.set()
        output = [JSON.deserialize(r.value)["i"] for r in await cluster.read(sink, 20, timeout=30)]
    assert output == list(range(20))
    assert job_records == [1, 19]


async def test_a_job_that_is_not_eager_waits_for_max_wait_ms(cluster: Cluster, names, spark, windows,
                                                              job_records) -> None:
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .spark_batch(lambda frame: frame, max_records=1_000, max_wait_ms=3_000)
            .to(sink, key_serde=INT, value_serde=JSON))
    async with make_client(builder, cluster, names.app, spark_batch_eager=False):
        await cluster.produce(source, [(0, {"i": 0})], INT, JSON, partitions=1)
        await eventually_async(lambda: bool(windows) and windows[0]._open is not None, 30, "a job opened")
        await cluster.produce(source, [(0, {"i": n}) for n in range(1, 5)], INT, JSON, partitions=1)
        assert len(await cluster.read(sink, 5, timeout=30)) == 5
    assert job_records == [5]  # one job, sealed by the wait: every record that came meanwhile
