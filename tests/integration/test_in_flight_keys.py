"""Records in flight and state stores, on both transports: a record retried or read again after a
PAUSE has its store updates undone, and undone only while no other record of its key has written
since, so an undo never overwrites another record's update; a record released ahead of one waiting
behind its key is committed as done."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import pytest

from streamloop import ClientState, StreamsBuilder
from streamloop.completed_offsets import decode_completed
from streamloop.handlers import StreamThreadExceptionResponse
from streamloop.records import TopicPartition
from streamloop.state import Stores
from streamloop.testing import eventually_async
from tests.integration.test_in_flight import INT, JSON, PauseAndRecord, _committed_is, pausing
from tests.support.apps import make_streams
from tests.support.cluster import Cluster, committed_offset, committed_position

pytestmark = pytest.mark.asyncio


class CountsThenTimesOut:
    """Counts records per key in a store, then times out once for every third record, after the
    store update: its retry must not count it again."""

    def __init__(self, timed_out: set[int]) -> None:
        self.timed_out = timed_out

    def init(self, context) -> None:
        self.counts = context.get_state_store("counts")

    async def process(self, record) -> None:
        await asyncio.sleep(0.002)  # records overlap in flight
        self.counts.put(record.key, (self.counts.get(record.key) or 0) + 1)
        if record.value["i"] % 3 == 0 and record.value["i"] not in self.timed_out:
            self.timed_out.add(record.value["i"])
            raise TimeoutError("the service answered too late")

    def close(self) -> None:
        pass


@pytest.mark.parametrize("threads", [1, 8])
async def test_a_retried_record_updates_its_stores_once_also_in_flight(cluster: Cluster, names, threads: int) -> None:
    """A record retried after a timeout first has its failed attempt's store updates undone: one
    at a time, and in flight (each record in flight journals its own updates)."""
    source = names("in")
    await cluster.create_topics({source: 1})
    await cluster.produce(source, [(i % 4, {"i": i}) for i in range(48)], INT, JSON, partitions=1)
    timed_out: set[int] = set()
    builder = StreamsBuilder()
    builder.add_state_store(Stores.key_value_store_builder(Stores.in_memory_key_value_store("counts"),
                                                          key_serde=INT, value_serde=INT))
    builder.stream(source, key_serde=INT, value_serde=JSON).process(lambda: CountsThenTimesOut(timed_out),
                                                                     stores=["counts"])
    streams = make_streams(builder.build(), cluster.bootstrap, names.app, num_threads_per_task=threads,
                           processing_ordering="key", task_timeout_ms=60_000, retry_backoff_ms=1,
                           default_dsl_store="in_memory")
    async with streams:
        await eventually_async(lambda: len(timed_out) == 16 and _counted(streams, 48), 30,
                               "16 retried records and every record counted")
        counts = streams.store("counts")
        assert {k: counts.get(k) for k in range(4)} == dict.fromkeys(range(4), 12)


def _counted(streams, total: int) -> bool:
    try:
        counts = streams.store("counts")
    except Exception:  # not queryable before the task runs
        return False
    return sum(counts.get(k) or 0 for k in range(4)) >= total


@pytest.mark.parametrize(("guarantee", "ordering"), [("at_least_once", "key"), ("at_least_once", "partition"),
                                                     ("exactly_once_v2", "key")])
async def test_records_in_flight_above_the_pause_update_their_stores_once_after_the_resume(
        cluster: Cluster, names, guarantee: str, ordering: str) -> None:
    """Record 6 is in flight (waiting on I/O) when record 5 pauses the task, and 7-9 are done before
    it. Each count is applied once: record 6 is read again and its first attempt undone; 7-9, their
    output gone already (``key`` ordering), are finished and the resume skips them, or, holding their
    output (``partition`` ordering, exactly-once), are undone, last first, and read again."""
    if guarantee == "exactly_once_v2" and cluster.bootstrap.startswith("memory://"):
        pytest.skip("the memory broker has no transactions")
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    await cluster.produce(source, [(i, {"i": i}) for i in range(10)], INT, JSON, partitions=1)
    calls: Counter[int] = Counter()
    paused = threading.Event()

    async def work(value: dict) -> dict:
        i = value["i"]
        calls[i] += 1
        if i == 5 and calls[i] == 1:
            await eventually_async(lambda: calls[6], 30, "record 6 in flight")
            raise ValueError("record 5 fails once")
        if i == 6 and calls[i] == 1:
            await eventually_async(paused.is_set, 30, "the test to see the pause")
        return value

    streams = pausing(cluster, names, source, sink, work, count=True, processing_ordering=ordering,
                      default_dsl_store="in_memory", processing_guarantee=guarantee)
    tp = TopicPartition(source, 0)
    try:
        async with streams:
            await eventually_async(lambda: streams.paused_local_tasks(), 30, "the task paused at 5")
            paused.set()
            assert await streams.resume_async("0_0", skip=True)
            await eventually_async(lambda: _committed_is(cluster, names.app, tp, 10), 30, "all committed")
    finally:
        paused.set()
    assert PauseAndRecord.asked == [5]
    records = await cluster.read_all(sink, read_committed=guarantee == "exactly_once_v2")
    counts = {INT.deserialize(r.key): INT.deserialize(r.value) for r in records}
    assert counts == {i: 1 for i in range(10) if i != 5}


def _last_counts(records) -> dict[int, int]:
    """The last count each key reached in a count's output topic."""
    return {INT.deserialize(r.key): INT.deserialize(r.value) for r in records}


