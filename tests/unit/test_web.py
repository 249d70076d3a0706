"""``streamloop.web`` over real HTTP on a ``memory://`` broker: the probes, /metrics and the queries of one
instance (two instances, forwarding between them, run on a real broker: tests/integration/test_web_queries.py)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from streamloop import ClientState, KafkaStreams, StreamsBuilder, TimeWindows, TopicPartition
from streamloop.serdes import StringSerde
from streamloop.state import Materialized
from streamloop.testing import eventually_async
from streamloop.transport.memory import MemoryBroker
from streamloop.transport.memory.log import ProducedRecord
from streamloop.web import StreamsHttpServer, parse_key, to_json
from tests.support.apps import streams_config

STR = StringSerde()
WAIT = 15.0


def topology() -> Any:
    builder = StreamsBuilder()
    words = builder.stream("in", key_serde=STR, value_serde=STR)
    grouped = words.group_by_key(key_serde=STR)
    grouped.count(materialized=Materialized("counts", persistent=False))
    grouped.windowed_by(TimeWindows.of_size_with_no_grace(1000)).count(
        materialized=Materialized("per-second", persistent=False))
    return builder.build()


class Instance:
    def __init__(self, streams: KafkaStreams, server: StreamsHttpServer, session: aiohttp.ClientSession,
                 broker: MemoryBroker) -> None:
        self.streams, self.server, self.session, self.broker = streams, server, session, broker
        self.url = f"http://127.0.0.1:{server.port}"

    async def get(self, path: str) -> tuple[int, Any]:
        async with self.session.get(self.url + path) as response:
            return response.status, await response.json(content_type=None)

    def produce(self, partition: int, key: str, value: str, timestamp: int) -> None:
        record = ProducedRecord(key.encode(), value.encode(), timestamp, ())
        assert not self.broker.produce({TopicPartition("in", partition): [record]})


@pytest_asyncio.fixture
async def instance(tmp_path: Any) -> AsyncIterator[Instance]:
    name = f"web-{uuid.uuid4().hex[:10]}"
    broker = MemoryBroker.for_url(f"memory://{name}")
    broker.create_topics({"in": 2})
    streams = KafkaStreams(topology(), streams_config(f"memory://{name}", f"app-{name}", state_dir=str(tmp_path)))
    server = StreamsHttpServer(streams, "127.0.0.1", 0)
    await server.start()
    try:
        async with aiohttp.ClientSession() as session, streams:
            yield Instance(streams, server, session, broker)
    finally:
        await server.close()
        MemoryBroker.reset(name)


@pytest.mark.asyncio
async def test_the_probes_answer_200_when_ok_and_503_with_the_reason_otherwise(instance: Instance) -> None:
    await eventually_async(lambda: instance.streams.state is ClientState.RUNNING, WAIT, "running")
    assert await instance.get("/health/live") == (200, {"state": "RUNNING"})

    # RUNNING comes with the assignment; ready also waits for the tasks' stores to be restored.
    async def ready() -> bool:
        return (await instance.get("/health/ready"))[0] == 200

    await eventually_async(ready, WAIT, "ready")
    assert await instance.get("/health/ready") == (200, {"state": "RUNNING"})
    assert (await instance.get("/health/ready?max_lag=x"))[0] == 400
    assert (await instance.get("/health/ready?max_lag=-1"))[0] == 400


@pytest.mark.asyncio
async def test_metrics_are_served_in_prometheus_format(instance: Instance) -> None:
    async with instance.session.get(instance.url + "/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        assert "kafka_streams_stream_metrics_alive_stream_threads" in await response.text()


@pytest.mark.asyncio
async def test_a_key_a_range_a_window_fetch_and_the_store_metadata(instance: Instance) -> None:
    await eventually_async(lambda: instance.streams.state is ClientState.RUNNING, WAIT, "running")
    for partition, key, at in [(0, "a", 100), (0, "a", 1500), (1, "b", 200), (0, "c", 300), (0, "a", 1700)]:
        instance.produce(partition, key, "x", at)

    async def counted() -> bool:
        return await instance.get("/stores/counts/keys/a") == (200, {"store": "counts", "key": "a", "value": 3})

    await eventually_async(counted, WAIT, "a counted three times")
    assert await instance.get("/stores/counts/keys/zzz") == (
        404, {"error": "store 'counts' has no value for this key", "key": "zzz"})
    status, body = await instance.get("/stores/counts/keys")
    assert (status, body["entries"], body["truncated"]) == (
        200, [{"key": "a", "value": 3}, {"key": "b", "value": 1}, {"key": "c", "value": 1}], False)
    status, body = await instance.get("/stores/counts/keys?from=b&to=c")
    assert [e["key"] for e in body["entries"]] == ["b", "c"]
    status, body = await instance.get("/stores/counts/keys?limit=2")
    assert ([e["key"] for e in body["entries"]], body["truncated"]) == (["a", "b"], True)

    assert await instance.get("/stores/per-second/windows/a?from=0&to=5000") == (200, {
        "store": "per-second", "key": "a",
        "windows": [{"start": 0, "end": 1000, "value": 1}, {"start": 1000, "end": 2000, "value": 2}]})
    assert (await instance.get("/stores/per-second/windows/a?from=1000&to=5000"))[1]["windows"] == [
        {"start": 1000, "end": 2000, "value": 2}]

    status, body = await instance.get("/stores/counts")
    # No application.server: this instance publishes no endpoint, so the group names none.
    assert (status, body["store"], body["type"], body["instances"]) == (200, "counts", "key_value", [])
    assert (await instance.get("/stores/per-second"))[1]["type"] == "window"


@pytest.mark.asyncio
async def test_mistakes_are_answered_with_what_was_wrong(instance: Instance) -> None:
    await eventually_async(lambda: instance.streams.state is ClientState.RUNNING, WAIT, "running")
    status, body = await instance.get("/stores/nope/keys/a")
    assert status == 404 and "no store 'nope'" in body["error"] and "counts" in body["error"]
    status, body = await instance.get("/stores/per-second/keys/a")
    assert status == 400 and "/stores/per-second/windows/" in body["error"]
    status, body = await instance.get("/stores/counts/windows/a")
    assert status == 400 and "not a window store" in body["error"]
    status, body = await instance.get("/stores/per-second/windows/a?from=soon")
    assert status == 400 and "from must be an integer" in body["error"]


def test_a_key_is_text_for_a_string_serde_and_json_for_others() -> None:
    from streamloop.serdes import IntegerSerde, JsonSerde

    assert parse_key("42", StringSerde()) == "42"
    assert parse_key("42", IntegerSerde()) == 42
    assert parse_key('{"id": 1}', JsonSerde()) == {"id": 1}
    assert parse_key("even", JsonSerde()) == "even"


def test_values_json_cannot_hold_go_through_the_serde() -> None:
    from streamloop.serdes import BytesSerde

    assert to_json(b'{"n": 1}', BytesSerde()) == {"n": 1}
    assert to_json(b"\xff", BytesSerde()) == {"base64": "/w=="}
    assert to_json({"n": [1, 2]}) == {"n": [1, 2]}




@pytest.mark.asyncio
async def test_a_stores_instances_are_public_with_their_serdes(instance: Instance) -> None:
    """What the endpoint needs of a store (its serdes, a window size) is the client's public API,
    for a service that serves its stores from a framework of its own."""
    await eventually_async(lambda: instance.streams.state is ClientState.RUNNING, WAIT, "running")
    await eventually_async(lambda: len(instance.streams.store_instances("counts")) == 2, WAIT, "both tasks' stores")
    assert {type(store.key_serde).__name__ for store in instance.streams.store_instances("counts")} == {"StringSerde"}
    assert instance.streams.store_instances("no-such-store") == []
