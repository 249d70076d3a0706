"""RETRY, a processing handler's answer, on both transports: under ``processing.ordering=key`` only
the failing key waits; one record at a time the task waits; nothing commits past a waiting record;
a crash while it waits loses nothing and applies its store update once."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

from streamloop import BaseProcessor, ClientState, PunctuationType, Record, StreamsBuilder
from streamloop.handlers import Answer, ErrorContext, StreamThreadExceptionResponse
from streamloop.ids import TaskId
from streamloop.records import TopicPartition
from streamloop.serdes import IntegerSerde, JsonSerde, LongSerde
from streamloop.state import Materialized
from streamloop.testing import eventually_async
from streamloop.threads.view import TaskRunState
from tests.support.apps import make_streams
from tests.support.cluster import Cluster, committed_offset

pytestmark = pytest.mark.asyncio

INT, JSON = IntegerSerde(), JsonSerde()


class Unavailable(RuntimeError):
    """The service a processor calls is down for now: worth a retry."""


class RetryUnavailable:
    """RETRY for ``Unavailable``, FAIL for anything else."""

    def configure(self, config: Any) -> None:
        """Nothing to configure."""

    def handle(self, context: ErrorContext, record: Any, exception: BaseException) -> Answer:
        return Answer.RETRY if isinstance(exception, Unavailable) else Answer.FAIL


def task_metric(streams: Any, name: str, task: str) -> float:
    return sum(m.value for m in streams.metrics()
               if m.group == "stream-task-metrics" and m.name == name and m.tags.get("task-id") == task)


async def test_under_key_ordering_only_the_failing_key_waits_and_no_commit_passes_it(
        cluster: Cluster, names) -> None:
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    # Key 0 at offsets 0 and 20 (a key's waiting records stop the window's look-ahead, 2 x
    # num.threads.per.task records, once they fill it); keys 1-3 around them.
    keys = [0 if i in (0, 20) else 1 + i % 3 for i in range(40)]
    records = [(keys[i], {"i": i}) for i in range(40)]
    await cluster.produce(source, records, INT, JSON, partitions=1)
    up = threading.Event()
    calls: Counter[int] = Counter()

    def call_service(value: dict) -> dict:
        calls[value["i"]] += 1
        if value["i"] == 0 and not up.is_set():
            raise Unavailable("service down for record 0")
        return value

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .map_values(call_service, name="call-service")
            .to(sink, key_serde=INT, value_serde=JSON))
    streams = make_streams(builder.build(), cluster.bootstrap, names.app, num_threads_per_task=4,
                           processing_ordering="key", processing_exception_handler=RetryUnavailable(),
                           processing_retry_backoff_ms=20, processing_retry_backoff_max_ms=50,
                           processing_retry_max_attempts=1_000_000, commit_interval_ms=50)
    async with streams:
        # Keys 1-3 go through while key 0's first record (offset 0) keeps failing.
        others = await cluster.read(sink, 38, timeout=30)
        assert {INT.deserialize(r.key) for r in others} == {1, 2, 3}
        await eventually_async(lambda: calls[0] >= 3, 30, "record 0 retried")
        assert task_metric(streams, "record-retries-total", "0_0") >= 2
        assert not any(INT.deserialize(r.key) == 0 for r in await cluster.read_all(sink))
        tp = TopicPartition(source, 0)
        assert (await committed_offset(cluster, names.app, tp) or 0) == 0  # never past the waiting record
        up.set()
        output = await cluster.read(sink, 40, timeout=30)
        await eventually_async(lambda: _committed_at(cluster, names.app, tp, 40), 30, "everything committed")
        assert streams.state is ClientState.RUNNING
    # Each record once, each key in offset order; the retried record after the other keys' records.
    values = [JSON.deserialize(r.value)["i"] for r in sorted(output, key=lambda r: r.offset)]
    assert sorted(values) == list(range(40))
    for key in range(4):
        assert [i for i in values if keys[i] == key] == [i for i in range(40) if keys[i] == key]
    assert values.index(0) > values.index(39)


async def _committed_at(cluster: Cluster, group: str, tp: TopicPartition, offset: int) -> bool:
    return await committed_offset(cluster, group, tp) == offset


async def test_one_record_at_a_time_the_task_waits_and_the_threads_other_task_goes_on(
        cluster: Cluster, names) -> None:
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 2, sink: 2})
    await cluster.produce(source, [(i % 2, {"i": i, "p": i % 2}) for i in range(40)], INT, JSON, partitions=2)
    up = threading.Event()
    calls: Counter[int] = Counter()

    def call_service(value: dict) -> dict:
        calls[value["i"]] += 1
        if value["i"] == 4 and not up.is_set():
            raise Unavailable("service down for record 4")
        return value

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .map_values(call_service, name="call-service")
            .to(sink, key_serde=INT, value_serde=JSON))
    streams = make_streams(builder.build(), cluster.bootstrap, names.app,
                           processing_exception_handler=RetryUnavailable(), processing_retry_backoff_ms=20,
                           processing_retry_backoff_max_ms=50, processing_retry_max_attempts=1_000_000,
                           commit_interval_ms=50)
    p0, p1 = TopicPartition(source, 0), TopicPartition(source, 1)
    async with streams:
        # Partition 1's task (on the same thread) gets through and commits its 20 records; partition
        # 0's task stops at record 4 (its offset 2), whose predecessors it commits.
        await eventually_async(lambda: _committed_at(cluster, names.app, p1, 20), 30, "partition 1 committed")
        await eventually_async(lambda: _committed_at(cluster, names.app, p0, 2), 30, "partition 0 up to record 4")
        await eventually_async(lambda: calls[4] >= 3, 30, "record 4 retried")
        assert task_metric(streams, "record-retries-total", "0_0") >= 2
        assert task_metric(streams, "record-retries-total", "0_1") == 0
        states = {d.task_id: d.state for d in streams.local_task_details()}
        assert (states[TaskId(0, 0)], states[TaskId(0, 1)]) == (TaskRunState.RETRYING, TaskRunState.RUNNING)
        assert await committed_offset(cluster, names.app, p0) == 2
        up.set()
        output = await cluster.read(sink, 40, timeout=30)
        await eventually_async(lambda: _committed_at(cluster, names.app, p0, 20), 30, "partition 0 committed")
    from_zero = [JSON.deserialize(r.value)["i"] for r in sorted(output, key=lambda r: (r.partition, r.offset))
                 if JSON.deserialize(r.value)["p"] == 0]
    assert from_zero == list(range(0, 40, 2))  # in offset order, each once


class Ticking(BaseProcessor):
    """Counts its wall-clock punctuations (every 20 ms); passes records on."""

    def __init__(self, ticks: list[int]) -> None:
        self.ticks = ticks

    def init(self, context: Any) -> None:
        super().init(context)
        context.schedule(20, PunctuationType.WALL_CLOCK_TIME, self.ticks.append)

    def process(self, record: Record) -> None:
        self.context.forward(record)


async def test_wall_clock_punctuations_run_while_the_task_waits_out_a_retry(cluster: Cluster, names) -> None:
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    await cluster.produce(source, [(0, {"i": 0})], INT, JSON, partitions=1)
    up = threading.Event()
    ticks: list[int] = []

    def call_service(value: dict) -> dict:
        if not up.is_set():
            raise Unavailable("service down")
        return value

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .process(lambda: Ticking(ticks))
            .map_values(call_service, name="call-service")
            .to(sink, key_serde=INT, value_serde=JSON))
    streams = make_streams(builder.build(), cluster.bootstrap, names.app,
                           processing_exception_handler=RetryUnavailable(), processing_retry_backoff_ms=1_000,
                           processing_retry_backoff_max_ms=1_000, processing_retry_max_attempts=1_000_000)
    async with streams:
        await eventually_async(lambda: task_metric(streams, "record-retries-total", "0_0") >= 1, 30, "a retry")
        before = len(ticks)
        # The 20 ms punctuation keeps firing through the 1 s back-offs (were it run only between
        # two attempts, 3 s would see about 3 of them).
        await eventually_async(lambda: len(ticks) >= before + 20, 3, "wall-clock punctuations during the wait")
        up.set()
        await cluster.read(sink, 1, timeout=30)


def counting_then_calling(source: str, sink: str, store: str, call: Any) -> Any:
    """Counts per key, then calls the service with the count: a failed call comes after the
    record's store update, which a retry (or a crash) must not leave applied twice."""
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .group_by_key(key_serde=INT)
            .count(materialized=Materialized(store))
            .to_stream()
            .map_values(call, name="call-service")
            .to(sink, key_serde=INT, value_serde=LongSerde()))
    return builder.build()


