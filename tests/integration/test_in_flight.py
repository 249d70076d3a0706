"""num.threads.per.task on both transports: commits stop at the lowest record in flight, and a
restart skips the records completed above it (recorded in the commit metadata)."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import pytest

from streamloop import ClientState, KafkaStreams, StreamsBuilder
from streamloop.completed_offsets import decode_completed
from streamloop.handlers import StreamThreadExceptionResponse
from streamloop.records import TopicPartition
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.testing import eventually_async
from tests.support.apps import make_streams
from tests.support.cluster import Cluster, committed_offset, committed_position

pytestmark = pytest.mark.asyncio

INT, JSON = IntegerSerde(), JsonSerde()


def topology(source: str, sink: str, calls: Counter[int], stuck: int | None, release: threading.Event,
             crash: threading.Event):
    async def work(value: dict) -> dict:
        calls[value["i"]] += 1
        if value["i"] == stuck:
            while not release.is_set():
                await asyncio.sleep(0.01)
            if crash.is_set():
                raise RuntimeError("crash while the stuck record was in flight")
        return value

    builder = StreamsBuilder()
    builder.stream(source, key_serde=INT, value_serde=JSON).map_values(work).to(sink, key_serde=INT, value_serde=JSON)
    return builder.build()


async def test_commits_stop_at_the_lowest_record_in_flight_and_a_restart_skips_completed_ones(
        cluster: Cluster, names) -> None:
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    await cluster.produce(source, [(0, {"i": i}) for i in range(20)], INT, JSON, partitions=1)
    calls: Counter[int] = Counter()
    release, crash = threading.Event(), threading.Event()
    first = make_streams(topology(source, sink, calls, 5, release, crash), cluster.bootstrap, names.app,
                         num_threads_per_task=32, processing_ordering="unordered")
    first.set_uncaught_exception_handler(lambda exc: StreamThreadExceptionResponse.SHUTDOWN_CLIENT)
    await first.start_async()
    try:
        await eventually_async(lambda: sum(calls.values()) == 20, 30, "all 20 records started")
        tp = TopicPartition(source, 0)
        # Everything but offset 5 is done; the commit must not pass it, and its metadata lists the rest.
        await eventually_async(lambda: _committed_is(cluster, names.app, tp, 5), 30, "a commit at offset 5")
        done_above = set(range(6, 20))

        async def metadata_lists_the_rest() -> bool:
            position = await committed_position(cluster, names.app, tp)
            return position is not None and decode_completed(position[0], position[1]) == done_above

        await eventually_async(metadata_lists_the_rest, 30, "offsets 6..19 in the commit metadata")
        crash.set()
        release.set()  # offset 5 now fails: the client dies without committing further
        assert await first.wait_for_state_async(ClientState.ERROR, timeout=30)
    finally:
        release.set()
        await first.close_async()
    assert await committed_offset(cluster, names.app, tp) == 5

    again: Counter[int] = Counter()
    release2, no_crash = threading.Event(), threading.Event()
    release2.set()
    second = make_streams(topology(source, sink, again, None, release2, no_crash), cluster.bootstrap, names.app,
                          num_threads_per_task=32, processing_ordering="unordered")
    async with second:
        await eventually_async(lambda: _committed_is(cluster, names.app, tp, 20), 30, "everything committed")
    assert set(again) == {5}  # the records done above the watermark were skipped, not redone


async def _committed_is(cluster: Cluster, group: str, tp: TopicPartition, offset: int) -> bool:
    return await committed_offset(cluster, group, tp) == offset


async def test_a_record_stuck_in_flight_holds_back_later_output_under_partition_ordering(
        cluster: Cluster, names) -> None:
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    await cluster.produce(source, [(0, {"i": i}) for i in range(20)], INT, JSON, partitions=1)
    calls: Counter[int] = Counter()
    release, crash = threading.Event(), threading.Event()
    streams = make_streams(topology(source, sink, calls, 3, release, crash), cluster.bootstrap, names.app,
                           num_threads_per_task=4, processing_ordering="partition")
    async with streams:
        # 0..2 are done and released; 3 is stuck; 4..6 are done but held behind it: the window
        # of 4 is full, so nothing after 6 starts (back-pressure instead of memory).
        await eventually_async(lambda: len(calls) >= 7, 30, "records up to 6 started")
        out = await cluster.read(sink, 3)
        assert [JSON.deserialize(r.value)["i"] for r in out] == [0, 1, 2]
        assert sorted(calls) == list(range(7))
        release.set()
        out = await cluster.read(sink, 20)
    assert [JSON.deserialize(r.value)["i"] for r in sorted(out, key=lambda r: r.offset)] == list(range(20))


async def test_a_timed_out_record_is_retried_in_place_while_others_fly_and_order_holds(
        cluster: Cluster, names) -> None:
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    await cluster.produce(source, [(0, {"i": i}) for i in range(30)], INT, JSON, partitions=1)
    attempts: Counter[int] = Counter()

    async def flaky(value: dict) -> dict:
        attempts[value["i"]] += 1
        if value["i"] == 7 and attempts[7] <= 2:
            raise TimeoutError("the service did not answer")
        await asyncio.sleep(0.001)
        return value

    builder = StreamsBuilder()
    builder.stream(source, key_serde=INT, value_serde=JSON).map_values(flaky).to(sink, key_serde=INT, value_serde=JSON)
    streams = make_streams(builder.build(), cluster.bootstrap, names.app, num_threads_per_task=8,
                           retry_backoff_ms=5, retry_backoff_max_ms=10)
    async with streams:
        out = await cluster.read(sink, 30)
        assert streams.metric("failed-stream-threads") == 0
    assert [JSON.deserialize(r.value)["i"] for r in sorted(out, key=lambda r: r.offset)] == list(range(30))
    assert attempts[7] == 3
    assert len(await cluster.read_all(sink)) == 30  # the failed attempts left no output behind


async def test_pause_with_records_in_flight_commits_at_the_failed_record_and_resume_skips_it(
        cluster: Cluster, names) -> None:
    from streamloop.handlers import LogAndPauseExceptionHandler
    from tests.integration.test_pause_resume import BAD, good, produce

    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    await produce(cluster, source, [(0, 0, good(i)) for i in range(3)] + [(0, 0, BAD)]
                  + [(0, 0, good(i)) for i in range(4, 12)])
    builder = StreamsBuilder()
    builder.stream(source, key_serde=INT, value_serde=JSON).to(sink, key_serde=INT, value_serde=JSON)
    streams = make_streams(builder.build(), cluster.bootstrap, names.app, num_threads_per_task=8,
                           default_deserialization_exception_handler=LogAndPauseExceptionHandler)
    tp = TopicPartition(source, 0)
    async with streams:
        await eventually_async(lambda: streams.paused_local_tasks(), 30, "the task paused")
        await eventually_async(lambda: _committed_is(cluster, names.app, tp, 3), 30, "a commit at the bad record")
        assert sorted(JSON.deserialize(r.value)["i"] for r in await cluster.read_all(sink)) == [0, 1, 2]
        assert await streams.resume_async("0_0", skip=True)
        out = await cluster.read(sink, 11)
    assert sorted(JSON.deserialize(r.value)["i"] for r in out) == [0, 1, 2, *range(4, 12)]


async def test_more_records_than_the_buffer_flow_through_with_records_in_flight(cluster: Cluster, names) -> None:
    """Back-pressure pauses a partition whose task buffer is full; released output must resume it."""
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    await cluster.produce(source, [(0, {"i": i}) for i in range(3000)], INT, JSON, partitions=1)

    async def io(value: dict) -> dict:
        await asyncio.sleep(0)
        return value

    builder = StreamsBuilder()
    builder.stream(source, key_serde=INT, value_serde=JSON).map_values(io).to(sink, key_serde=INT, value_serde=JSON)
    streams = make_streams(builder.build(), cluster.bootstrap, names.app, num_threads_per_task=16,
                           buffered_records_per_partition=100, commit_interval_ms=60_000)
    async with streams:
        out = await cluster.read(sink, 3000, timeout=60)
    assert [JSON.deserialize(r.value)["i"] for r in sorted(out, key=lambda r: r.offset)][:3000] == list(range(3000))


async def test_blocking_functions_run_off_the_loop_on_a_bounded_pool(cluster: Cluster, names) -> None:
    import time

    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    await cluster.produce(source, [(0, {"i": i}) for i in range(40)], INT, JSON, partitions=1)
    lock = threading.Lock()
    seen = {"now": 0, "max": 0, "threads": set()}

    def lookup(value: dict) -> dict:  # a blocking client call
        with lock:
            seen["now"] += 1
            seen["max"] = max(seen["max"], seen["now"])
            seen["threads"].add(threading.current_thread().name)
        time.sleep(0.02)
        with lock:
            seen["now"] -= 1
        return value

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .map_values(lookup, blocking=True, concurrency=8)
            .to(sink, key_serde=INT, value_serde=JSON))
    async with make_streams(builder.build(), cluster.bootstrap, names.app):
        out = await cluster.read(sink, 40)
    assert [JSON.deserialize(r.value)["i"] for r in sorted(out, key=lambda r: r.offset)] == list(range(40))
    assert 1 < seen["max"] <= 8
    assert not any("StreamThread" in name for name in seen["threads"])



class StreamTimeTicks:
    """Forwards a record ``{"tick": t}`` at each stream-time punctuation (every 1 000 ms) and each
    input record as it is."""

    def __init__(self) -> None:
        self.context = None

    def init(self, context) -> None:
        from streamloop.processors.api import PunctuationType

        self.context = context
        context.schedule(1_000, PunctuationType.STREAM_TIME, self._tick)

    def _tick(self, timestamp: int) -> None:
        from streamloop.records import Record

        self.context.forward(Record(-1, {"tick": timestamp}, timestamp))

    async def process(self, record) -> None:
        await asyncio.sleep(0.001)  # a little I/O: records overlap when in flight
        self.context.forward(record)

    def close(self) -> None:
        pass


@pytest.mark.parametrize(("threads", "ordering"), [(1, "partition"), (4, "partition"), (4, "key"), (4, "unordered")])
async def test_stream_time_moves_and_punctuates_with_records_in_flight(
        cluster: Cluster, names, threads: int, ordering: str) -> None:
    """Records in flight move stream time as one record at a time does: stream-time punctuation
    fires at the same times, and each commit carries its partition's time (sl2 metadata)."""
    from streamloop.completed_offsets import decode_metadata

    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    for i in range(12):  # timestamps 0 .. 5 500
        await cluster.produce(source, [(i % 3, {"i": i})], INT, JSON, partitions=1, timestamp=i * 500)
    builder = StreamsBuilder()
    builder.stream(source, key_serde=INT, value_serde=JSON).process(StreamTimeTicks).to(
        sink, key_serde=INT, value_serde=JSON)
    streams = make_streams(builder.build(), cluster.bootstrap, names.app, num_threads_per_task=threads,
                           processing_ordering=ordering)
    tp = TopicPartition(source, 0)

    async def ticks() -> list[int]:
        out = [JSON.deserialize(r.value) for r in await cluster.read_all(sink)]
        return [v["tick"] for v in out if "tick" in v]

    async def committed_time() -> int:
        committed = await committed_position(cluster, names.app, tp)
        return -1 if committed is None else decode_metadata(committed[0], committed[1]).partition_time

    async with streams:
        await eventually_async(lambda: _at_least(ticks, 5), 30, "stream-time ticks up to 5 000")
        await eventually_async(lambda: _equals(committed_time, 5_500), 30, "a commit carrying partition time 5 500")
    assert await ticks() == [1_000, 2_000, 3_000, 4_000, 5_000]  # as one record at a time gives them


