"""For random input, partition counts and thread counts, the output is the transformed input:
nothing lost, nothing doubled (a clean run), per-key (hence per-partition) order kept."""

from __future__ import annotations

import asyncio
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.transport import open_transport
from tests.support.apps import doubling_topology, expected_doubling, make_streams
from tests.support.cluster import Cluster

INT, JSON = IntegerSerde(), JsonSerde()

records_strategy = st.lists(
    st.tuples(st.integers(0, 7), st.integers(-1000, 1000)).map(lambda kv: (kv[0], {"n": kv[1]})),
    max_size=120,
)


async def run_pipeline(records: list, partitions: int, threads: int) -> list[tuple[int, dict]]:
    bootstrap = f"memory://prop-{uuid.uuid4().hex[:8]}"
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    await cluster.create_topics({"in": partitions, "out": partitions})
    await cluster.produce("in", records, INT, JSON, partitions=partitions)
    expected = expected_doubling(records)
    streams = make_streams(doubling_topology("in", "out"), bootstrap, "prop-app", num_stream_threads=threads)
    async with streams:
        await cluster.read("out", len(expected), timeout=20)
    # After a clean close: everything that was written, so duplicates would show.
    output = await cluster.read_all("out")
    in_order = sorted(output, key=lambda r: (r.partition, r.offset))
    return [(INT.deserialize(r.key), JSON.deserialize(r.value)) for r in in_order]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=records_strategy, partitions=st.integers(1, 4), threads=st.integers(1, 3))
def test_output_is_the_transformed_input_in_per_key_order(records: list, partitions: int, threads: int) -> None:
    output = asyncio.run(run_pipeline(records, partitions, threads))
    expected = expected_doubling(records)
    assert sorted(map(repr, output)) == sorted(map(repr, expected))
    for key in {k for k, _ in records}:
        assert [v for k, v in output if k == key] == [v for k, v in expected if k == key]
