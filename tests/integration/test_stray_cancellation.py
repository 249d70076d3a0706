"""A cancellation no cancel scope asked for never ends a stream thread silently
(``streamloop.stray_cancel``).

Seen in a broker bounce under load: aiokafka's ``end_offsets`` asks each leader in a task it
gathers, and cancelled one whose connection attempt timed out; ``gather`` raised that
``CancelledError`` in the lag metric's lookup, anyio's task group took it for a cancellation and
cancelled the whole stream thread: no failure reported, no handler asked, its records never
processed. Here the same stray cancellation is raised where the client library's calls are (the
lag lookup keeps going, since a metric must never fail the thread) and in a processor (the thread
fails, and its handler is asked, as for any other error).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
import pytest
from aiokafka import AIOKafkaConsumer

from streamloop import ClientState, StreamsBuilder
from streamloop.handlers import StreamThreadExceptionResponse
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.stray_cancel import StrayCancellationError, bounded, reraise_stray, stray
from streamloop.testing import eventually_async
from streamloop.transport.memory.consumer import MemoryConsumer
from tests.support.apps import doubling_running, make_streams
from tests.support.cluster import Cluster

pytestmark = pytest.mark.asyncio
INT, JSON = IntegerSerde(), JsonSerde()


async def raise_stray_cancellation() -> None:
    """What aiokafka does: cancel a task of its own and gather it, in a task nothing cancelled."""
    own = asyncio.ensure_future(asyncio.sleep(10))
    await asyncio.sleep(0)
    own.cancel()
    await asyncio.gather(own)


async def raise_stray_cancellation_at_the_callers_deadline() -> None:
    """The same, in the loop step where the caller's own deadline fires (seen in CI: aiokafka's
    internal timeouts are the request timeout the engine bounds its lookups with). The task's
    cancel request lands while the gathered task has ended and ``gather`` has not yet passed that
    on: the stray ``CancelledError`` then reaches the task with its cancel request pending, and
    the caller's cancel scope, whose request it withdraws on exit, lets it through."""
    loop = asyncio.get_running_loop()
    deadline = anyio.current_effective_deadline()
    own = asyncio.ensure_future(asyncio.sleep(math.inf))

    def at_the_deadline() -> None:
        own.cancel()
        # Hold the loop past the caller's deadline, so that its timer and the end of ``own`` fall
        # in the same loop step, ``own`` first.
        time.sleep(max(0.0, deadline - loop.time()) + 0.02)
    loop.call_at(deadline - 0.05, at_the_deadline)
    await asyncio.gather(own)


async def test_a_stray_cancellation_is_told_from_a_real_one() -> None:
    with pytest.raises(StrayCancellationError), reraise_stray(StrayCancellationError):
        await raise_stray_cancellation()
    real: list[bool] = []
    with anyio.CancelScope() as scope:
        scope.cancel()
        try:
            await anyio.sleep(10)
        except asyncio.CancelledError as exc:
            real.append(stray(exc))  # asked for by the scope: a cancellation to go on with
            raise
    assert real == [False] and scope.cancelled_caught


async def test_a_stray_cancellation_at_the_deadline_passes_a_check_inside_the_scope_not_outside() -> None:
    leaked: list[BaseException] = []
    try:
        with anyio.move_on_after(0.2), reraise_stray(StrayCancellationError):
            await raise_stray_cancellation_at_the_callers_deadline()
    except asyncio.CancelledError as exc:  # what ended the lag lookup's thread
        leaked.append(exc)
    assert leaked and stray(leaked[0])
    with pytest.raises(StrayCancellationError, match="the lookup was cancelled from inside"), \
            bounded(0.2, "the lookup"):
        await raise_stray_cancellation_at_the_callers_deadline()
    with bounded(0.05, "a slow lookup") as scope:  # a deadline alone moves on, as anyio's
        await anyio.sleep(10)
    assert scope.cancelled_caught


class StrayLookups:
    """The stream threads' first ``count`` lookups of log ends with a deadline (the lag metric's)
    end in ``stray``, a stray cancellation."""

    def __init__(self, count: int, stray: Callable[[], Awaitable[None]]) -> None:
        self.count = self.left = count
        self.calls = 0
        self._stray = stray

    def wrap(self, original: Any) -> Any:
        async def end_offsets(consumer: Any, partitions: Any) -> Any:
            if "StreamThread" in threading.current_thread().name and anyio.current_effective_deadline() < math.inf:
                self.calls += 1
                if self.left > 0:
                    self.left -= 1
                    await self._stray()
            return await original(consumer, partitions)
        return end_offsets


@pytest.fixture(params=["at-once", "at-the-deadline"])
def stray_lookups(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[StrayLookups]:
    at_once = request.param == "at-once"
    lookups = (StrayLookups(3, raise_stray_cancellation) if at_once
               else StrayLookups(1, raise_stray_cancellation_at_the_callers_deadline))
    # On Kafka in aiokafka itself, beneath the transport; on the memory broker in its consumer.
    monkeypatch.setattr(AIOKafkaConsumer, "end_offsets", lookups.wrap(AIOKafkaConsumer.end_offsets))
    monkeypatch.setattr(MemoryConsumer, "end_offsets", lookups.wrap(MemoryConsumer.end_offsets))
    yield lookups


async def test_a_lag_lookup_cancelled_by_the_client_library_leaves_the_thread_running(
        cluster: Cluster, names: Any, stray_lookups: StrayLookups) -> None:
    # A short request timeout: the lag lookup's deadline, at which one stray cancellation lands.
    async with doubling_running(cluster, names, request_timeout_ms=3_000) as (streams, source, sink):
        # The lookups that were cancelled were tried again (one a second): the thread lives on.
        await eventually_async(lambda: stray_lookups.calls > stray_lookups.count, 30,
                               "the log ends looked up after the stray ones")
        await cluster.produce(source, [(1, {"n": 2})], INT, JSON, 1)
        out = await cluster.read(sink, 2, timeout=30)
        assert [JSON.deserialize(r.value)["n"] for r in out] == [0, 2]
        assert streams.metric("failed-stream-threads") == 0
        assert streams.state is ClientState.RUNNING


@pytest.mark.parametrize("workers", [1, 4], ids=["in-order", "records-in-flight"])
async def test_a_processor_cancelled_from_inside_fails_its_thread_and_asks_the_handler(
        cluster: Cluster, names: Any, workers: int) -> None:
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})

    async def cancelled_from_inside(value: dict[str, int]) -> dict[str, int]:
        if value["n"] == 1:
            await raise_stray_cancellation()
        return value

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .map_values(cancelled_from_inside)
            .to(sink, key_serde=INT, value_serde=JSON))
    # Four workers: the record runs in a worker task of the task's own group (streamloop.tasks.in_flight).
    streams = make_streams(builder.build(), cluster.bootstrap, names.app, **{"num.threads.per.task": workers})
    seen: list[BaseException] = []

    def handler(exc: BaseException) -> StreamThreadExceptionResponse:
        seen.append(exc)
        return StreamThreadExceptionResponse.SHUTDOWN_CLIENT
    streams.set_uncaught_exception_handler(handler)
    await streams.start_async()
    try:
        await cluster.produce(source, [(0, {"n": 0}), (1, {"n": 1})], INT, JSON, 1)
        await eventually_async(lambda: bool(seen), 30, "the uncaught-exception handler asked")
        assert isinstance(seen[0], StrayCancellationError), seen
        await eventually_async(lambda: streams.state is ClientState.ERROR, 30, "the client shut down, as answered")
    finally:
        await streams.close_async(timeout=30)