async def _at_least(values, count: int) -> bool:
    return len(await values()) >= count


async def _equals(value, expected: int) -> bool:
    return await value() == expected


class PauseAndRecord:
    """A processing handler that PAUSEs and keeps the offsets it was asked about."""

    asked: list[int] = []  # noqa: RUF012 - the test resets it; handlers are made by the client

    def configure(self, config: object) -> None:
        pass

    def handle(self, context: object, record: object, exception: BaseException) -> object:
        from streamloop.handlers import ProcessingHandlerResponse

        PauseAndRecord.asked.append(context.offset)  # type: ignore[attr-defined]
        return ProcessingHandlerResponse.PAUSE


def pausing(cluster: Cluster, names, source: str | list[str], sink: str, work, count: bool = False,
            **overrides) -> KafkaStreams:
    """``work`` over ``source`` into ``sink`` (counted per key with ``count``), four records in flight
    per task, and every failure answered PAUSE by ``PauseAndRecord`` (which starts empty)."""
    builder = StreamsBuilder()
    mapped = builder.stream(source, key_serde=INT, value_serde=JSON).map_values(work)
    if count:
        mapped.group_by_key().count().to_stream().to(sink, key_serde=INT, value_serde=INT)
    else:
        mapped.to(sink, key_serde=INT, value_serde=JSON)
    PauseAndRecord.asked = []
    return make_streams(builder.build(), cluster.bootstrap, names.app, num_threads_per_task=4,
                        processing_exception_handler=PauseAndRecord, **overrides)