@pytest.mark.parametrize(("guarantee", "ordering"), [("at_least_once", "partition"), ("exactly_once_v2", "partition"),
                                                     ("exactly_once_v2", "unordered")])
async def test_records_of_one_key_done_above_a_pause_are_undone_to_what_was_there_before_them(
        cluster: Cluster, names, guarantee: str, ordering: str) -> None:
    """Records 6 and 8 share key 60. They are above record 5, which pauses the task, and hold their
    output, so both are undone and read again on resume. Had 8 counted before 6 (8 done while 6 waits
    on I/O), undoing them last offset first would leave 6's pre-image, 8's count: key 60 would count
    once too often. A record waits while another of its key is in flight, so they count in order."""
    if guarantee == "exactly_once_v2" and cluster.bootstrap.startswith("memory://"):
        pytest.skip("the memory broker has no transactions")
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    keys = {6: 60, 8: 60}
    await cluster.produce(source, [(keys.get(i, i), {"i": i}) for i in range(10)], INT, JSON, partitions=1)
    calls: Counter[int] = Counter()
    returned: set[int] = set()

    async def work(value: dict) -> dict:
        i = value["i"]
        calls[i] += 1
        if i == 5 and calls[i] == 1:
            await eventually_async(lambda: 6 in returned, 30, "record 6 counted")
            raise ValueError("record 5 fails once")
        if i == 6 and calls[i] == 1:
            # Record 8 was taken with 7: once 7 returned, 8 ran too, unless it waits behind key 60.
            await eventually_async(lambda: 7 in returned, 30, "record 7 counted")
        returned.add(i)
        return value

    streams = pausing(cluster, names, source, sink, work, count=True, processing_ordering=ordering,
                      default_dsl_store="in_memory", processing_guarantee=guarantee)
    async with streams:
        await eventually_async(lambda: streams.paused_local_tasks(), 30, "the task paused at 5")
        assert await streams.resume_async("0_0", skip=True)
        await eventually_async(lambda: _committed_is(cluster, names.app, TopicPartition(source, 0), 10), 30,
                               "all committed")
    assert PauseAndRecord.asked == [5]
    counts = _last_counts(await cluster.read_all(sink, read_committed=guarantee == "exactly_once_v2"))
    assert counts == {0: 1, 1: 1, 2: 1, 3: 1, 4: 1, 60: 2, 7: 1, 9: 1}


