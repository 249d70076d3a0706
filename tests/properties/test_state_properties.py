"""For random input and random crashes (a thread dies at random records and is replaced, or the
whole client stops and starts again), the final counts per key equal a pure-Python model:
restoring from the changelog neither loses an update nor applies one twice."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import StreamsBuilder
from engine.serdes import LongSerde, StringSerde
from engine.state import Materialized
from engine.testing import eventually_async
from engine.transport import open_transport
from handlers import StreamThreadExceptionResponse
from tests.support.apps import make_streams
from tests.support.cluster import Cluster

STR, LONG = StringSerde(), LongSerde()


def counting(fail_at: set[int], persistent: bool):
    """Counts per key; the record with value ``i`` in ``fail_at`` makes the thread die once."""
    failed: set[int] = set()

    def maybe_fail(value: str) -> str:
        i = int(value)
        if i in fail_at and i not in failed:
            failed.add(i)
            raise RuntimeError(f"crash at record {i}")
        return value

    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=STR)
            .map_values(maybe_fail)
            .group_by_key()
            .count(materialized=Materialized("counts", persistent=persistent))
            .to_stream()
            .to("out", key_serde=STR, value_serde=LONG))
    return builder.build()


async def run(keys: list[int], partitions: int, fail_at: set[int], restart_after: int | None, cache: int,
              persistent: bool, state_dir: str) -> dict[str, int]:
    bootstrap = f"memory://state-prop-{uuid.uuid4().hex[:8]}"
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    await cluster.create_topics({"in": partitions, "out": partitions})
    records = [(f"k{k}", str(i)) for i, k in enumerate(keys)]
    split = len(records) if restart_after is None else min(restart_after, len(records))
    latest: dict[str, int] = {}

    async def counted(target: dict[str, int]) -> bool:
        for r in await cluster.read_all("out"):
            latest[STR.deserialize(r.key)] = LONG.deserialize(r.value)
        return latest == target

    phases = [records[:split], records[split:]] if split < len(records) else [records]
    produced: list[tuple[str, str]] = []
    for phase in phases:
        produced += phase
        await cluster.produce("in", phase, STR, STR, partitions=partitions)
        streams = make_streams(counting(fail_at, persistent), bootstrap, "state-prop", state_dir=state_dir,
                               cache_max_bytes_buffering=cache, commit_interval_ms=20)
        streams.set_uncaught_exception_handler(lambda _exc: StreamThreadExceptionResponse.REPLACE_THREAD)
        target = dict(Counter(k for k, _ in produced))
        async with streams:
            await eventually_async(lambda: counted(target), timeout=30, what=f"counts {target}")
    return latest


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(keys=st.lists(st.integers(0, 5), min_size=1, max_size=80), partitions=st.integers(1, 3),
       crashes=st.sets(st.floats(0, 1), max_size=3), restart=st.one_of(st.none(), st.floats(0.05, 0.95)),
       cache=st.sampled_from([0, 300, 1 << 20]), persistent=st.booleans())
def test_counts_equal_the_model_across_crashes_and_restarts(tmp_path_factory, keys, partitions, crashes, restart,
                                                           cache, persistent) -> None:
    state_dir = str(tmp_path_factory.mktemp("state"))
    # Crash and restart points are fractions of the input, so short inputs get them too.
    fail_at = {min(int(c * len(keys)), len(keys) - 1) for c in crashes}
    restart_after = None if restart is None else max(1, int(restart * len(keys)))
    result = asyncio.run(run(keys, partitions, fail_at, restart_after, cache, persistent, state_dir))
    assert result == dict(Counter(f"k{k}" for k in keys))
