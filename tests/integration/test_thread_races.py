"""KIP-663 calls racing each other and the threads they act on, on the memory broker and on real Kafka.

A removal decides under the thread registry's lock and acts after releasing it, and reaching
another thread's loop never waits for that loop: a victim whose loop is blocked (in a plain
processor, or waiting for the registry in ``add_stream_thread`` or in its failure path) can
neither hang the caller nor make it overrun its timeout.
"""

from __future__ import annotations

import threading
import time

import anyio.to_thread
import pytest

from streamloop import ClientState, KafkaStreams, StreamsTimeoutError, StreamThreadState
from streamloop.handlers import StreamThreadExceptionResponse
from streamloop.testing import eventually_async
from tests.integration.test_stream_threads import (
    DEADLINE,
    PARTITIONS,
    Topics,
    close,
    new_streams,
    produce,
    settled,
    tag_thread,
    thread_name,
    topics,
    wait_for_output,
    wait_settled,
)
from tests.support.cluster import Cluster

pytestmark = pytest.mark.asyncio
__all__ = ["topics"]  # the fixture, shared with test_stream_threads

# A blocking call that overran its timeout by more than this has waited on something it should not.
SLACK = 0.5


async def call_in_thread(fn, *args, limit: float):  # test plumbing
    """Run a blocking client call on a worker thread; fail (instead of hanging) past ``limit``.
    Returns ``(result or error, seconds taken)``."""
    result: list = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn(*args))
        except BaseException as exc:  # handed to the test
            error.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    worker.start()
    await eventually_async(lambda: not worker.is_alive(), limit, f"{fn.__name__}{args} to return (deadlock?)")
    took = time.monotonic() - started
    return (error[0] if error else result[0]), took


async def test_a_removal_racing_the_victims_own_add_does_not_deadlock(
        cluster: Cluster, names, topics: Topics) -> None:
    """The victim's loop is in a plain processor that calls ``add_stream_thread`` right after the
    removal picked it: the removal must not hold the registry while it reaches the victim's loop."""
    holder: list[KafkaStreams] = []
    entered, go = threading.Event(), threading.Event()
    added: list[str | None] = []

    def add_when_told(value: dict) -> dict:
        if value.get("cmd") and not entered.is_set():
            entered.set()
            go.wait(DEADLINE)  # blocks the loop, as a plain processor does
            added.append(holder[0].add_stream_thread())
        return tag_thread(value)

    streams = new_streams(cluster, names, topics, add_when_told, num_stream_threads=1)
    holder.append(streams)
    await streams.start_async()
    try:
        await wait_settled(streams, 1)
        await produce(cluster, topics, [{"seq": 0, "cmd": True}])
        await eventually_async(entered.is_set, DEADLINE, "the processor to block its loop")
        victim = thread_name(streams, 1)
        removal = threading.Thread(target=lambda: added.append(streams.remove_stream_thread(timeout=DEADLINE)),
                                   daemon=True)
        removal.start()
        await eventually_async(
            lambda: any(t.thread_name == victim and t.thread_state is StreamThreadState.PENDING_SHUTDOWN
                        for t in streams.metadata_for_local_threads()), DEADLINE, "the removal to pick the victim")
        go.set()
        await eventually_async(lambda: not removal.is_alive(), DEADLINE, "the removal to return (deadlock?)")
        assert sorted(a for a in added if a is not None) == sorted([victim, thread_name(streams, 2)])
        await wait_settled(streams, 1)
        await produce(cluster, topics, [{"seq": 1}])
        await wait_for_output(cluster, topics, {0, 1}, "every record, by the added thread")
    finally:
        go.set()
        await close(streams)


async def test_remove_honours_its_timeout_while_the_victims_loop_is_busy(
        cluster: Cluster, names, topics: Topics) -> None:
    """KIP-663: ``remove_stream_thread(timeout)`` gives up after ``timeout`` whatever the victim is
    doing (here its loop is blocked in a plain processor) and says what it did."""
    entered, release = threading.Event(), threading.Event()

    def busy(value: dict) -> dict:
        if value.get("busy"):
            entered.set()
            release.wait(DEADLINE)  # a long synchronous step holding the loop
        return tag_thread(value)

    streams = new_streams(cluster, names, topics, busy, num_stream_threads=1)
    await streams.start_async()
    try:
        await wait_settled(streams, 1)
        await produce(cluster, topics, [{"seq": 0, "busy": True}])
        await eventually_async(entered.is_set, DEADLINE, "the processor to block its loop")
        outcome, took = await call_in_thread(streams.remove_stream_thread, 0.5, limit=DEADLINE)
        assert isinstance(outcome, StreamsTimeoutError), outcome
        assert "still shutting down" in str(outcome)
        assert took < 0.5 + SLACK, f"remove_stream_thread(timeout=0.5) took {took:.2f} s"
        release.set()
        await eventually_async(lambda: streams.metadata_for_local_threads() == [], DEADLINE,
                               "the victim to finish its record and stop")
        assert streams.state is ClientState.RUNNING
    finally:
        release.set()
        await close(streams)