async def test_a_record_of_another_partition_waits_while_a_record_of_its_key_may_still_be_undone(
        cluster: Cluster, names) -> None:
    """Record 1 (key 1, first topic) is done and holds its output behind record 0, which pauses the
    task; record 10 (key 1, second topic) would count on top of it. Undoing record 1 would then take
    record 10's count with it, and record 10 is not read again. So a record waits until no record of
    its key may still be undone: record 10 runs only once record 1 left the window."""
    first, second, sink = names("in1"), names("in2"), names("out")
    await cluster.create_topics({first: 1, second: 1, sink: 1})
    await cluster.produce(first, [(100, {"i": 0}), (1, {"i": 1})], INT, JSON, partitions=1)
    calls: Counter[int] = Counter()
    returned: set[int] = set()

    async def work(value: dict) -> dict:
        i = value["i"]
        calls[i] += 1
        if i == 0 and calls[i] == 1:
            # Records 11 and 10 come once record 1 returned: 10 counts on top of it together with 11,
            # unless it waits behind key 1.
            await eventually_async(lambda: 11 in returned and (not calls[10] or 10 in returned), 30,
                                   "records 11 and 10 counted, or 10 waiting to start")
            raise ValueError("record 0 fails once")
        returned.add(i)
        return value

    streams = pausing(cluster, names, [first, second], sink, work, count=True, processing_ordering="partition",
                      default_dsl_store="in_memory")
    async with streams:
        await eventually_async(lambda: 1 in returned, 30, "record 1 counted")
        await cluster.produce(second, [(2, {"i": 11}), (1, {"i": 10})], INT, JSON, partitions=1)
        await eventually_async(lambda: streams.paused_local_tasks(), 30, "the task paused at 0")
        assert await streams.resume_async("0_0", skip=True)
        await eventually_async(lambda: _committed_is(cluster, names.app, TopicPartition(second, 0), 2), 30,
                               "the second topic committed")
        await eventually_async(lambda: _committed_is(cluster, names.app, TopicPartition(first, 0), 2), 30,
                               "the first topic committed")
    assert PauseAndRecord.asked == [0]
    assert _last_counts(await cluster.read_all(sink)) == {1: 2, 2: 1}


class CountsThenWaitsThenTimesOut:
    """Counts records per key in a store. Record 0's first attempt, after its update, waits until
    record ``until`` counted, then times out: its retry undoes its update first."""

    def __init__(self, until: int, started: set[int], counted: set[int]) -> None:
        self.until = until
        self.started = started
        self.counted = counted
        self.timed_out = False

    def init(self, context) -> None:
        self.counts = context.get_state_store("counts")

    async def process(self, record) -> None:
        i = record.value["i"]
        self.started.add(i)
        self.counts.put(record.key, (self.counts.get(record.key) or 0) + 1)
        if i == 0 and not self.timed_out:
            self.timed_out = True
            await eventually_async(lambda: self.until in self.counted, 30, f"record {self.until} counted")
            raise TimeoutError("the service answered too late")
        self.counted.add(i)

    def close(self) -> None:
        pass


@pytest.mark.parametrize(("ordering", "topics"), [("partition", 1), ("unordered", 1), ("key", 2)])
async def test_a_retried_records_undo_keeps_the_update_of_another_record_of_its_key(
        cluster: Cluster, names, ordering: str, topics: int) -> None:
    """Records 0 and 2 share key 0 (under ``key`` ordering on two topics of one task: the same key in
    both). Record 0 counts, waits, times out and is retried: its undo must not take record 2's count
    with it, so record 2 waits while record 0 is in flight. Record 0 waits for the record taken after
    2 (1 under ``partition`` ordering, where 2 holds up its partition; else 3, taken ahead of it),
    so that 2 counted on top of it unless it waits."""
    sources = [names(f"in{n}") for n in range(topics)]
    await cluster.create_topics(dict.fromkeys(sources, 1))
    records = [(0, 0), (1, 1), (2, 0), (3, 3)]  # (i, key)
    # With two topics: 0 and 1 in the first, 2 and 3 in the second, produced once record 0 started.
    layout = [records] if topics == 1 else [records[:2], records[2:]]
    await cluster.produce(sources[0], [(key, {"i": i}) for i, key in layout[0]], INT, JSON, partitions=1)
    started: set[int] = set()
    counted: set[int] = set()
    until = 1 if ordering == "partition" else 3
    builder = StreamsBuilder()
    builder.add_state_store(Stores.key_value_store_builder(Stores.in_memory_key_value_store("counts"),
                                                          key_serde=INT, value_serde=INT))
    builder.stream(sources, key_serde=INT, value_serde=JSON).process(
        lambda: CountsThenWaitsThenTimesOut(until, started, counted), stores=["counts"])
    streams = make_streams(builder.build(), cluster.bootstrap, names.app, num_threads_per_task=4,
                           processing_ordering=ordering, task_timeout_ms=60_000, retry_backoff_ms=1,
                           default_dsl_store="in_memory")
    async with streams:
        if topics == 2:
            await eventually_async(lambda: 0 in started, 30, "record 0 started")
            await cluster.produce(sources[1], [(key, {"i": i}) for i, key in layout[1]], INT, JSON, partitions=1)
        await eventually_async(lambda: counted >= {0, 1, 2, 3}, 30, "every record counted")
        counts = streams.store("counts")
        assert {k: counts.get(k) for k in (0, 1, 3)} == {0: 2, 1: 1, 3: 1}