async def test_records_in_flight_above_the_pause_when_the_resume_comes_are_read_again_not_released(
        cluster: Cluster, names) -> None:
    """Records 6-8 are still in flight when the task, paused at 5, is resumed past it: the partition
    is read again from 6, so those first attempts are void. Their output does not leave (each record
    leaves once), a failure of theirs is not asked about (the second attempt is), and they do not
    move the position past records not read again yet."""
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    await cluster.produce(source, [(i, {"i": i}) for i in range(20)], INT, JSON, partitions=1)
    calls: Counter[int] = Counter()
    release = threading.Event()

    async def work(value: dict) -> dict:
        i = value["i"]
        calls[i] += 1
        if i == 5 and calls[i] == 1:
            await eventually_async(lambda: calls[8], 30, "records 6-8 in flight")
            raise ValueError("record 5 fails once")
        if i in (6, 7, 8) and calls[i] == 1:
            await eventually_async(release.is_set, 30, "the test to release the record")
            if i == 7:
                raise ValueError("record 7 fails on its first attempt, after the resume")
        return value

    streams = pausing(cluster, names, source, sink, work)
    tp = TopicPartition(source, 0)
    try:
        async with streams:
            await eventually_async(lambda: streams.paused_local_tasks(), 30, "the task paused at 5")
            assert calls[6] == calls[7] == calls[8] == 1
            assert await streams.resume_async("0_0", skip=True)
            release.set()  # the first attempts finish after the resume
            await eventually_async(lambda: _committed_is(cluster, names.app, tp, 20), 30, "all committed")
            assert not streams.paused_local_tasks()
    finally:
        release.set()
    assert PauseAndRecord.asked == [5]
    assert [calls[i] for i in (6, 7, 8)] == [2, 2, 2]  # read again
    output = Counter(JSON.deserialize(r.value)["i"] for r in await cluster.read_all(sink))
    assert output == Counter(i for i in range(20) if i != 5)


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once_v2"])
async def test_a_pause_under_key_ordering_keeps_and_reads_again_the_records_it_dropped_below_the_paused_one(
        cluster: Cluster, names, guarantee: str) -> None:
    """Under ``key`` ordering records 2 (key 2) and 3 (key 3) are taken while record 1 (key 1) waits
    in the buffer behind record 0 (key 1, in flight). Record 3 pauses the task, which drops the
    buffer: the commit stays below record 1 once record 0 is done, and the resume reads the partition
    again from it, skipping record 2 (done: its output left, or, under exactly-once, left with 0's)."""
    if guarantee == "exactly_once_v2" and cluster.bootstrap.startswith("memory://"):
        pytest.skip("the memory broker has no transactions")
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    await cluster.produce(source, [(key, {"i": i}) for i, key in enumerate([1, 1, 2, 3])], INT, JSON, partitions=1)
    calls: Counter[int] = Counter()
    release = threading.Event()

    async def work(value: dict) -> dict:
        i = value["i"]
        calls[i] += 1
        if i == 0:
            await eventually_async(release.is_set, 30, "the test to release the record")
        if i == 3:
            await eventually_async(lambda: calls[2], 30, "record 2 done")
            raise ValueError("record 3 fails")
        return value

    streams = pausing(cluster, names, source, sink, work, processing_ordering="key", processing_guarantee=guarantee)
    tp = TopicPartition(source, 0)
    try:
        async with streams:
            await eventually_async(lambda: streams.paused_local_tasks(), 30, "the task paused at 3")
            release.set()
            await eventually_async(lambda: _committed_is(cluster, names.app, tp, 1), 30,
                                   "committed up to record 1, which never ran")
            assert calls[1] == 0
            assert await streams.resume_async("0_0", skip=True)
            await eventually_async(lambda: _committed_is(cluster, names.app, tp, 4), 30, "all committed")
    finally:
        release.set()
    assert PauseAndRecord.asked == [3]
    assert calls == Counter([0, 1, 2, 3])
    records = await cluster.read_all(sink, read_committed=guarantee == "exactly_once_v2")
    assert sorted(JSON.deserialize(r.value)["i"] for r in records) == [0, 1, 2]


