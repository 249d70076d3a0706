"""A producer timeout loses the output of uncommitted records; the thread revives its tasks from
the last commit and processes those records again (at-least-once), under task.timeout.ms."""

from __future__ import annotations

import uuid

import pytest
from aiokafka.errors import KafkaTimeoutError

# aiokafka's batch expiry is retriable once the Kafka transport registered it, which a test of the
# memory broker alone would not otherwise import (the test then failed when run on its own).
import streamloop.transport.kafka.errors  # noqa: F401
from streamloop import ClientState
from streamloop.errors import TaskTimeoutError
from streamloop.handlers import StreamThreadExceptionResponse
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.transport import open_transport
from streamloop.transport.memory import MemoryBroker
from tests.support.apps import doubling_topology, expected_doubling, make_streams
from tests.support.cluster import Cluster

pytestmark = pytest.mark.asyncio

INT, JSON = IntegerSerde(), JsonSerde()


@pytest.fixture
def memory_cluster() -> Cluster:
    bootstrap = f"memory://producer-timeouts-{uuid.uuid4().hex[:8]}"
    return Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)


async def test_produce_timeouts_shorter_than_task_timeout_lose_nothing(memory_cluster: Cluster) -> None:
    cluster = memory_cluster
    await cluster.create_topics({"in": 2, "out": 2})
    records = [(i, {"n": 2 * i}) for i in range(300)]
    await cluster.produce("in", records[:100], INT, JSON, partitions=2)
    streams = make_streams(doubling_topology("in", "out"), cluster.bootstrap, "app",
                           task_timeout_ms=60_000, retry_backoff_ms=5, retry_backoff_max_ms=20)
    async with streams:
        await cluster.read("out", 100)
        MemoryBroker.for_url(cluster.bootstrap).fail_produce("out", KafkaTimeoutError("batch expired"), times=3)
        await cluster.produce("in", records[100:], INT, JSON, partitions=2)
        expected = {repr(x) for x in expected_doubling(records)}

        async def all_out() -> bool:
            out = await cluster.read_all("out")
            return expected <= {repr((INT.deserialize(r.key), JSON.deserialize(r.value))) for r in out}

        from streamloop.testing import eventually_async
        await eventually_async(all_out, 30, "every record in the output despite the lost batches")
        assert streams.metric("failed-stream-threads") == 0
        assert streams.state is ClientState.RUNNING


async def test_produce_timeouts_past_task_timeout_reach_the_handler(memory_cluster: Cluster) -> None:
    cluster = memory_cluster
    await cluster.create_topics({"in": 1, "out": 1})
    await cluster.produce("in", [(0, {"n": 2})], INT, JSON, partitions=1)
    MemoryBroker.for_url(cluster.bootstrap).fail_produce("out", KafkaTimeoutError("batch expired"), times=10**6)
    errors: list[BaseException] = []
    streams = make_streams(doubling_topology("in", "out"), cluster.bootstrap, "app",
                           task_timeout_ms=300, retry_backoff_ms=5, retry_backoff_max_ms=20)
    streams.set_uncaught_exception_handler(
        lambda exc: errors.append(exc) or StreamThreadExceptionResponse.SHUTDOWN_CLIENT)
    await streams.start_async()
    try:
        assert await streams.wait_for_state_async(ClientState.ERROR, timeout=30)
    finally:
        await streams.close_async()
    assert isinstance(errors[0], TaskTimeoutError)
    assert isinstance(errors[0].__cause__.__cause__, KafkaTimeoutError)