@pytest.mark.parametrize("last_threads", [4, 1])
async def test_a_record_released_ahead_of_one_waiting_behind_its_key_is_not_run_again_after_a_crash(
        cluster: Cluster, names, last_threads: int) -> None:
    """Exactly-once, ``key`` ordering: record 1 waits behind record 0 (key 1), and record 2, taken
    ahead of it, is released with 0 into a transaction whose commit stays at 1. That commit must list
    2 as done, or the next owner runs it again and its output is in two committed transactions. The
    next owner, which skips 2 and crashes too (record 1 in flight again), must keep listing it in its
    own commits (the first always goes out: a record of a second topic of the task makes it seen).
    The last owner skips it too, also one that processes one record at a time (``last_threads`` 1)."""
    if cluster.bootstrap.startswith("memory://"):
        pytest.skip("the memory broker has no transactions")
    source, other, sink = names("in"), names("other"), names("out")
    await cluster.create_topics({source: 1, other: 1, sink: 1})
    await cluster.produce(source, [(1, {"i": 0}), (1, {"i": 1}), (2, {"i": 2})], INT, JSON, partitions=1)
    calls: Counter[int] = Counter()
    owner = [1]
    crash = {1: asyncio.Event(), 2: asyncio.Event()}

    async def work(value: dict) -> dict:
        i = value["i"]
        calls[i] += 1
        if i == 0 and owner[0] == 1:
            await eventually_async(lambda: calls[2], 30, "record 2 taken ahead of 1")
        if i == 1 and owner[0] in crash:
            await crash[owner[0]].wait()
            raise RuntimeError("the client dies with record 1 in flight")
        return value

    builder = StreamsBuilder()
    (builder.stream([source, other], key_serde=INT, value_serde=JSON).map_values(work)
            .to(sink, key_serde=INT, value_serde=JSON))
    tp = TopicPartition(source, 0)

    def streams(threads: int = 4):
        return make_streams(builder.build(), cluster.bootstrap, names.app, num_threads_per_task=threads,
                            processing_ordering="key", processing_guarantee="exactly_once_v2")

    async def listed() -> set[int]:
        position = await committed_position(cluster, names.app, tp)
        return set() if position is None else decode_completed(position[0], position[1])

    async def crashes(app, committed, then=None) -> None:
        app.set_uncaught_exception_handler(lambda exc: StreamThreadExceptionResponse.SHUTDOWN_CLIENT)
        await app.start_async()
        try:
            await eventually_async(lambda: calls[1], 30, "record 1 in flight")
            if then is not None:
                await then()
            await eventually_async(committed, 30, "the commit awaited")
            crash[owner[0]].set()
            assert await app.wait_for_state_async(ClientState.ERROR, timeout=30)
        finally:
            crash[owner[0]].set()
            await app.close_async()

    async def listing() -> bool:
        return await committed_offset(cluster, names.app, tp) == 1 and await listed() == {2}

    await crashes(streams(), listing)
    committed = [JSON.deserialize(r.value)["i"] for r in await cluster.read_all(sink, read_committed=True)]
    assert sorted(committed) == [0, 2]
    # The second owner skips 2 as it takes 1 (they come in one fetch), then commits with record 1 in
    # flight, once it processed record 5 of the other topic.
    owner[0], calls = 2, Counter()
    await crashes(streams(), lambda: _committed_is(cluster, names.app, TopicPartition(other, 0), 1),
                  lambda: cluster.produce(other, [(5, {"i": 5})], INT, JSON, partitions=1))
    assert calls[2] == 0
    assert await committed_offset(cluster, names.app, tp) == 1
    assert await listed() == {2}  # the second owner's commit lists what it skipped
    owner[0], calls = 3, Counter()
    async with streams(last_threads):
        await eventually_async(lambda: _committed_is(cluster, names.app, tp, 3), 30, "everything committed")
    assert set(calls) == {1}  # record 2, released above the commit, was skipped by both
    output = [JSON.deserialize(r.value)["i"] for r in await cluster.read_all(sink, read_committed=True)]
    assert sorted(output) == [0, 1, 2, 5]