async def test_two_threads_failing_while_a_removal_runs_do_not_hang(
        cluster: Cluster, names, topics: Topics) -> None:
    """Both failing threads' loops go through the failure path (REPLACE_THREAD takes the registry)
    while a removal from outside picks one of them: every call returns and no record is lost."""
    entered = threading.Barrier(2 + 1, timeout=DEADLINE)
    crashed: set[int] = set()
    lock = threading.Lock()

    def crash_together(value: dict) -> dict:
        if value.get("crash"):
            with lock:
                first = value["seq"] not in crashed
                crashed.add(value["seq"])
            if first:
                entered.wait()  # both loops and the test meet here
                raise RuntimeError(f"poison record {value['seq']}")
        return tag_thread(value)

    streams = new_streams(cluster, names, topics, crash_together, num_stream_threads=2)
    streams.set_uncaught_exception_handler(lambda _exc: StreamThreadExceptionResponse.REPLACE_THREAD)
    await streams.start_async()
    try:
        await wait_settled(streams, 2)
        # One crashing record per thread: each thread owns PARTITIONS // 2 partitions.
        owners = {t.thread_name: sorted(task.task_id.partition for task in t.active_tasks)
                  for t in streams.metadata_for_local_threads()}
        firsts = [parts[0] for parts in owners.values()]
        await produce(cluster, topics, [{"seq": p, "crash": p in firsts} for p in range(PARTITIONS)])
        await anyio.to_thread.run_sync(entered.wait)
        outcome, _took = await call_in_thread(streams.remove_stream_thread, DEADLINE, limit=DEADLINE + SLACK)
        assert not isinstance(outcome, BaseException), outcome
        await eventually_async(lambda: streams.state is ClientState.RUNNING and len(
            [t for t in streams.metadata_for_local_threads() if t.thread_state is StreamThreadState.RUNNING]) >= 1,
            DEADLINE, "the client RUNNING again with replacement threads")
        await wait_for_output(cluster, topics, set(range(PARTITIONS)), "every record, the poisoned ones again")
        assert streams.metric("failed-stream-threads") == 2
    finally:
        await close(streams)


# Heartbeats this far apart leave a member that missed a rebalance waiting far past the deadlines below.
SLOW_HEARTBEATS = {"heartbeat_interval_ms": 30_000, "session_timeout_ms": 90_000}
# Well before a heartbeat (30 s) and before request.timeout.ms (15 s in the tests' config): a join
# that waited for either (a thread that asks no one, or a loop held behind its own JoinGroup) fails.
LIMIT = 10


async def test_threads_started_together_share_the_tasks_without_waiting_for_a_heartbeat(
        cluster: Cluster, names, topics: Topics) -> None:
    """Threads started together (no initial rebalance delay on the test broker): one that joins after
    the first has formed the group asks it to rejoin, and asks again while its join still waits
    (a request made while the other is itself mid-join is absorbed by that join)."""
    for _attempt in range(3):  # the race is a matter of timing: three starts, each within the limit
        streams = new_streams(cluster, names, topics, num_stream_threads=3, **SLOW_HEARTBEATS)
        started = time.monotonic()
        await streams.start_async()
        try:
            await eventually_async(lambda s=streams: settled(s, 3), LIMIT, "three threads sharing the tasks")
            assert time.monotonic() - started < LIMIT
        finally:
            await close(streams)


async def test_two_threads_added_at_once_get_tasks_without_waiting_for_a_heartbeat(
        cluster: Cluster, names, topics: Topics) -> None:
    """Two additions at once: the second one's request to rejoin can reach the first thread while it
    is mid-join for the first addition; the waiting thread asks again, not after 30 s."""
    streams = new_streams(cluster, names, topics, num_stream_threads=1, **SLOW_HEARTBEATS)
    await streams.start_async()
    try:
        await wait_settled(streams, 1)
        started = time.monotonic()
        assert await streams.add_stream_thread_async() is not None
        assert await streams.add_stream_thread_async() is not None
        await eventually_async(lambda: settled(streams, 3), LIMIT, "three threads sharing the tasks")
        assert time.monotonic() - started < LIMIT
    finally:
        await close(streams)


async def test_an_added_thread_gets_tasks_without_waiting_for_the_others_heartbeat(
        cluster: Cluster, names, topics: Topics) -> None:
    """The others learn of the rebalance from the new thread, not from the coordinator at their
    next heartbeat: with heartbeats 30 s apart the new thread still owns tasks well before that."""
    streams = new_streams(cluster, names, topics, num_stream_threads=2, **SLOW_HEARTBEATS)
    await streams.start_async()
    try:
        await wait_settled(streams, 2)
        started = time.monotonic()
        added = await streams.add_stream_thread_async()
        assert added == thread_name(streams, 3)
        await eventually_async(lambda: settled(streams, 3), LIMIT, "three threads sharing the tasks")
        took = time.monotonic() - started
        assert took < LIMIT, f"the added thread got tasks only after {took:.1f} s"
    finally:
        await close(streams)