async def two_partitions(cluster: Cluster, names) -> tuple[str, str, str]:
    """Topics ``first`` (records 0, 1) and ``second`` (100-102) read by one task, and a sink. The second
    partition's records are older: they are taken first."""
    first, second, sink = names("in1"), names("in2"), names("out")
    await cluster.create_topics({first: 1, second: 1, sink: 1})
    await cluster.produce(second, [(i, {"i": i}) for i in (100, 101, 102)], INT, JSON, partitions=1, timestamp=1_000)
    await cluster.produce(first, [(i, {"i": i}) for i in (0, 1)], INT, JSON, partitions=1, timestamp=2_000)
    return first, second, sink


async def test_a_resume_leaves_the_other_partitions_records_in_flight_to_finish_once(cluster: Cluster, names) -> None:
    """A task of two partitions pauses on one while records of the other are in flight (101) and done
    above it (102): the resume does not read those again from the other partition's position (1)."""
    first, second, sink = await two_partitions(cluster, names)
    calls: Counter[int] = Counter()
    release = threading.Event()

    async def work(value: dict) -> dict:
        i = value["i"]
        calls[i] += 1
        if i == 101:
            await eventually_async(release.is_set, 30, "the test to release the record")
        if i == 1:
            raise ValueError("record 1 fails")
        return value

    streams = pausing(cluster, names, [first, second], sink, work)
    try:
        async with streams:
            await eventually_async(lambda: streams.paused_local_tasks(), 30, "the task paused at 1")
            assert calls[100] == calls[101] == calls[102] == 1
            assert await streams.resume_async("0_0", skip=True)
            release.set()  # 101 finishes after the resume
            await eventually_async(lambda: _committed_is(cluster, names.app, TopicPartition(second, 0), 3), 30,
                                   "the second partition committed")
            await eventually_async(lambda: _committed_is(cluster, names.app, TopicPartition(first, 0), 2), 30,
                                   "the first partition committed")
    finally:
        release.set()
    assert calls == Counter([0, 1, 100, 101, 102])
    assert sorted(JSON.deserialize(r.value)["i"] for r in await cluster.read_all(sink)) == [0, 100, 101, 102]


