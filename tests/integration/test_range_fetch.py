"""The executors' reads of offset ranges (``streamloop.transport.kafka.range_fetch``) on Kafka,
outside Spark: one worker's consumer, kept from range to range, gives each range's records in
order, and its fetches do not wait on the broker for records that a range never needs."""

from __future__ import annotations

from typing import Any

import anyio.to_thread
import pytest

from streamloop.serdes import IntegerSerde
from streamloop.transport.kafka import executor_clients
from streamloop.transport.kafka.range_fetch import FETCH_MAX_WAIT_MS, fetch_range
from tests.support.cluster import Cluster

pytestmark = [pytest.mark.asyncio, pytest.mark.kafka]

INT = IntegerSerde()


@pytest.fixture
def bootstrap(kafka_bootstrap: str) -> str:
    return kafka_bootstrap


def _read(kafka: dict[str, Any], topic: str, ranges: list[tuple[int, int]]) -> list[list[int]]:
    # fetch_range runs its own event loop (as in a Spark worker): on a thread of its own here.
    return [[INT.deserialize(r.value) for r in fetch_range(kafka, topic, 0, start, end, 30_000)]
            for start, end in ranges]


async def test_successive_ranges_share_one_consumer_whose_fetches_do_not_wait(cluster: Cluster, names: Any) -> None:
    topic = names("ranges")
    await cluster.create_topics({topic: 1})
    await cluster.produce(topic, [(0, i) for i in range(60)], INT, INT, 1)
    # The user's fetch.max.wait.ms (500, aiokafka's default) is what an executor would be given.
    kafka = {"bootstrap_servers": cluster.bootstrap, "fetch_max_wait_ms": 500}
    ranges = [(0, 10), (10, 25), (25, 26), (26, 60)]
    try:
        read = await anyio.to_thread.run_sync(_read, kafka, topic, ranges)
        assert read == [list(range(start, end)) for start, end in ranges]
        consumers = [c for (kind, _options), c in executor_clients._clients.items() if kind == "consumer"]
        assert len(consumers) == 1  # kept across the ranges
        # A range's records are in the log already: a fetch that waits on the broker only delays the
        # next range's first fetch (500 ms a range before this bound).
        assert consumers[0]._fetch_max_wait_ms <= FETCH_MAX_WAIT_MS
    finally:
        await anyio.to_thread.run_sync(executor_clients._close_all)