async def test_a_crash_while_a_record_waits_loses_nothing_and_counts_it_once(cluster: Cluster, names) -> None:
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 2, sink: 1})
    # Key 0 five times, all on partition 0; its fourth record (count 4) meets the service down.
    await cluster.produce(source, [(0, {"n": n}) for n in range(5)], INT, JSON, partitions=2)
    store = "counts"
    crash = threading.Event()
    calls: Counter[int] = Counter()

    def down_at_four(count: int) -> int:
        calls[count] += 1
        if count == 4:
            if crash.is_set():
                raise ValueError("the thread dies while record 3 waits (FAIL, SHUTDOWN_CLIENT)")
            raise Unavailable("service down")
        return count

    common = dict(processing_exception_handler=RetryUnavailable(), processing_retry_backoff_ms=50,
                  processing_retry_backoff_max_ms=100, processing_retry_max_attempts=1_000_000,
                  commit_interval_ms=50, cache_max_bytes_buffering=0)
    first = make_streams(counting_then_calling(source, sink, store, down_at_four), cluster.bootstrap,
                         names.app, **common)
    first.set_uncaught_exception_handler(lambda exc: StreamThreadExceptionResponse.SHUTDOWN_CLIENT)
    await first.start_async()
    tp = TopicPartition(source, 0)
    try:
        # Records 0-2 are committed; record 3 keeps failing and waits: nothing commits past it.
        await eventually_async(lambda: calls[4] >= 3, 30, "record 3 retried")
        await eventually_async(lambda: _committed_at(cluster, names.app, tp, 3), 30, "a commit at offset 3")
        assert task_metric(first, "record-retries-total", "0_0") >= 2
        crash.set()  # its next attempt fails the thread: the client dies while the record waits
        await eventually_async(lambda: first.state is ClientState.ERROR, 30, "the client died")
        assert await committed_offset(cluster, names.app, tp) == 3
    finally:
        await first.close_async()
    crash.clear()
    calls.clear()
    second = make_streams(counting_then_calling(source, sink, store, lambda count: count), cluster.bootstrap,
                          names.app, **common)
    async with second:
        await eventually_async(lambda: _committed_at(cluster, names.app, tp, 5), 30, "the rest committed")
    counts = [LongSerde().deserialize(r.value) for r in await cluster.read_all(sink)]
    # The waiting record's failed attempts left no count behind: after the crash it counted 4, once.
    assert counts == [1, 2, 3, 4, 5]


