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
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from aiokafka import AIOKafkaConsumer

from streamloop import ClientState, StreamsBuilder
from streamloop.handlers import StreamThreadExceptionResponse
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.stray_cancel import StrayCancellationError, reraise_stray, stray
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


class StrayLookups:
    """The stream threads' first ``count`` lookups of log ends end in a stray cancellation."""

    def __init__(self, count: int) -> None:
        self.left = count
        self.calls = 0

    def wrap(self, original: Any) -> Any:
        async def end_offsets(consumer: Any, partitions: Any) -> Any:
            if "StreamThread" in threading.current_thread().name:
                self.calls += 1
                if self.left > 0:
                    self.left -= 1
                    await raise_stray_cancellation()
            return await original(consumer, partitions)
        return end_offsets


@pytest.fixture
def stray_lookups(monkeypatch: pytest.MonkeyPatch) -> Iterator[StrayLookups]:
    lookups = StrayLookups(3)
    # On Kafka in aiokafka itself, beneath the transport; on the memory broker in its consumer.
    monkeypatch.setattr(AIOKafkaConsumer, "end_offsets", lookups.wrap(AIOKafkaConsumer.end_offsets))
    monkeypatch.setattr(MemoryConsumer, "end_offsets", lookups.wrap(MemoryConsumer.end_offsets))
    yield lookups


async def test_a_lag_lookup_cancelled_by_the_client_library_leaves_the_thread_running(
        cluster: Cluster, names: Any, stray_lookups: StrayLookups) -> None:
    async with doubling_running(cluster, names) as (streams, source, sink):
        # The lookups that were cancelled were tried again (one a second): the thread lives on.
        await eventually_async(lambda: stray_lookups.calls > 3, 30, "the log ends looked up after the stray ones")
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