@pytest.mark.parametrize(("guarantee", "ordering"), [("at_least_once", "partition"), ("at_least_once", "key"),
                                                     ("at_least_once", "unordered"), ("exactly_once_v2", "partition")])
async def test_a_record_of_another_partition_failing_while_the_task_is_paused_is_read_again_on_resume(
        cluster: Cluster, names, guarantee: str, ordering: str) -> None:
    """A task of two partitions pauses at record 1 of one while record 101 of the other is in flight;
    101 then fails and its handler answers PAUSE too. The task stays paused (it does not fail), the
    commit of the other partition stops at 101, and the resume reads it again from there."""
    if guarantee == "exactly_once_v2" and cluster.bootstrap.startswith("memory://"):
        pytest.skip("the memory broker has no transactions")
    first, second, sink = await two_partitions(cluster, names)
    calls: Counter[int] = Counter()
    paused = threading.Event()

    async def work(value: dict) -> dict:
        i = value["i"]
        calls[i] += 1
        if i == 101 and calls[i] == 1:
            await eventually_async(paused.is_set, 30, "the test to see the pause")
            raise ValueError("record 101 fails once, while the task is paused")
        if i == 1 and calls[i] == 1:
            raise ValueError("record 1 fails once")
        return value

    streams = pausing(cluster, names, [first, second], sink, work, processing_ordering=ordering,
                      processing_guarantee=guarantee)
    try:
        async with streams:
            await eventually_async(lambda: streams.paused_local_tasks(), 30, "the task paused at 1")
            paused.set()
            await eventually_async(lambda: len(PauseAndRecord.asked) == 2, 30, "the handler asked about 101")
            await eventually_async(lambda: _committed_is(cluster, names.app, TopicPartition(second, 0), 1), 30,
                                   "the second partition committed up to 101")
            assert streams.paused_local_tasks()  # still paused, not failed
            assert await streams.resume_async("0_0", skip=False)
            await eventually_async(lambda: _committed_is(cluster, names.app, TopicPartition(second, 0), 3), 30,
                                   "the second partition committed")
            await eventually_async(lambda: _committed_is(cluster, names.app, TopicPartition(first, 0), 2), 30,
                                   "the first partition committed")
    finally:
        paused.set()
    assert PauseAndRecord.asked == [1, 1]  # record 1, then record 101: offset 1 of each partition
    assert (calls[101], calls[1]) == (2, 2)
    assert Counter(JSON.deserialize(r.value)["i"] for r in await cluster.read_all(
        sink, read_committed=guarantee == "exactly_once_v2")) == Counter(
        [0, 1, 100, 101, 102])