@pytest.mark.kafka
@pytest.mark.parametrize("threads_per_task", [1, 4])
@pytest.mark.parametrize("failures", [3, 99])
async def test_under_exactly_once_a_retried_records_output_is_committed_once(
        kafka_bootstrap: str, names, threads_per_task: int, failures: int) -> None:
    """One record at a time the failed attempt's output went into the open transaction, so the
    transaction is aborted and the task revived (its attempts go on counting: 99 failures end
    after processing.retry.max.attempts, not in a loop of revivals); in flight the output was
    held in the record's slot and is dropped. Either way a read_committed reader sees each
    record's output once, in the side topic written before the failing call too."""
    from streamloop.transport import open_transport

    cluster = Cluster(open_transport({"bootstrap.servers": kafka_bootstrap}), kafka_bootstrap)
    source, side, sink = names("in"), names("side"), names("out")
    await cluster.create_topics({source: 1, side: 1, sink: 1})
    await cluster.produce(source, [(0, {"i": i}) for i in range(10)], INT, JSON, partitions=1)
    calls: Counter[int] = Counter()

    def flaky(value: dict) -> dict:
        calls[value["i"]] += 1
        if value["i"] == 4 and calls[4] <= failures:
            raise Unavailable("service down for record 4")
        return value

    builder = StreamsBuilder()
    stream = builder.stream(source, key_serde=INT, value_serde=JSON)
    stream.to(side, key_serde=INT, value_serde=JSON)  # before the failing call: in the transaction already
    stream.map_values(flaky, name="call-service").to(sink, key_serde=INT, value_serde=JSON)
    streams = make_streams(builder.build(), kafka_bootstrap, names.app, processing_guarantee="exactly_once_v2",
                           num_threads_per_task=threads_per_task, processing_exception_handler=RetryUnavailable(),
                           processing_retry_backoff_ms=20, processing_retry_backoff_max_ms=50,
                           processing_retry_max_attempts=6, processing_retry_exhausted_answer="continue")
    tp = TopicPartition(source, 0)
    async with streams:
        await eventually_async(lambda: _committed_at(cluster, names.app, tp, 10), 60, "everything committed")
        assert streams.state is ClientState.RUNNING
    assert calls[4] == min(failures + 1, 6)
    side_values = sorted(JSON.deserialize(r.value)["i"] for r in await cluster.read_all(side, read_committed=True))
    assert side_values == list(range(10))
    out_values = sorted(JSON.deserialize(r.value)["i"] for r in await cluster.read_all(sink, read_committed=True))
    assert out_values == [i for i in range(10) if i != 4 or failures < 6]
