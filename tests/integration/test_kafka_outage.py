"""KIP-572 against a real broker behind the fault proxy: an outage shorter than task.timeout.ms
is ridden out with no thread death and nothing lost; a longer one ends in TaskTimeoutError."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest

from streamloop import ClientState, StreamsBuilder
from streamloop.errors import TaskTimeoutError
from streamloop.handlers import StreamThreadExceptionResponse
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.testing import eventually_async
from streamloop.transport import open_transport
from tests.integration.conftest import LEAKED_CONNECTION
from tests.support.apps import doubling_topology, expected_doubling, make_streams
from tests.support.cluster import Cluster
from tests.support.fault_proxy import ProxiedKafka, proxied_kafka

pytestmark = [pytest.mark.kafka, pytest.mark.asyncio, pytest.mark.usefixtures("collect_leaked_connections"),
              pytest.mark.filterwarnings(LEAKED_CONNECTION)]

INT, JSON = IntegerSerde(), JsonSerde()
# Client calls give up quickly, so the outage shows up as timeouts in the engine.
FAST = {"request_timeout_ms": 2_000, "retry_backoff_ms": 50, "retry_backoff_max_ms": 200,
        "session_timeout_ms": 30_000, "heartbeat_interval_ms": 1_000, "commit_interval_ms": 100}


@pytest.fixture(scope="module")
def kafka() -> Iterator[ProxiedKafka]:
    with proxied_kafka() as cluster:
        yield cluster


@pytest.fixture
def cluster(kafka: ProxiedKafka) -> Iterator[Cluster]:
    kafka.proxy.pass_through()
    yield Cluster(open_transport({"bootstrap.servers": kafka.bootstrap}), kafka.bootstrap)
    kafka.proxy.pass_through()


async def test_an_outage_shorter_than_task_timeout_is_ridden_out(kafka: ProxiedKafka, cluster: Cluster) -> None:
    run = uuid.uuid4().hex[:6]
    source, sink = f"in-{run}", f"out-{run}"
    await cluster.create_topics({source: 2, sink: 2})
    first = [(i, {"n": 2 * i}) for i in range(100)]
    await cluster.produce(source, first, INT, JSON, partitions=2)
    streams = make_streams(doubling_topology(source, sink), kafka.bootstrap, f"app-{run}",
                           task_timeout_ms=120_000, **FAST)
    async with streams:
        await cluster.read(sink, 100, timeout=60)
        kafka.proxy.stall_for(5.0)  # longer than request.timeout.ms: commits and produces time out
        await eventually_async(lambda: kafka.proxy.mode.name == "PASS_THROUGH", 30, "the stall to end")
        second = [(i, {"n": 2 * i}) for i in range(100, 200)]
        await cluster.produce(source, second, INT, JSON, partitions=2)
        expected = {repr(x) for x in expected_doubling(first + second)}

        async def everything_out() -> bool:
            out = {repr((INT.deserialize(r.key), JSON.deserialize(r.value))) for r in await cluster.read_all(sink)}
            return expected <= out

        await eventually_async(everything_out, 60, "all 200 records in the output")
        assert streams.metric("failed-stream-threads") == 0
        assert streams.state is ClientState.RUNNING


async def test_an_outage_longer_than_task_timeout_ends_in_task_timeout_error(
        kafka: ProxiedKafka, cluster: Cluster) -> None:
    run = uuid.uuid4().hex[:6]
    source, sink = f"in-{run}", f"out-{run}"
    await cluster.create_topics({source: 1, sink: 1})
    await cluster.produce(source, [(0, {"n": 2})], INT, JSON, partitions=1)
    holding = threading.Event()
    release = threading.Event()

    def hold(value: dict) -> dict:
        holding.set()
        release.wait(30)
        return value

    builder = StreamsBuilder()
    builder.stream(source, key_serde=INT, value_serde=JSON).map_values(hold).to(sink, key_serde=INT, value_serde=JSON)
    errors: list[BaseException] = []
    streams = make_streams(builder.build(), kafka.bootstrap, f"app-{run}", task_timeout_ms=3_000, **FAST)
    streams.set_uncaught_exception_handler(
        lambda exc: errors.append(exc) or StreamThreadExceptionResponse.SHUTDOWN_CLIENT)
    await streams.start_async()
    try:
        await eventually_async(holding.is_set, 60, "the record in the processor")
        kafka.proxy.stall()  # the broker is gone for longer than task.timeout.ms
        release.set()  # the output and the commit now hit the outage
        assert await streams.wait_for_state_async(ClientState.ERROR, timeout=60)
    finally:
        kafka.proxy.pass_through()
        release.set()
        await streams.close_async(timeout=60)
    assert errors and isinstance(errors[0], TaskTimeoutError)
