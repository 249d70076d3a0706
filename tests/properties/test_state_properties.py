"""For random input and random crashes (a thread dies at random records and is replaced, or the
whole client stops and starts again), the final counts per key equal a pure-Python model:
restoring from the changelog neither loses an update nor applies one twice."""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamloop import StreamsBuilder
from streamloop.errors import InvalidStateStoreError
from streamloop.handlers import StreamThreadExceptionResponse
from streamloop.serdes import LongSerde, StringSerde
from streamloop.state import Materialized
from streamloop.testing import eventually_async
from streamloop.transport import open_transport
from tests.support.apps import make_streams
from tests.support.cluster import Cluster

STR, LONG = StringSerde(), LongSerde()
# A long search for a counter-example: STREAMLOOP_STATE_EXAMPLES=1000 (make test runs a few).
EXAMPLES = int(os.environ.get("STREAMLOOP_STATE_EXAMPLES", "12"))


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
              persistent: bool, state_dir: str, commit_ms: int = 20, wipe_on_restart: bool = False,
              ) -> tuple[dict[str, int], dict[str, int]]:
    """Returns the last count per key on the output topic, and the store's content restored from
    the changelog alone after a clean close and a wiped state directory."""
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

    def client():
        streams = make_streams(counting(fail_at, persistent), bootstrap, "state-prop", state_dir=state_dir,
                               cache_max_bytes_buffering=cache, commit_interval_ms=commit_ms)
        streams.set_uncaught_exception_handler(lambda _exc: StreamThreadExceptionResponse.REPLACE_THREAD)
        return streams

    phases = [records[:split], records[split:]] if split < len(records) else [records]
    produced: list[tuple[str, str]] = []
    for number, phase in enumerate(phases):
        if number and wipe_on_restart:
            shutil.rmtree(state_dir, ignore_errors=True)
        produced += phase
        await cluster.produce("in", phase, STR, STR, partitions=partitions)
        target = dict(Counter(k for k, _ in produced))
        async with client() as streams:
            await eventually_async(lambda target=target: counted(target), timeout=30, what=f"counts {target}")
    # Nothing left to process: the restarted client's store is its changelog's content alone.
    shutil.rmtree(state_dir, ignore_errors=True)
    restored: dict[str, int] = {}
    async with client() as streams:

        def store_is(target: dict[str, int]) -> bool:
            restored.clear()
            try:
                restored.update(streams.store("counts").all())
            except InvalidStateStoreError:
                return False  # rebalancing: not queryable yet
            return restored == target

        await eventually_async(lambda: store_is(target), timeout=30, what=f"restored counts {target}")
    return latest, restored


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(keys=st.lists(st.integers(0, 5), min_size=1, max_size=80), partitions=st.integers(1, 3),
       crashes=st.sets(st.floats(0, 1), max_size=3), restart=st.one_of(st.none(), st.floats(0.05, 0.95)),
       cache=st.sampled_from([0, 300, 1 << 20]), persistent=st.booleans(), commit_ms=st.sampled_from([1, 20, 500]),
       wipe=st.booleans())
def test_counts_equal_the_model_across_crashes_and_restarts(tmp_path_factory, keys, partitions, crashes, restart,
                                                           cache, persistent, commit_ms, wipe) -> None:
    """Commits racing processing (every 1 ms to 500 ms), threads dying at random records, restarts
    with and without the state directory: the output and the store restored from the changelog
    alone both equal the model (no update lost because its record was committed, none applied twice)."""
    state_dir = str(tmp_path_factory.mktemp("state"))
    # Crash and restart points are fractions of the input, so short inputs get them too.
    fail_at = {min(int(c * len(keys)), len(keys) - 1) for c in crashes}
    restart_after = None if restart is None else max(1, int(restart * len(keys)))
    output, restored = asyncio.run(run(keys, partitions, fail_at, restart_after, cache, persistent, state_dir,
                                       commit_ms, wipe))
    model = dict(Counter(f"k{k}" for k in keys))
    assert output == model
    assert restored == model