async def test_one_record_at_a_time_after_records_in_flight_keeps_listing_what_it_has_not_reached(
        cluster: Cluster, names) -> None:
    """Exactly-once: owner 1 (records in flight, ``key`` ordering) commits at 1 with records 2 and 4
    done above it (1 and 3 waited behind record 0's key), and dies. Owner 2 processes one record at
    a time: it runs 1, skips 2 and pauses at 3, which commits at 3. That commit must still list 4,
    or owner 3 runs 4 again and its output is in two committed transactions."""
    if cluster.bootstrap.startswith("memory://"):
        pytest.skip("the memory broker has no transactions")
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    keys = {0: 1, 1: 1, 2: 2, 3: 1, 4: 4}
    await cluster.produce(source, [(keys[i], {"i": i}) for i in range(5)], INT, JSON, partitions=1)
    calls: Counter[int] = Counter()
    owner = [1]
    crash = asyncio.Event()

    async def work(value: dict) -> dict:
        i = value["i"]
        calls[i] += 1
        if i == 0 and owner[0] == 1:
            await eventually_async(lambda: calls[2] and calls[4], 30, "records 2 and 4 taken ahead of 1")
        if i == 1 and owner[0] == 1:
            await crash.wait()
            raise RuntimeError("the client dies with record 1 in flight")
        if i == 3 and owner[0] == 2:
            raise ValueError("record 3 fails: the handler pauses the task")
        return value

    builder = StreamsBuilder()
    builder.stream(source, key_serde=INT, value_serde=JSON).map_values(work).to(sink, key_serde=INT, value_serde=JSON)
    tp = TopicPartition(source, 0)

    def streams(threads: int, **overrides):
        return make_streams(builder.build(), cluster.bootstrap, names.app, num_threads_per_task=threads,
                            processing_ordering="key", processing_guarantee="exactly_once_v2", **overrides)

    async def committed(offset: int, done: set[int]) -> bool:
        position = await committed_position(cluster, names.app, tp)
        return position is not None and position[0] == offset and decode_completed(*position) == done

    first = streams(4)
    first.set_uncaught_exception_handler(lambda exc: StreamThreadExceptionResponse.SHUTDOWN_CLIENT)
    await first.start_async()
    try:
        await eventually_async(lambda: committed(1, {2, 4}), 30, "a commit at 1 listing 2 and 4")
        crash.set()
        assert await first.wait_for_state_async(ClientState.ERROR, timeout=30)
    finally:
        crash.set()
        await first.close_async()
    owner[0] = 2
    async with streams(1, processing_exception_handler=PauseAndRecord) as second:
        await eventually_async(lambda: second.paused_local_tasks(), 30, "owner 2 paused at 3")
        await eventually_async(lambda: _committed_is(cluster, names.app, tp, 3), 30, "owner 2's commit at 3")
    position = await committed_position(cluster, names.app, tp)
    assert position is not None and decode_completed(*position) == {4}  # what owner 2 has not reached
    owner[0] = 3
    calls.clear()
    async with streams(4):
        await eventually_async(lambda: _committed_is(cluster, names.app, tp, 5), 30, "everything committed")
    assert set(calls) == {3}
    output = [JSON.deserialize(r.value)["i"] for r in await cluster.read_all(sink, read_committed=True)]
    assert sorted(output) == [0, 1, 2, 3, 4]
