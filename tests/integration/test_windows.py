"""Session windows, sliding windows and suppress end to end, on the memory broker and on real Kafka.

One scenario, kept short for the Kafka run: session counts suppressed until their sessions close,
with in-memory stores, so that after a restart the sessions and the suppression buffer come back
from their changelogs only; a record after the restart still merges into a restored session, and
each closed session is emitted once.
"""

from __future__ import annotations

import pytest

from streamloop import BufferConfig, Materialized, SessionWindows, SlidingWindows, StreamsBuilder, Suppressed, Windowed
from streamloop.serdes import LongSerde, StringSerde
from streamloop.testing import eventually_async
from tests.support.apps import make_streams
from tests.support.cluster import Cluster
from tests.support.event_time import recent_ms

pytestmark = pytest.mark.asyncio

STR, LONG = StringSerde(), LongSerde()


def sessions_topology(source: str, sink: str) -> object:
    builder = StreamsBuilder()
    clicks = builder.stream(source, key_serde=STR, value_serde=STR).group_by_key()
    (clicks.windowed_by(SessionWindows.of_inactivity_gap_with_no_grace(1000))
           .count(materialized=Materialized("sessions", persistent=False))
           .suppress(Suppressed.until_window_closes(BufferConfig.unbounded()))
           .to_stream()
           .map(lambda w, n: (f"{w.key}@{w.start}-{w.end}", n))
           .to(sink, key_serde=STR, value_serde=LONG))
    clicks.windowed_by(SlidingWindows.of_time_difference_with_no_grace(1000)).count(
        materialized=Materialized("sliding", persistent=False))
    return builder.build()


async def test_suppressed_session_counts_survive_a_restart(cluster: Cluster, names, tmp_path) -> None:
    source, sink = names("clicks"), names("sessions")
    await cluster.create_topics({source: 2, sink: 2})
    t = recent_ms()  # the windowed changelogs must outlive the broker's time-based retention
    for key, timestamp in [("a", t), ("a", t + 500), ("b", t + 100)]:
        await cluster.produce(source, [(key, "click")], STR, STR, partitions=2, timestamp=timestamp)

    async def emitted() -> list[tuple[str, int]]:
        return sorted((STR.deserialize(r.key), LONG.deserialize(r.value)) for r in await cluster.read_all(sink))

    def app():  # type: ignore[no-untyped-def]
        return make_streams(sessions_topology(source, sink), cluster.bootstrap, names.app,
                            state_dir=str(tmp_path / "state"), commit_interval_ms=100)

    async with app() as streams:
        await eventually_async(lambda: streams.store("sessions").fetch("a") == [(Windowed("a", t, t + 500), 2)],
                               timeout=30, what="a's first session")
    assert await emitted() == []  # nothing closed yet
    # A fresh state directory: the stores can only come back from their changelogs.
    tmp_path.joinpath("state").rename(tmp_path / "old-state")
    async with app() as streams:
        await cluster.produce(source, [("a", "click")], STR, STR, partitions=2, timestamp=t + 1200)
        # Sliding windows of a, by start - t: [-500, 500] holds 0 and 500 (restored); [200, 1200]
        # holds 500 and 1200, seeded from the restored window of 500; [501, 1501] is 500's right window.
        sliding: dict[int, int] = {}

        def slid() -> bool:
            sliding.clear()
            sliding.update((start - t, n) for start, n in streams.store("sliding").fetch_range("a", t - 1000, t + 2000))
            return sliding == {-1000: 1, -500: 2, 1: 1, 200: 2, 501: 1}
        try:
            await eventually_async(slid, timeout=30, what="a's sliding windows")
        except TimeoutError as exc:
            raise AssertionError(f"a's sliding windows (by start - t) are {sliding}") from exc
        # The record after the restart merged into the restored session.
        assert streams.store("sessions").fetch("a") == [(Windowed("a", t, t + 1200), 3)]
        # Past every session's end + gap, on each key's partition.
        for key in ("a", "b"):
            await cluster.produce(source, [(key, "late-enough")], STR, STR, partitions=2, timestamp=t + 9000)

        async def closed() -> bool:
            return await emitted() == [(f"a@{t}-{t + 1200}", 3), (f"b@{t + 100}-{t + 100}", 1)]
        await eventually_async(closed, timeout=30, what="the closed sessions, once each")
        # The merged session ended more than the store's retention (two gaps) before the newest one:
        # reads leave it out, as Kafka Streams' session stores do.
        assert streams.store("sessions").fetch("a") == [(Windowed("a", t + 9000, t + 9000), 1)]