async def test_a_record_whose_back_off_ends_after_a_pause_below_it_or_the_resume_is_read_again_not_run(
        cluster: Cluster, names) -> None:
    """Under ``key`` ordering record 2 times out and backs off (2 s: the task's second timeout in a row)
    while record 1 waits behind record 0 (same key, backing off 1 s). Record 0 then passes, record 1
    pauses the task, and the test resumes past it. Record 2's back-off ends after the resume, which
    reads it again: the attempt due then does not run (run, its count stayed and it counted twice)."""
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    keys = [10, 10, 20, 30, 40, 50]
    await cluster.produce(source, [(key, {"i": i}) for i, key in enumerate(keys)], INT, JSON, partitions=1)
    calls: Counter[int] = Counter()

    def work(value: dict) -> dict:
        i = value["i"]
        calls[i] += 1
        if i in (0, 2) and calls[i] == 1:
            raise TimeoutError(f"record {i} times out once")
        if i == 1:
            raise ValueError("record 1 fails")
        return value

    streams = pausing(cluster, names, source, sink, work, count=True, processing_ordering="key",
                      task_timeout_ms=60_000, retry_backoff_ms=1_000, retry_backoff_max_ms=10_000,
                      default_dsl_store="in_memory")
    tp = TopicPartition(source, 0)
    async with streams:
        await eventually_async(lambda: streams.paused_local_tasks(), 30, "the task paused at 1")
        assert calls[2] == 1  # still backing off
        assert await streams.resume_async("0_0", skip=True)
        await eventually_async(lambda: _committed_is(cluster, names.app, tp, 6), 30, "all committed")
    assert PauseAndRecord.asked == [1]
    records = await cluster.read_all(sink)
    counts = {INT.deserialize(r.key): INT.deserialize(r.value) for r in records}
    assert counts == {10: 1, 20: 1, 30: 1, 40: 1, 50: 1}
