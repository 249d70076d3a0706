"""An aiohttp service that embeds a streamloop client on its own event loop.

The client starts in the application's lifespan (an aiohttp cleanup context) with
``async with streams:``, which starts and closes the stream threads without blocking
the service's loop: requests are served while the client joins its group, and a
clean stop finishes the records in progress and commits them before the service exits.

- ``GET /health``: 200 while the client is RUNNING, 503 otherwise, with the state.
- ``GET /processed``: how many records the topology has processed since the start.
- ``GET /count/{parity}``: how many ``even`` or ``odd`` numbers were seen in all, an
  interactive query of the table ``numbers-by-parity`` (kept in a changelog, so it
  survives restarts); 503 while the client cannot answer queries.

``streamloop run --http`` serves the same (health probes, a key's value forwarded to its owner,
ranges, window fetches) for any topology without a service of your own (docs/state.md, "Queries
over HTTP"); this example shows how a service does it itself, next to routes of its own.

Run as several instances (each with its own ``--port``), each sets ``application.server`` to
its own address, and ``/count/{parity}`` asks the instance that owns the key: the client's
``query_metadata_for_key`` names it, and a request for a key another instance owns is sent on
to it over HTTP (once: a forwarded request is answered where it lands). The header
``X-Served-By`` names the instance whose store answered.

The topology reads JSON ``{"n": int}`` values from the input topic and writes
``{"n": n, "squared": n * n}`` to the output topic, keys unchanged. A record that is not
JSON fails the stream thread (the default handler), so the client goes to ERROR and
``/health`` answers 503 from then on.

Run it (``--create-topics`` makes the two topics first)::

    python docs/examples/service.py --bootstrap memory://demo --create-topics --port 8080

and a second instance next to it, on a Kafka cluster (memory:// brokers live in one process)::

    python docs/examples/service.py --bootstrap localhost:9092 --create-topics --port 8080
    python docs/examples/service.py --bootstrap localhost:9092 --port 8081
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
from aiohttp import web

from streamloop import (
    ClientState,
    HostInfo,
    IllegalStateError,
    InvalidStateStoreError,
    KafkaStreams,
    KeyQueryMetadata,
    Materialized,
    StreamsBuilder,
    Topology,
)
from streamloop.serdes import JsonSerde, StringSerde
from streamloop.transport import open_transport


class ProcessedCounter:
    """Counts records from the stream threads; read by request handlers on the service's loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    def add(self, _key: Any, _value: Any) -> None:
        with self._lock:
            self._count += 1

    @property
    def count(self) -> int:
        return self._count


def build_topology(source: str, sink: str, counter: ProcessedCounter) -> Topology:
    builder = StreamsBuilder()
    numbers = builder.stream(source, key_serde=StringSerde(), value_serde=JsonSerde())
    (numbers.map_values(lambda value: {"n": value["n"], "squared": value["n"] ** 2})
            .peek(counter.add)
            .to(sink, key_serde=StringSerde(), value_serde=JsonSerde()))
    (numbers.group_by(lambda _key, value: "even" if value["n"] % 2 == 0 else "odd", key_serde=StringSerde())
            .count(materialized=Materialized(STORE, persistent=False)))
    return builder.build()


STORE = "numbers-by-parity"
STREAMS = web.AppKey("streams", KafkaStreams)
COUNTER = web.AppKey("counter", ProcessedCounter)
PEERS = web.AppKey("peers", aiohttp.ClientSession)
SELF = web.AppKey("self", str)  # this instance's application.server, "" when it runs alone


def make_app(config: Mapping[str, Any], source: str, sink: str) -> web.Application:
    """The service: its client is made and started when the app starts, closed when it stops."""
    app = web.Application()
    app[COUNTER] = ProcessedCounter()
    app[SELF] = config.get("application.server", "")

    async def streams_lifespan(app: web.Application) -> AsyncIterator[None]:
        streams = KafkaStreams(build_topology(source, sink, app[COUNTER]), config)
        app[STREAMS] = streams
        # For queries sent on to the instance that owns the key; short, so a gone peer costs little.
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as peers:
            app[PEERS] = peers
            async with streams:  # start_async() now, close_async() at shutdown: the loop never blocks
                yield

    app.cleanup_ctx.append(streams_lifespan)
    app.router.add_get("/health", health)
    app.router.add_get("/processed", processed)
    app.router.add_get("/count/{parity}", count)
    return app


async def health(request: web.Request) -> web.Response:
    state = request.app[STREAMS].state
    status = 200 if state is ClientState.RUNNING else 503
    return web.json_response({"state": state.name}, status=status)


async def processed(request: web.Request) -> web.Response:
    return web.json_response({"processed": request.app[COUNTER].count})


async def count(request: web.Request) -> web.Response:
    parity = request.match_info["parity"]
    streams, me = request.app[STREAMS], request.app[SELF]
    if me and "forwarded" not in request.query:
        try:
            metadata = streams.query_metadata_for_key(STORE, parity, StringSerde())
        except IllegalStateError as exc:
            return web.json_response({"error": str(exc)}, status=503)
        if metadata is None or metadata == KeyQueryMetadata.NOT_AVAILABLE:
            return web.json_response({"error": "the owner of the key is not known yet"}, status=503)
        if metadata.active_host != HostInfo.build_from_endpoint(me):
            return await forward(request, metadata.active_host)
    try:
        # A read-only view over this instance's tasks; reads are quick and never block the loop.
        store = streams.store(STORE)
    except InvalidStateStoreError as exc:
        return web.json_response({"error": str(exc)}, status=503)
    return web.json_response({"parity": parity, "count": store.get(parity) or 0}, headers={"X-Served-By": me})


async def forward(request: web.Request, owner: HostInfo) -> web.Response:
    """The same request to the instance that owns the key, marked so that it answers it itself."""
    url = f"http://{owner.endpoint}{request.path}"
    try:
        async with request.app[PEERS].get(url, params={"forwarded": "1"}) as answer:
            body = await answer.json()
            served_by = answer.headers.get("X-Served-By", "")
            return web.json_response(body, status=answer.status, headers={"X-Served-By": served_by})
    except (aiohttp.ClientError, TimeoutError) as exc:
        return web.json_response({"error": f"the owner {owner.endpoint} did not answer: {exc!r}"}, status=503)


async def create_topics(bootstrap: str, topics: Mapping[str, int]) -> None:
    admin = open_transport({"bootstrap.servers": bootstrap}).admin("service-admin")
    await admin.start()
    try:
        await admin.create_topics(topics)
    finally:
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--bootstrap", default="memory://service")
    parser.add_argument("--application-id", default="squares-service")
    parser.add_argument("--source", default="numbers")
    parser.add_argument("--sink", default="squares")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--create-topics", action="store_true")
    args = parser.parse_args()
    # Where the other instances send queries for the keys this one owns (it listens on loopback).
    config = {"application.id": args.application_id, "bootstrap.servers": args.bootstrap,
              "application.server": f"127.0.0.1:{args.port}"}
    app = make_app(config, args.source, args.sink)
    if args.create_topics:
        async def topics_first(_app: web.Application) -> None:
            await create_topics(args.bootstrap, {args.source: 2, args.sink: 2})

        app.on_startup.insert(0, topics_first)
    web.run_app(app, host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
