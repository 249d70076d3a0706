"""KIP-663: adding and removing stream threads at runtime, on the memory broker and on real Kafka.

One test per behaviour of issue 3 (Kafka Streams' AdjustStreamThreadCountTest and
KafkaStreamsTest name the same checklist). Every wait has a deadline; the blocking
client API is only called through its ``_async`` form or ``anyio.to_thread`` so the
test's loop is never blocked.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
import pytest
import pytest_asyncio

from streamloop import (
    ClientState,
    KafkaStreams,
    StreamsBuilder,
    StreamsTimeoutError,
    StreamThreadState,
    ThreadMetadata,
    Topology,
)
from streamloop.handlers import StreamThreadExceptionResponse
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.testing import eventually_async
from streamloop.transport.base import ProducerSettings
from tests.support.apps import streams_config
from tests.support.cluster import EVERY_BROKER, Cluster

pytestmark = pytest.mark.asyncio

INT, JSON = IntegerSerde(), JsonSerde()
DEADLINE = 30.0
PARTITIONS = 4
ALL_TASKS = [f"0_{p}" for p in range(PARTITIONS)]
Response = StreamThreadExceptionResponse


# -- the application under test ------------------------------------------------------------


@dataclass(frozen=True)
class Topics:
    source: str
    sink: str


@pytest_asyncio.fixture
async def topics(cluster: Cluster, names) -> Topics:
    result = Topics(names("input"), names("output"))
    await cluster.create_topics({result.source: PARTITIONS, result.sink: PARTITIONS})
    return result


def tag_thread(value: dict) -> dict:
    """The default step: the output says which stream thread processed the record."""
    return {**value, "thread": threading.current_thread().name}


def relay_topology(topics: Topics, step: Callable[[dict], Any] = tag_thread) -> Topology:
    """``source`` → ``step`` (plain or async, on the record's value) → ``sink``; keys are ints."""
    builder = StreamsBuilder()
    (builder.stream(topics.source, key_serde=INT, value_serde=JSON)
            .map_values(step)
            .to(topics.sink, key_serde=INT, value_serde=JSON))
    return builder.build()


def new_streams(cluster: Cluster, names, topics: Topics, step: Callable[[dict], Any] = tag_thread,
                **overrides: Any) -> KafkaStreams:
    overrides.setdefault("client_id", names("client"))
    return KafkaStreams(relay_topology(topics, step),
                        streams_config(cluster.bootstrap, names.app, **overrides))


def thread_name(streams: KafkaStreams, index: int) -> str:
    return f"{streams.client_id}-StreamThread-{index}"


async def produce(cluster: Cluster, topics: Topics, values: list[dict]) -> None:
    """``values[i]`` with key ``i``, so in partition ``i % PARTITIONS``."""
    await cluster.produce(topics.source, list(enumerate(values)), INT, JSON, partitions=PARTITIONS)


async def output_values(cluster: Cluster, topics: Topics) -> list[dict]:
    return [JSON.deserialize(r.value) for r in await cluster.read_all(topics.sink)]


async def wait_for_output(cluster: Cluster, topics: Topics, seqs: set[int], what: str) -> list[dict]:
    """Every ``seq`` of ``seqs`` in the output; returns the output."""
    async def contains() -> list[dict] | None:
        out = await output_values(cluster, topics)
        return out if seqs <= {v["seq"] for v in out} else None
    return await eventually_async(contains, DEADLINE, what, interval=0.1)


def tasks_of(thread: ThreadMetadata) -> list[str]:
    return sorted(str(task.task_id) for task in thread.active_tasks)


def settled(streams: KafkaStreams, threads: int) -> bool:
    """RUNNING with ``threads`` RUNNING threads that own every task between them, each some."""
    if streams.state is not ClientState.RUNNING:
        return False
    meta = streams.metadata_for_local_threads()
    if len(meta) != threads or any(t.thread_state is not StreamThreadState.RUNNING for t in meta):
        return False
    owned = sorted(task for t in meta for task in tasks_of(t))
    return owned == ALL_TASKS and all(tasks_of(t) for t in meta)


async def wait_settled(streams: KafkaStreams, threads: int) -> list[ThreadMetadata]:
    await eventually_async(lambda: settled(streams, threads), DEADLINE,
                           f"RUNNING with {threads} threads sharing all tasks")
    return streams.metadata_for_local_threads()


def names_of(streams: KafkaStreams) -> set[str]:
    return {t.thread_name for t in streams.metadata_for_local_threads()}


def caches(streams: KafkaStreams) -> dict[str, int]:
    return {t.thread_name: t.cache_size_bytes for t in streams.metadata_for_local_threads()
            if t.thread_state.is_alive()}


def cache_metrics(streams: KafkaStreams) -> dict[str, int]:
    return {m.tags["thread-id"]: int(m.value) for m in streams.metrics() if m.name == "cache-size-bytes"}


class Transitions:
    """A client state listener that records ``(old, new)`` pairs (called on stream threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seen: list[tuple[ClientState, ClientState]] = []

    def __call__(self, new: ClientState, old: ClientState) -> None:
        with self._lock:
            self.seen.append((old, new))

    def since(self, mark: int) -> list[tuple[ClientState, ClientState]]:
        with self._lock:
            return self.seen[mark:]


class CrashOnce:
    """A step that raises the first time it sees a record with ``"crash": true``, then relays."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.crashed: set[int] = set()

    def __call__(self, value: dict) -> dict:
        if value.get("crash"):
            with self._lock:
                first = value["seq"] not in self.crashed
                self.crashed.add(value["seq"])
            if first:
                raise RuntimeError(f"poison record {value['seq']}")
        return tag_thread(value)


async def close(streams: KafkaStreams) -> None:
    assert await streams.close_async(timeout=DEADLINE)


# -- names and indices ------------------------------------------------------------------------


async def test_threads_are_named_after_the_client_id_and_a_new_one_takes_the_next_index(
        cluster: Cluster, names, topics: Topics) -> None:
    streams = new_streams(cluster, names, topics, num_stream_threads=3)
    async with streams:
        await wait_settled(streams, 3)
        assert names_of(streams) == {thread_name(streams, i) for i in (1, 2, 3)}
        assert await streams.add_stream_thread_async() == thread_name(streams, 4)
        await wait_settled(streams, 4)
        assert names_of(streams) == {thread_name(streams, i) for i in (1, 2, 3, 4)}


async def test_added_thread_reuses_the_lowest_free_index(cluster: Cluster, names, topics: Topics) -> None:
    """Kafka Streams' shouldAddAndRemoveStreamThreadsWhileKeepingNamesCorrect."""
    streams = new_streams(cluster, names, topics, num_stream_threads=2)
    async with streams:
        await wait_settled(streams, 2)
        assert await streams.add_stream_thread_async() == thread_name(streams, 3)
        await wait_settled(streams, 3)
        removed = await streams.remove_stream_thread_async(timeout=DEADLINE)
        assert removed in {thread_name(streams, i) for i in (1, 2, 3)}
        assert removed not in names_of(streams)
        assert await streams.add_stream_thread_async() == removed
        await wait_settled(streams, 3)
        assert names_of(streams) == {thread_name(streams, i) for i in (1, 2, 3)}

        # Two gaps: the lower one is filled first.
        freed = [await streams.remove_stream_thread_async(timeout=DEADLINE) for _ in range(2)]
        gaps = sorted(freed, key=lambda name: int(name.rsplit("-", 1)[1]))
        assert [await streams.add_stream_thread_async() for _ in range(2)] == gaps
        await wait_settled(streams, 3)


async def test_replacement_started_by_the_dying_threads_handler_gets_another_index(
        cluster: Cluster, names, topics: Topics) -> None:
    """Kafka Streams' shouldResizeCacheAfterThreadReplacement: 10 bytes over 2 live threads is 5."""
    streams = new_streams(cluster, names, topics, CrashOnce(), num_stream_threads=2,
                          cache_max_bytes_buffering=10)
    dying: list[set[str]] = []

    def replace(exc: BaseException) -> Response:
        # Runs on the dying thread: it is not DEAD yet, so it is still listed.
        dying.append(names_of(streams))
        return Response.REPLACE_THREAD

    streams.set_uncaught_exception_handler(replace)
    async with streams:
        await wait_settled(streams, 2)
        await produce(cluster, topics, [{"seq": 0, "crash": True}])
        await eventually_async(
            lambda: len(names_of(streams)) == 2 and thread_name(streams, 3) in names_of(streams),
            DEADLINE, "the replacement thread, and the dying one gone")
        assert dying == [{thread_name(streams, 1), thread_name(streams, 2)}]
        await wait_settled(streams, 2)
        assert caches(streams) == {name: 5 for name in names_of(streams)}
        assert streams.metric("failed-stream-threads") == 1
        await wait_for_output(cluster, topics, {0}, "the poison record, processed by the replacement")


# -- cache.max.bytes.buffering ----------------------------------------------------------------


async def test_cache_is_split_evenly_over_the_alive_threads_after_each_add_and_remove(
        cluster: Cluster, names, topics: Topics) -> None:
    total = 1200  # divisible by 1..4: the shares sum to the total
    streams = new_streams(cluster, names, topics, cache_max_bytes_buffering=total)
    async with streams:
        await wait_settled(streams, 1)
        assert caches(streams) == {thread_name(streams, 1): total}
        for count, change in [(2, "add"), (3, "add"), (4, "add"), (3, "remove"), (2, "remove"), (1, "remove")]:
            if change == "add":
                assert await streams.add_stream_thread_async() is not None
            else:
                assert await streams.remove_stream_thread_async(timeout=DEADLINE) is not None
            shares = caches(streams)  # right after the call, before any rebalance
            assert len(shares) == count
            assert set(shares.values()) == {total // count}
            assert sum(shares.values()) == total
            assert cache_metrics(streams) == shares
        await wait_settled(streams, 1)


async def test_a_failed_threads_cache_share_goes_to_the_alive_threads(
        cluster: Cluster, names, topics: Topics) -> None:
    total = 1200
    streams = new_streams(cluster, names, topics, CrashOnce(), num_stream_threads=3,
                          cache_max_bytes_buffering=total)
    streams.set_uncaught_exception_handler(lambda exc: Response.SHUTDOWN_THREAD)
    async with streams:
        await wait_settled(streams, 3)
        assert set(caches(streams).values()) == {400}
        await produce(cluster, topics, [{"seq": 0, "crash": True}])
        await eventually_async(lambda: len(names_of(streams)) == 2, DEADLINE, "the failed thread gone")
        assert caches(streams) == {name: total // 2 for name in names_of(streams)}


# -- when add and remove do nothing -------------------------------------------------------------


async def test_add_returns_none_when_created(cluster: Cluster, names, topics: Topics) -> None:
    streams = new_streams(cluster, names, topics)
    assert await streams.add_stream_thread_async() is None
    assert streams.metadata_for_local_threads() == []
    await close(streams)


async def test_add_returns_none_after_close(cluster: Cluster, names, topics: Topics) -> None:
    streams = new_streams(cluster, names, topics)
    async with streams:
        await wait_settled(streams, 1)
    assert streams.state is ClientState.NOT_RUNNING
    assert await streams.add_stream_thread_async() is None
    assert streams.metadata_for_local_threads() == []


async def test_add_and_remove_return_none_in_error(cluster: Cluster, names, topics: Topics) -> None:
    streams = new_streams(cluster, names, topics, CrashOnce())
    streams.set_uncaught_exception_handler(lambda exc: Response.SHUTDOWN_CLIENT)
    await streams.start_async()
    try:
        await wait_settled(streams, 1)
        await produce(cluster, topics, [{"seq": 0, "crash": True}])
        assert await streams.wait_for_state_async(ClientState.ERROR, timeout=DEADLINE)
        assert await streams.add_stream_thread_async() is None
        assert await streams.remove_stream_thread_async() is None
        assert streams.metadata_for_local_threads() == []
    finally:
        await streams.close_async(timeout=DEADLINE)


async def test_remove_returns_none_when_no_thread_is_alive(cluster: Cluster, names, topics: Topics) -> None:
    streams = new_streams(cluster, names, topics)
    assert await streams.remove_stream_thread_async() is None  # CREATED: nothing runs
    async with streams:
        await wait_settled(streams, 1)
        assert await streams.remove_stream_thread_async(timeout=DEADLINE) == thread_name(streams, 1)
        assert await streams.remove_stream_thread_async(timeout=DEADLINE) is None
        assert streams.state is ClientState.RUNNING


# -- remove_stream_thread(timeout) ----------------------------------------------------------------


async def test_remove_times_out_but_resizes_caches_and_burns_the_index_until_dead(
        cluster: Cluster, names, topics: Topics) -> None:
    """Kafka Streams' shouldnNotRemoveStreamThreadWithinTimeout and
    shouldResizeCacheAfterThreadRemovalTimesOut, plus KAFKA-12375 (no reuse before DEAD)."""
    entered: set[int] = set()
    release = {p: threading.Event() for p in range(PARTITIONS)}  # set by the test

    async def block_until_released(value: dict) -> dict:
        if value.get("block"):
            entered.add(value["partition"])
            while not release[value["partition"]].is_set():
                await asyncio.sleep(0.01)  # an I/O wait that outlasts the removal's timeout
        return tag_thread(value)

    total = 1000
    streams = new_streams(cluster, names, topics, block_until_released, num_stream_threads=2,
                          cache_max_bytes_buffering=total)
    await streams.start_async()
    try:
        await wait_settled(streams, 2)
        await produce(cluster, topics, [{"seq": p, "partition": p, "block": True} for p in range(PARTITIONS)])
        await eventually_async(lambda: entered == set(range(PARTITIONS)), DEADLINE, "every task blocked")

        with pytest.raises(StreamsTimeoutError) as raised:
            await streams.remove_stream_thread_async(timeout=0.2)
        assert isinstance(raised.value, TimeoutError)

        meta = {t.thread_name: t for t in streams.metadata_for_local_threads()}
        (victim,) = [t for t in meta.values() if t.thread_state is StreamThreadState.PENDING_SHUTDOWN]
        (survivor,) = [t for t in meta.values() if t.thread_state.is_alive()]
        assert survivor.cache_size_bytes == total  # resized although the removal timed out
        assert streams.metric("alive-stream-threads") == 1
        for task in survivor.active_tasks:
            release[task.task_id.partition].set()

        # The victim still holds its index: the new thread gets 3, not the victim's.
        added = await streams.add_stream_thread_async()
        assert added == thread_name(streams, 3)
        assert set(caches(streams).values()) == {total // 2}

        for event in release.values():
            event.set()
        await eventually_async(lambda: victim.thread_name not in names_of(streams), DEADLINE,
                               "the victim DEAD and dropped")
        await wait_settled(streams, 2)
        assert await streams.add_stream_thread_async() == victim.thread_name
        await wait_settled(streams, 3)
        await wait_for_output(cluster, topics, set(range(PARTITIONS)), "the blocked records")
    finally:
        for event in release.values():
            event.set()
        await close(streams)


# -- rebalancing: the tasks follow the threads ----------------------------------------------------


async def test_added_thread_is_assigned_tasks_and_processes_records(
        cluster: Cluster, names, topics: Topics) -> None:
    streams = new_streams(cluster, names, topics)
    async with streams:
        await wait_settled(streams, 1)
        added = await streams.add_stream_thread_async()
        assert added == thread_name(streams, 2)
        meta = {t.thread_name: tasks_of(t) for t in await wait_settled(streams, 2)}
        assert meta[added]
        await produce(cluster, topics, [{"seq": i} for i in range(40)])
        out = await wait_for_output(cluster, topics, set(range(40)), "every record")
        by_thread = Counter(v["thread"] for v in out)
        assert by_thread[added] == 10 * len(meta[added])  # 10 records per partition


async def test_removed_threads_tasks_are_redistributed(cluster: Cluster, names, topics: Topics) -> None:
    streams = new_streams(cluster, names, topics, num_stream_threads=2)
    async with streams:
        await wait_settled(streams, 2)
        removed = await streams.remove_stream_thread_async(timeout=DEADLINE)
        (survivor,) = await wait_settled(streams, 1)
        assert survivor.thread_name != removed
        assert tasks_of(survivor) == ALL_TASKS
        await produce(cluster, topics, [{"seq": i} for i in range(40)])
        out = await wait_for_output(cluster, topics, set(range(40)), "every record")
        assert {v["thread"] for v in out} == {survivor.thread_name}


async def test_removing_the_last_thread_keeps_running_and_adding_one_rebalances_and_resumes(
        cluster: Cluster, names, topics: Topics) -> None:
    streams = new_streams(cluster, names, topics)
    transitions = Transitions()
    streams.set_state_listener(transitions)
    async with streams:
        await wait_settled(streams, 1)
        mark = len(transitions.seen)
        assert await streams.remove_stream_thread_async(timeout=DEADLINE) == thread_name(streams, 1)
        assert streams.metadata_for_local_threads() == []
        assert streams.state is ClientState.RUNNING
        assert streams.metric("alive-stream-threads") == 0
        await produce(cluster, topics, [{"seq": i} for i in range(8)])  # waits: no thread runs
        assert transitions.since(mark) == []

        assert await streams.add_stream_thread_async() == thread_name(streams, 1)
        await wait_settled(streams, 1)
        seen = transitions.since(mark)
        assert seen[0] == (ClientState.RUNNING, ClientState.REBALANCING), seen
        assert seen[-1] == (ClientState.REBALANCING, ClientState.RUNNING), seen
        assert {s for pair in seen for s in pair} == {ClientState.RUNNING, ClientState.REBALANCING}
        await wait_for_output(cluster, topics, set(range(8)), "processing resumed")


# -- DEAD threads and the failure metric -----------------------------------------------------------


async def test_dead_threads_are_dropped_from_metadata_and_the_registry(
        cluster: Cluster, names, topics: Topics) -> None:
    streams = new_streams(cluster, names, topics, CrashOnce(), num_stream_threads=2)
    streams.set_uncaught_exception_handler(lambda exc: Response.SHUTDOWN_THREAD)
    async with streams:
        await wait_settled(streams, 2)
        assert await streams.add_stream_thread_async() == thread_name(streams, 3)
        for _ in range(5):
            removed = await streams.remove_stream_thread_async(timeout=DEADLINE)
            assert removed is not None and removed not in names_of(streams)
            assert all(t.thread_state is not StreamThreadState.DEAD
                       for t in streams.metadata_for_local_threads())
            assert await streams.add_stream_thread_async() == removed
            assert names_of(streams) == {thread_name(streams, i) for i in (1, 2, 3)}
        assert await streams.remove_stream_thread_async(timeout=DEADLINE) is not None
        await wait_settled(streams, 2)
        # A thread that died of an exception (SHUTDOWN_THREAD) goes too, and frees its index.
        before = names_of(streams)
        await produce(cluster, topics, [{"seq": 0, "crash": True}])
        await eventually_async(lambda: len(names_of(streams)) == 1, DEADLINE, "the crashed thread dropped")
        (dead,) = before - names_of(streams)
        assert streams.state is ClientState.RUNNING or await streams.wait_for_state_async(
            ClientState.RUNNING, timeout=DEADLINE)
        # The registry itself holds no DEAD thread (KIP-663: no unbounded growth).
        assert len(streams._threads.snapshot()) == 1
        assert await streams.add_stream_thread_async() == dead
        await wait_settled(streams, 2)


async def test_failed_stream_threads_counts_threads_that_died_exceptionally(
        cluster: Cluster, names, topics: Topics) -> None:
    """Kafka Streams' shouldRecordFailedStreamThread and shouldNotRecordFailedStreamThread."""
    streams = new_streams(cluster, names, topics, CrashOnce(), num_stream_threads=2)
    streams.set_uncaught_exception_handler(lambda exc: Response.REPLACE_THREAD)
    async with streams:
        await wait_settled(streams, 2)
        assert streams.metric("failed-stream-threads") == 0
        assert await streams.remove_stream_thread_async(timeout=DEADLINE) is not None
        assert await streams.add_stream_thread_async() is not None
        await wait_settled(streams, 2)
        assert streams.metric("failed-stream-threads") == 0  # removed is not failed
        # One poison record at a time: two sent at once may both fail one thread (sticky
        # assignment keeps tasks 0_0 and 0_1 together), which is one failed thread.
        await produce(cluster, topics, [{"seq": 0, "crash": True}])  # partition 0
        await wait_for_output(cluster, topics, {0}, "the first poison record, after the crash")
        # Another thread can take a crashed thread's partition over as soon as the crashed one
        # has left the group, which it does before it is counted: wait for the count.
        await eventually_async(lambda: streams.metric("failed-stream-threads") == 1, DEADLINE,
                               "one failed thread counted")
        await wait_settled(streams, 2)
        await produce(cluster, topics, [{"seq": 1}, {"seq": 2, "crash": True}])  # partitions 0, 1
        await wait_for_output(cluster, topics, {1, 2}, "the second poison record, after the crash")
        await eventually_async(lambda: streams.metric("failed-stream-threads") == 2, DEADLINE,
                               "two failed threads counted")
        await wait_settled(streams, 2)
        assert streams.metric("alive-stream-threads") == 2


async def test_restart_starts_num_stream_threads_threads(cluster: Cluster, names, topics: Topics) -> None:
    config = {"num_stream_threads": 2, "client_id": names("client")}
    first = new_streams(cluster, names, topics, **config)
    async with first:
        await wait_settled(first, 2)
        await first.add_stream_thread_async()
        await first.add_stream_thread_async()
        await wait_settled(first, 4)
    second = new_streams(cluster, names, topics, **config)
    async with second:
        await wait_settled(second, 2)
        assert names_of(second) == {thread_name(second, 1), thread_name(second, 2)}


# -- calls from inside a stream thread -------------------------------------------------------------


async def test_add_and_remove_from_a_processor_do_not_deadlock_even_removing_itself(
        cluster: Cluster, names, topics: Topics) -> None:
    """A plain processor calls the blocking API on its stream thread's own loop."""
    holder: list[KafkaStreams] = []
    lock = threading.Lock()
    results: dict[int, str | None] = {}

    def command(value: dict) -> dict:
        cmd = value.get("cmd")
        with lock:
            first = cmd is not None and value["seq"] not in results
            if first:
                results[value["seq"]] = None  # at-least-once: a replayed command runs once
        if first:
            streams = holder[0]
            if cmd == "add":
                results[value["seq"]] = streams.add_stream_thread()
            else:
                results[value["seq"]] = streams.remove_stream_thread(timeout=DEADLINE)
        return {**tag_thread(value), "result": results.get(value["seq"])}

    streams = new_streams(cluster, names, topics, command)
    holder.append(streams)
    async with streams:
        await wait_settled(streams, 1)
        await produce(cluster, topics, [{"seq": 0, "cmd": "add"}])
        await wait_for_output(cluster, topics, {0}, "the add command")
        assert results[0] == thread_name(streams, 2)
        await wait_settled(streams, 2)

        await produce(cluster, topics, [{"seq": 1, "cmd": "remove"}])
        (out,) = [v for v in await wait_for_output(cluster, topics, {1}, "the remove command") if v["seq"] == 1]
        assert results[1] not in (None, out["thread"])  # another thread was removed
        (survivor,) = await wait_settled(streams, 1)
        assert survivor.thread_name == out["thread"]

        await produce(cluster, topics, [{"seq": 2, "cmd": "remove"}])  # the last thread removes itself
        await eventually_async(lambda: 2 in results and results[2] is not None, DEADLINE, "self-removal")
        assert results[2] == survivor.thread_name
        await eventually_async(lambda: streams.metadata_for_local_threads() == [], DEADLINE,
                               "the last thread gone")
        assert streams.state is ClientState.RUNNING

        assert await streams.add_stream_thread_async() is not None
        await wait_settled(streams, 1)
        await produce(cluster, topics, [{"seq": 3}])
        await wait_for_output(cluster, topics, {2, 3}, "processing resumed")


async def test_blocking_remove_from_a_processor_while_the_group_rebalances_returns_promptly(
        cluster: Cluster, names, topics: Topics, request: pytest.FixtureRequest) -> None:
    """The processor adds a thread and removes it again while it is joining the group. On Kafka
    the removed thread's consumer cannot close before its JoinGroup is answered, which needs the
    caller to rejoin: a call that waited for the removed thread would block the caller's loop
    until the caller is evicted (session.timeout.ms). From a stream thread's loop it returns
    once the shutdown has started."""
    session_s = 10.0
    holder: list[KafkaStreams] = []
    done: list[tuple[str | None, str | None, float]] = []
    once = threading.Lock()

    def add_then_remove(value: dict) -> dict:
        if value.get("cmd") and once.acquire(blocking=False):  # a replay does not run it again
            streams = holder[0]
            added = streams.add_stream_thread()
            deadline = time.monotonic() + DEADLINE
            while not group_is_rebalancing(cluster, names.app, streams, added):
                assert time.monotonic() < deadline, "the added thread never started to join"
                time.sleep(0.005)  # a plain processor: this blocks its loop, as the bug needs
            started = time.monotonic()
            removed = streams.remove_stream_thread(timeout=DEADLINE)
            done.append((added, removed, time.monotonic() - started))
        return tag_thread(value)

    streams = new_streams(cluster, names, topics, add_then_remove, session_timeout_ms=int(session_s * 1000))
    holder.append(streams)
    async with streams:
        await wait_settled(streams, 1)
        await produce(cluster, topics, [{"seq": 0, "cmd": True}])
        await eventually_async(lambda: done, DEADLINE + session_s, "the processor's add and remove")
        ((added, removed, took),) = done
        assert removed == added == thread_name(streams, 2)
        assert took < session_s / 2, f"remove_stream_thread took {took:.1f} s"
        await wait_settled(streams, 1)


def group_is_rebalancing(cluster: Cluster, group: str, streams: KafkaStreams, joining: str | None) -> bool:
    """Whether thread ``joining`` has started to join the group (so the group rebalances)."""
    if cluster.bootstrap.startswith("memory://"):
        from streamloop.transport.memory.broker import MemoryBroker
        from streamloop.transport.memory.group import GroupState

        description = MemoryBroker.for_url(cluster.bootstrap).describe_group(group)
        return description is not None and description.state is GroupState.PREPARING_REBALANCE
    # aiokafka calls on_partitions_revoked (an empty set on the first join) right before JoinGroup.
    return any(t.thread_name == joining and t.thread_state is StreamThreadState.PARTITIONS_REVOKED
               for t in streams.metadata_for_local_threads())


async def test_add_and_remove_from_the_uncaught_exception_handler_do_not_deadlock(
        cluster: Cluster, names, topics: Topics) -> None:
    """The handler runs on the dying thread's loop: it removes the other thread (without waiting
    for it, as from any stream thread's loop) and adds one, which cannot take the dying thread's
    index (nor the removed one's while that one is not DEAD yet)."""
    streams = new_streams(cluster, names, topics, CrashOnce(), num_stream_threads=2)
    calls: list[tuple[str, str | None, str | None]] = []

    def handler(exc: BaseException) -> Response:
        removed = streams.remove_stream_thread(timeout=DEADLINE)
        added = streams.add_stream_thread()
        calls.append((threading.current_thread().name, removed, added))
        return Response.SHUTDOWN_THREAD

    streams.set_uncaught_exception_handler(handler)
    async with streams:
        await wait_settled(streams, 2)
        await produce(cluster, topics, [{"seq": 0, "crash": True}])
        await eventually_async(lambda: calls, DEADLINE, "the handler's calls")
        ((dying, removed, added),) = calls
        assert {dying, removed} == {thread_name(streams, 1), thread_name(streams, 2)}
        assert added != dying and added in {removed, thread_name(streams, 3)}
        await wait_settled(streams, 1)
        assert names_of(streams) == {added}
        assert streams.metric("failed-stream-threads") == 1
        await wait_for_output(cluster, topics, {0}, "the poison record, processed by the new thread")


async def test_async_forms_do_not_block_the_callers_loop(cluster: Cluster, names, topics: Topics) -> None:
    """The removal can only finish if this loop keeps running: a ticker on it releases the tasks."""
    entered: set[int] = set()
    release = threading.Event()

    async def block_until_released(value: dict) -> dict:
        if value.get("block"):
            entered.add(value["seq"])
            while not release.is_set():
                await asyncio.sleep(0.01)
        return tag_thread(value)

    streams = new_streams(cluster, names, topics, block_until_released, num_stream_threads=2)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1
            if ticks == 20:
                release.set()

    async with streams:
        await wait_settled(streams, 2)
        await produce(cluster, topics, [{"seq": p, "block": True} for p in range(PARTITIONS)])
        await eventually_async(lambda: len(entered) == PARTITIONS, DEADLINE, "every task blocked")
        tick_task = asyncio.create_task(ticker())
        try:
            removed = await streams.remove_stream_thread_async(timeout=DEADLINE)
            assert removed is not None
            assert release.is_set() and ticks >= 20
            assert await streams.add_stream_thread_async() == removed
            await wait_settled(streams, 2)
        finally:
            tick_task.cancel()
            release.set()
            await asyncio.gather(tick_task, return_exceptions=True)


async def test_blocking_forms_work_from_a_worker_thread(cluster: Cluster, names, topics: Topics) -> None:
    streams = new_streams(cluster, names, topics)
    async with streams:
        await wait_settled(streams, 1)
        added = await anyio.to_thread.run_sync(streams.add_stream_thread)
        assert added == thread_name(streams, 2)
        await wait_settled(streams, 2)
        assert await anyio.to_thread.run_sync(streams.remove_stream_thread, DEADLINE) is not None
        await wait_settled(streams, 1)


async def test_concurrent_adds_and_removes_keep_names_unique_and_close_stops_every_thread(
        cluster: Cluster, names, topics: Topics) -> None:
    """Kafka Streams' testConcurrentlyAccessThreads, plus adds racing close()."""
    streams = new_streams(cluster, names, topics)
    errors: list[BaseException] = []
    duplicates: list[list[str]] = []

    def churn(rounds: int) -> None:
        for _ in range(rounds):
            try:
                streams.add_stream_thread()
                streams.remove_stream_thread(timeout=DEADLINE)
            except BaseException as exc:  # reported by the test
                errors.append(exc)

    def add_until_closed() -> None:
        try:
            for _ in range(8):
                if streams.add_stream_thread() is None:
                    break
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    async def watch(done: asyncio.Event) -> None:
        while not done.is_set():
            listed = [t.thread_name for t in streams.metadata_for_local_threads()]
            if len(set(listed)) != len(listed):
                duplicates.append(listed)
            await asyncio.sleep(0.005)

    await streams.start_async()
    try:
        await wait_settled(streams, 1)
        done = asyncio.Event()
        watcher = asyncio.create_task(watch(done))
        await asyncio.gather(*(anyio.to_thread.run_sync(churn, 3) for _ in range(3)))
        adder = asyncio.create_task(anyio.to_thread.run_sync(add_until_closed))
        await eventually_async(lambda: len(names_of(streams)) >= 3, DEADLINE, "threads being added")
        assert await streams.close_async(timeout=DEADLINE)
        await adder
        done.set()
        await watcher
    finally:
        await streams.close_async(timeout=DEADLINE)
    assert errors == []
    assert duplicates == []
    assert streams.state is ClientState.NOT_RUNNING
    assert streams.metadata_for_local_threads() == []
    assert streams.metric("alive-stream-threads") == 0


# -- static membership ----------------------------------------------------------------------------


async def test_removed_static_member_leaves_the_group_at_once(cluster: Cluster, names, topics: Topics) -> None:
    """Kafka Streams' shouldRemoveStreamThreadWithStaticMembership: with a 30 s session the
    remaining thread takes over well before the removed member's session could expire."""
    session_s = 30.0
    streams = new_streams(cluster, names, topics, num_stream_threads=2, group_instance_id=names("instance"),
                          session_timeout_ms=int(session_s * 1000))
    async with streams:
        await wait_settled(streams, 2)
        started = time.monotonic()
        removed = await streams.remove_stream_thread_async(timeout=DEADLINE)
        (survivor,) = await wait_settled(streams, 1)
        took = time.monotonic() - started
        assert survivor.thread_name != removed
        assert took < session_s / 3, f"the survivor took over after {took:.1f} s"
        await produce(cluster, topics, [{"seq": i} for i in range(8)])
        await wait_for_output(cluster, topics, set(range(8)), "every record")


# -- under load --------------------------------------------------------------------------------


@pytest.mark.parametrize("bootstrap", EVERY_BROKER, indirect=True)
async def test_nothing_is_lost_while_threads_go_1_4_1_0_2(cluster: Cluster, names, topics: Topics) -> None:
    """Records flow while the thread count changes; then every input is in the output, and each
    key's output is its input in order, where a repeat can only replay a contiguous run
    (at-least-once: the uncommitted tail is processed again by the next owner)."""
    processed = 0
    # Each record once, however often it is replayed: ``processed`` counts replays too, so it can
    # reach the input's total while the tail is still to come.
    seen: set[tuple[int, int]] = set()
    lock = threading.Lock()

    def count(value: dict) -> dict:
        nonlocal processed
        with lock:
            processed += 1
            seen.add((value["key"], value["seq"]))
        return value

    keys = 8
    streams = new_streams(cluster, names, topics, count)
    producer = cluster.transport.producer(ProducerSettings("load-producer"))
    await producer.start()
    stop = asyncio.Event()
    sent = {k: 0 for k in range(keys)}

    async def feed() -> None:
        while not stop.is_set():
            for _ in range(3):
                for k in range(keys):
                    producer.append(topics.source, k % PARTITIONS, INT.serialize(k),
                                    JSON.serialize({"key": k, "seq": sent[k]}), None, ())
                    sent[k] += 1
            await producer.flush()
            await asyncio.sleep(0.02)

    async def progress(threads: int) -> None:
        if threads:
            await wait_settled(streams, threads)
            start = processed
            await eventually_async(lambda: processed >= start + 50, DEADLINE, f"progress on {threads} threads")
        else:
            await eventually_async(lambda: streams.metadata_for_local_threads() == [], DEADLINE, "no threads")
            assert streams.state is ClientState.RUNNING

    feeder = asyncio.create_task(feed())
    try:
        async with streams:
            await progress(1)
            for target in (4, 1, 0, 2):
                while len(streams.metadata_for_local_threads()) < target:
                    assert await streams.add_stream_thread_async() is not None
                while len(streams.metadata_for_local_threads()) > target:
                    assert await streams.remove_stream_thread_async(timeout=DEADLINE) is not None
                await progress(target)
            stop.set()
            await feeder
            total = sum(sent.values())
            await eventually_async(lambda: len(seen) >= total, DEADLINE, "every record processed")
        # After the close, which hands on every processed record's output.
        out = await cluster.read_all(topics.sink)
    finally:
        stop.set()
        await asyncio.gather(feeder, return_exceptions=True)
        await producer.close()

    by_key: dict[int, list[int]] = {k: [] for k in range(keys)}
    for record in sorted(out, key=lambda r: (r.partition, r.offset)):
        value = JSON.deserialize(record.value)
        by_key[value["key"]].append(value["seq"])
    for k, seqs in by_key.items():
        assert_at_least_once_in_order(seqs, sent[k], k)


def assert_at_least_once_in_order(seqs: list[int], expected: int, key: int) -> None:
    first_seen = list(dict.fromkeys(seqs))
    assert first_seen == list(range(expected)), f"key {key}: lost or reordered records"
    for previous, current in itertools.pairwise(seqs):
        # Either the next record, or a jump back to replay from an earlier commit.
        assert current == previous + 1 or current <= previous, f"key {key}: {previous} then {current}"
