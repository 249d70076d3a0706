"""Config and topologies shared by the behavioural tests."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from streamloop import KafkaStreams, StreamsBuilder, Topology
from streamloop.serdes import IntegerSerde, JsonSerde, LongSerde, StringSerde
from streamloop.state import Materialized

if TYPE_CHECKING:
    from tests.support.cluster import Cluster


def streams_config(bootstrap: str, app: str, **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "application.id": app,
        "bootstrap.servers": bootstrap,
        "commit.interval.ms": 100,
        "poll.ms": 50,
        "session.timeout.ms": 10_000,
        "heartbeat.interval.ms": 300,
        "max.poll.interval.ms": 30_000,
        "request.timeout.ms": 15_000,
        "linger.ms": 1,
    }
    config.update({k.replace("_", "."): v for k, v in overrides.items()})
    return config


def doubling_topology(source: str, sink: str) -> Topology:
    """Keys are ints, values JSON ``{"n": int}``; keeps even ``n`` and doubles it."""
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=IntegerSerde(), value_serde=JsonSerde())
            .filter(lambda key, value: value["n"] % 2 == 0)
            .map_values(lambda value: {"n": value["n"], "double": value["n"] * 2})
            .to(sink, key_serde=IntegerSerde(), value_serde=JsonSerde()))
    return builder.build()


def expected_doubling(records: list[tuple[int, dict[str, int]]]) -> list[tuple[int, dict[str, int]]]:
    return [(k, {"n": v["n"], "double": v["n"] * 2}) for k, v in records if v["n"] % 2 == 0]


def make_streams(topology: Topology, bootstrap: str, app: str, **overrides: Any) -> KafkaStreams:
    return KafkaStreams(topology, streams_config(bootstrap, app, **overrides))


def count_topology(source: str, sink: str, store: str = "counts", persistent: bool | None = None,
                   fail_on: set[str] | None = None) -> Any:
    """Counts records per key; ``fail_on`` values make the counting processor raise once each."""
    builder = StreamsBuilder()
    stream = builder.stream(source, key_serde=StringSerde(), value_serde=StringSerde())
    if fail_on:
        failed: set[str] = set()

        def maybe_fail(value: str) -> str:
            if value in fail_on and value not in failed:
                failed.add(value)
                raise RuntimeError(f"injected failure at {value}")
            return value

        stream = stream.map_values(maybe_fail)
    (stream.group_by_key(key_serde=StringSerde())
           .count(materialized=Materialized(store, persistent=persistent))
           .to_stream()
           .to(sink, key_serde=StringSerde(), value_serde=LongSerde()))
    return builder.build()


@asynccontextmanager
async def doubling_running(cluster: Cluster, names: Any, hold: threading.Event | None = None, **overrides: Any
                           ) -> AsyncIterator[tuple[KafkaStreams, str, str]]:
    """A doubling app (``overrides``: of its config) that has processed its first record (so its
    group is settled); closed after, with ``hold`` cleared first (a close waits for a commit a test holds)."""
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    streams = make_streams(doubling_topology(source, sink), cluster.bootstrap, names.app, **overrides)
    await streams.start_async()
    try:
        await cluster.produce(source, [(0, {"n": 0})], IntegerSerde(), JsonSerde(), 1)
        await cluster.read(sink, 1)
        yield streams, source, sink
    finally:
        if hold is not None:
            hold.clear()
        await streams.close_async(timeout=30)
