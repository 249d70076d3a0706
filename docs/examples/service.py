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

The topology reads JSON ``{"n": int}`` values from the input topic and writes
``{"n": n, "squared": n * n}`` to the output topic, keys unchanged. A record that is not
JSON fails the stream thread (the default handler), so the client goes to ERROR and
``/health`` answers 503 from then on.

Run it (``--create-topics`` makes the two topics first)::

    python docs/examples/service.py --bootstrap memory://demo --create-topics --port 8080
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import AsyncIterator, Mapping
from typing import Any

from aiohttp import web

from engine import ClientState, InvalidStateStoreError, KafkaStreams, Materialized, StreamsBuilder, Topology
from engine.serdes import JsonSerde, StringSerde
from engine.transport import open_transport


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
            .count(materialized=Materialized("numbers-by-parity", persistent=False)))
    return builder.build()


STREAMS = web.AppKey("streams", KafkaStreams)
COUNTER = web.AppKey("counter", ProcessedCounter)


def make_app(config: Mapping[str, Any], source: str, sink: str) -> web.Application:
    """The service: its client is made and started when the app starts, closed when it stops."""
    app = web.Application()
    app[COUNTER] = ProcessedCounter()

    async def streams_lifespan(app: web.Application) -> AsyncIterator[None]:
        streams = KafkaStreams(build_topology(source, sink, app[COUNTER]), config)
        app[STREAMS] = streams
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
    try:
        # A read-only view over this instance's tasks; reads are quick and never block the loop.
        store = request.app[STREAMS].store("numbers-by-parity")
    except InvalidStateStoreError as exc:
        return web.json_response({"error": str(exc)}, status=503)
    return web.json_response({"parity": parity, "count": store.get(parity) or 0})


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
    config = {"application.id": args.application_id, "bootstrap.servers": args.bootstrap}
    app = make_app(config, args.source, args.sink)
    if args.create_topics:
        async def topics_first(_app: web.Application) -> None:
            await create_topics(args.bootstrap, {args.source: 2, args.sink: 2})

        app.on_startup.insert(0, topics_first)
    web.run_app(app, host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
