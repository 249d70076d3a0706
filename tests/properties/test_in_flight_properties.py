"""Several records of one task in flight (num.threads.per.task): order, no loss, the window bound."""

from __future__ import annotations

import asyncio
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamloop import StreamsBuilder
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.transport import open_transport
from tests.support.apps import make_streams
from tests.support.cluster import Cluster

INT, JSON = IntegerSerde(), JsonSerde()

layouts = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3)), min_size=1, max_size=60)  # (key, delay ms)


async def run(layout: list[tuple[int, int]], limit: int, ordering: str, partitions: int,
              threads: int = 1) -> tuple[list, int]:
    bootstrap = f"memory://in-flight-{uuid.uuid4().hex[:8]}"
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    await cluster.create_topics({"in": partitions, "out": partitions})
    records = [(key, {"i": i, "delay": delay}) for i, (key, delay) in enumerate(layout)]
    await cluster.produce("in", records, INT, JSON, partitions=partitions)
    now = {"in_flight": 0, "max": 0}

    async def slow(value: dict) -> dict:
        now["in_flight"] += 1
        now["max"] = max(now["max"], now["in_flight"])
        try:
            await asyncio.sleep(value["delay"] / 1000)
            return value
        finally:
            now["in_flight"] -= 1

    builder = StreamsBuilder()
    builder.stream("in", key_serde=INT, value_serde=JSON).map_values(slow).to("out", key_serde=INT, value_serde=JSON)
    streams = make_streams(builder.build(), bootstrap, "in-flight-app", num_threads_per_task=limit,
                           processing_ordering=ordering, num_stream_threads=threads)
    async with streams:
        await cluster.read("out", len(records), timeout=30)
    output = sorted(await cluster.read_all("out"), key=lambda r: (r.partition, r.offset))
    return [(INT.deserialize(r.key), JSON.deserialize(r.value)["i"], r.partition) for r in output], now["max"]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=layouts, limit=st.integers(2, 16), ordering=st.sampled_from(["partition", "key", "unordered"]),
       partitions=st.integers(1, 3), threads=st.integers(1, 2))
def test_output_order_loss_and_window_bound(layout, limit: int, ordering: str, partitions: int,
                                            threads: int) -> None:
    output, most_in_flight = asyncio.run(run(layout, limit, ordering, partitions, threads))
    # Nothing lost, nothing doubled (a clean run).
    assert sorted(i for _, i, _ in output) == list(range(len(layout)))
    # Input partition = key % partitions; one task per partition, so the bound is per task.
    assert most_in_flight <= limit * min(partitions, len({k % partitions for k, _ in layout}))
    if ordering in ("partition", "key"):
        for key in {k for k, _ in layout}:
            assert [i for k, i, _ in output if k == key] == [i for i, (k, _) in enumerate(layout) if k == key]
    if ordering == "partition":
        # Across keys too: what one input partition wrote to one output partition is in input order.
        for source in range(partitions):
            for target in {p for _, _, p in output}:
                seen = [i for k, i, p in output if k % partitions == source and p == target]
                assert seen == sorted(seen), f"input partition {source} out of order in output {target}"


def test_a_per_processor_override_runs_records_in_flight_with_its_ordering() -> None:
    async def scenario() -> tuple[int, list]:
        bootstrap = f"memory://in-flight-{uuid.uuid4().hex[:8]}"
        cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
        await cluster.create_topics({"in": 1, "out": 1})
        records = [(i % 4, {"i": i, "delay": 2}) for i in range(40)]
        await cluster.produce("in", records, INT, JSON, partitions=1)
        now = {"in_flight": 0, "max": 0}

        async def slow(value: dict) -> dict:
            now["in_flight"] += 1
            now["max"] = max(now["max"], now["in_flight"])
            try:
                await asyncio.sleep(0.002)
                return value
            finally:
                now["in_flight"] -= 1

        builder = StreamsBuilder()
        (builder.stream("in", key_serde=INT, value_serde=JSON)
                .map_values(slow, concurrency=16, ordering="key")
                .to("out", key_serde=INT, value_serde=JSON))
        async with make_streams(builder.build(), bootstrap, "override-app"):  # config says 1
            out = await cluster.read("out", 40, timeout=30)
        return now["max"], [(INT.deserialize(r.key), JSON.deserialize(r.value)["i"]) for r in out]

    most, output = asyncio.run(scenario())
    assert 1 < most <= 4  # four keys: at most one record per key in flight
    for key in range(4):
        assert [i for k, i in output if k == key] == [i for i in range(40) if i % 4 == key]
