"""docs/examples/service.py, the aiohttp service that embeds a client, run as a real server.

It is started on a free loopback port, called over HTTP with aiohttp's client while records flow,
stopped while records still flow, and started again: the second start goes on from what the first
committed, so every record is processed and none twice.
"""

from __future__ import annotations

import asyncio
import importlib.util
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from streamloop.records import TopicPartition
from streamloop.serdes import JsonSerde, StringSerde
from streamloop.testing import eventually_async
from streamloop.transport.base import ProducerSettings
from tests.support.apps import streams_config
from tests.support.cluster import Cluster, committed_offset

pytestmark = pytest.mark.asyncio

STR, JSON = StringSerde(), JsonSerde()
EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "service.py"
PARTITIONS = 2
TOTAL = 1_500


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("service_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def loopback_socket() -> socket.socket:
    """A socket bound to a free loopback port (known before the app that serves on it is made)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock


@asynccontextmanager
async def serving(app: web.Application, sock: socket.socket | None = None) -> AsyncIterator[str]:
    """The app as a real HTTP server on a free loopback port (or ``sock``'s); yields its base URL."""
    sock = sock or loopback_socket()
    port = sock.getsockname()[1]
    runner = web.AppRunner(app)
    await runner.setup()  # runs the lifespan: the client starts here
    try:
        await web.SockSite(runner, sock).start()
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()  # the lifespan's exit: the client finishes, commits and closes


async def get(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with session.get(url) as response:
        return response.status, await response.json()


async def produce(cluster: Cluster, topic: str, numbers: range, raw: bytes | None = None) -> None:
    producer = cluster.transport.producer(ProducerSettings(client_id="service-test"))
    await producer.start()
    try:
        for n in numbers:
            key = f"k{n}"
            value = raw if raw is not None else JSON.serialize({"n": n})
            producer.append(topic, n % PARTITIONS, STR.serialize(key), value, None, ())
            if n % 100 == 99:
                await producer.send_buffered()
                await asyncio.sleep(0)  # let the service's loop serve requests between batches
        await producer.flush()
    finally:
        await producer.close()


async def output_keys(cluster: Cluster, topic: str) -> list[str]:
    return [STR.deserialize(r.key) for r in await cluster.read_all(topic)]


async def test_service_serves_health_while_records_flow_and_a_restart_loses_nothing(cluster: Cluster,
                                                                                   names) -> None:
    service = load_example()
    source, sink = names("numbers"), names("squares")
    await cluster.create_topics({source: PARTITIONS, sink: PARTITIONS})
    config = streams_config(cluster.bootstrap, names.app, commit_interval_ms=200)

    async with aiohttp.ClientSession() as session:
        app = service.make_app(config, source, sink)
        async with serving(app) as url:
            first_half = asyncio.create_task(produce(cluster, source, range(TOTAL // 2)))
            health: list[tuple[int, Any]] = []

            async def running() -> bool:
                health.append(await get(session, f"{url}/health"))
                return health[-1][0] == 200

            await eventually_async(running, timeout=30, what="/health answers 200")
            # 200 exactly when the client says RUNNING, 503 with its state otherwise.
            assert all((status == 200) == (body["state"] == "RUNNING") for status, body in health)
            await eventually_async(lambda: get_processed(session, url), timeout=30,
                                   what="records processed while the service serves")
            # The service stops while the second half is being produced.
            second_half = asyncio.create_task(produce(cluster, source, range(TOTAL // 2, TOTAL)))
        await asyncio.gather(first_half, second_half)
        first_run = app[service.COUNTER].count
        assert first_run > 0

        # Started again: it goes on from the last commit; nothing is lost and nothing is redone.
        app = service.make_app(config, source, sink)
        async with serving(app) as url:
            async def all_out() -> bool:
                return len(set(await output_keys(cluster, sink))) == TOTAL

            await eventually_async(all_out, timeout=60, what=f"all {TOTAL} keys in the output")
            status, body = await get(session, f"{url}/processed")
            assert (status, body["processed"]) == (200, TOTAL - first_run)
            # The table's counts cover both runs: restored from its changelog after the restart.
            for parity in ("even", "odd"):
                async def counted(parity: str = parity) -> bool:
                    return await get(session, f"{url}/count/{parity}") == (
                        200, {"parity": parity, "count": TOTAL // 2})
                await eventually_async(counted, timeout=30, what=f"/count/{parity} is {TOTAL // 2}")

        keys = await output_keys(cluster, sink)
        assert sorted(keys) == sorted(f"k{n}" for n in range(TOTAL))  # each exactly once
        for partition in range(PARTITIONS):
            tp = TopicPartition(source, partition)
            assert await committed_offset(cluster, names.app, tp) == TOTAL // PARTITIONS

        # A record no serde can read fails the thread: the client goes to ERROR, /health 503.
        await produce(cluster, source, range(1), raw=b"{not json")
        async with serving(service.make_app(config, source, sink)) as url:
            async def unhealthy() -> bool:
                return await get(session, f"{url}/health") == (503, {"state": "ERROR"})

            await eventually_async(unhealthy, timeout=30, what="/health answers 503 in ERROR")


async def get_processed(session: aiohttp.ClientSession, url: str) -> bool:
    status, body = await get(session, f"{url}/processed")
    return status == 200 and body["processed"] > 0


async def test_two_instances_send_each_query_to_the_instance_that_owns_the_key(cluster: Cluster, names,
                                                                               tmp_path: Path) -> None:
    """Each instance sets application.server to its own address; /count/{parity} asked of either
    instance is answered by the store of the instance its query metadata names, over one HTTP hop."""
    service = load_example()
    source, sink = names("numbers"), names("squares")
    await cluster.create_topics({source: PARTITIONS, sink: PARTITIONS})
    total = 60
    await produce(cluster, source, range(total))
    sockets = [loopback_socket(), loopback_socket()]
    endpoints = [f"127.0.0.1:{sock.getsockname()[1]}" for sock in sockets]
    apps = [service.make_app(streams_config(cluster.bootstrap, names.app, application_server=endpoint,
                                            state_dir=str(tmp_path / endpoint)), source, sink)
            for endpoint in endpoints]

    async with aiohttp.ClientSession() as session, AsyncExitStack() as stack:
        urls = [await stack.enter_async_context(serving(app, sock)) for app, sock in zip(apps, sockets, strict=True)]
        instances = [app[service.STREAMS] for app in apps]

        def both_own_a_part() -> bool:
            return all(s.state.name == "RUNNING" and
                       sorted(str(m.host_info) for m in s.metadata_for_all_clients()) == sorted(endpoints)
                       for s in instances)

        await eventually_async(both_own_a_part, timeout=60, what="both instances own partitions")
        answers: list[tuple[str, str, str]] = []  # (asked, parity, served by)

        async def all_counted() -> bool:
            answers.clear()
            for url, asked in zip(urls, endpoints, strict=True):
                for parity in ("even", "odd"):
                    async with session.get(f"{url}/count/{parity}") as response:
                        if (response.status, await response.json()) != (200, {"parity": parity, "count": total // 2}):
                            return False
                        answers.append((asked, parity, response.headers["X-Served-By"]))
            return True

        await eventually_async(all_counted, timeout=30, what="both instances answer both counts")
        for _asked, parity, served_by in answers:
            owner = instances[0].query_metadata_for_key(service.STORE, parity, STR)
            assert owner is not None and served_by == owner.active_host.endpoint
        assert any(asked != served_by for asked, _parity, served_by in answers)  # some went one hop on
