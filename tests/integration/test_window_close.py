"""Windows that close when the input goes quiet, end to end on the memory broker and on real Kafka.

One application, two ways to the same final counts per two-second window, both closed on the wall
clock after a second without records: ``EmitStrategy.on_window_close()`` on the aggregation, and a
cached count suppressed ``until_window_closes`` with a wall-clock close. No record after the last
one closes anything by stream time. After a restart from a fresh state directory (the stores come
back from their changelogs only) a record late for a closed window is dropped by both, and nothing
goes out twice.
"""

from __future__ import annotations

import time

import pytest

from streamloop import BufferConfig, EmitStrategy, Materialized, StreamsBuilder, Suppressed, TimeWindows
from streamloop.serdes import LongSerde, StringSerde
from streamloop.testing import eventually_async
from tests.support.apps import make_streams
from tests.support.cluster import Cluster

pytestmark = pytest.mark.asyncio

STR, LONG = StringSerde(), LongSerde()
SIZE = 2_000
WINDOWS = TimeWindows.of_size_with_no_grace(SIZE)


def quiet_close_topology(source: str, final: str, suppressed: str) -> object:
    builder = StreamsBuilder()
    grouped = builder.stream(source, key_serde=STR, value_serde=STR).group_by_key()
    (grouped.windowed_by(WINDOWS)
            .emit_strategy(EmitStrategy.on_window_close().with_wall_clock_close(1_000, check_interval_ms=100))
            .count(materialized=Materialized("final-counts", persistent=False))
            .to_stream().map(lambda w, n: (f"{w.key}@{w.start}", n)).to(final, key_serde=STR, value_serde=LONG))
    (grouped.windowed_by(WINDOWS).count(materialized=Materialized("counts", persistent=False))
            .suppress(Suppressed.until_window_closes(BufferConfig.unbounded())
                      .with_wall_clock_close(1_000, check_interval_ms=100))
            .to_stream().map(lambda w, n: (f"{w.key}@{w.start}", n)).to(suppressed, key_serde=STR, value_serde=LONG))
    return builder.build()


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once_v2"])
async def test_the_last_windows_close_on_a_quiet_wall_clock_and_stay_closed_after_a_restart(
        cluster: Cluster, names, tmp_path, guarantee: str) -> None:  # type: ignore[no-untyped-def]
    """Under exactly-once the emissions of a wall-clock check and the close time they write go in
    the task's transaction like a record's output."""
    if guarantee == "exactly_once_v2" and cluster.bootstrap.startswith("memory://"):
        pytest.skip("the memory broker has no transactions")
    source, final, suppressed = names("clicks"), names("final"), names("suppressed")
    committed = guarantee == "exactly_once_v2"
    await cluster.create_topics({source: 2, final: 1, suppressed: 1})

    async def emitted(topic: str) -> list[tuple[str, int]]:
        return sorted((STR.deserialize(r.key), LONG.deserialize(r.value))
                      for r in await cluster.read_all(topic, read_committed=committed))

    def app():  # type: ignore[no-untyped-def]
        return make_streams(quiet_close_topology(source, final, suppressed), cluster.bootstrap, names.app,
                            state_dir=str(tmp_path / "state"), commit_interval_ms=100,
                            processing_guarantee=guarantee)

    now = int(time.time() * 1000)
    window = now - now % SIZE
    expected = [(f"a@{window}", 2), (f"b@{window}", 1)]
    async with app() as streams:
        for key, timestamp in [("a", window), ("a", window + 1), ("b", window + 2)]:
            await cluster.produce(source, [(key, "click")], STR, STR, partitions=2, timestamp=timestamp)

        async def closed() -> bool:
            return await emitted(final) == expected and await emitted(suppressed) == expected
        await eventually_async(closed, timeout=30, what="the windows closed on the wall clock, once each")
        assert streams.store("final-counts").fetch_range("a", window, window) == [(window, 2)]
    # A fresh state directory: the stores (and the close times) come back from their changelogs only.
    tmp_path.joinpath("state").rename(tmp_path / "old-state")
    async with app():
        # Late for a's closed window; then a record of a new window, on the same partition, after it.
        later = int(time.time() * 1000)
        for timestamp in (window + 3, later):
            await cluster.produce(source, [("a", "click")], STR, STR, partitions=2, timestamp=timestamp)
        after = [*expected, (f"a@{later - later % SIZE}", 1)]

        async def next_closed() -> bool:
            return await emitted(final) == sorted(after) and await emitted(suppressed) == sorted(after)
        await eventually_async(next_closed, timeout=30, what="the new window closed, the late record dropped")
