"""Stream time survives a restart: it comes back from the partition time in the commit metadata.

Kafka Streams commits each partition's time with its offset (``StreamTask.encodeTimestamp``) and
a task initialised from the commit starts from it (``StreamTask.initializeTaskTime``; unit-level
counterpart: ``StreamTaskTest.shouldReadCommittedStreamTimeOnInitialize``). On the memory broker
and on real Kafka, at-least-once and (Kafka only: the memory broker has no transactions)
exactly-once, whose offsets go through the transaction.
"""

from __future__ import annotations

import pytest

from streamloop import Materialized, StreamsBuilder, TimeWindows
from streamloop.completed_offsets import decode_metadata
from streamloop.records import TopicPartition
from streamloop.serdes import JsonSerde, StringSerde
from streamloop.testing import eventually_async
from streamloop.timestamps import ConsumedRecord
from tests.support.apps import make_streams
from tests.support.cluster import Cluster, committed_position
from tests.support.event_time import recent_ms

pytestmark = pytest.mark.asyncio

STR, JSON = StringSerde(), JsonSerde()


class EventTime:
    """The value's ``at`` field (ms)."""

    def extract(self, record: ConsumedRecord, partition_time: int) -> int:
        return int(record.value["at"])


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once_v2"])
async def test_a_window_closed_before_a_restart_stays_closed_after_it(
        cluster: Cluster, names, tmp_path, guarantee: str) -> None:
    """A windowed count with no grace reaches stream time t + 61000, so the window [t, t + 60000) is
    closed; the application closes cleanly and a new instance (same application.id, a fresh
    state directory: its store comes back from the changelog) gets a record at t + 2000. Only the
    restored stream time tells it that the window is closed: the record is late, not counted.
    (t is on the hour, near the broker's clock: older records would be deleted from the
    changelog by its time-based retention, see ``tests.support.event_time``.)"""
    if guarantee == "exactly_once_v2" and cluster.bootstrap.startswith("memory://"):
        pytest.skip("the memory broker has no transactions")
    source = names("readings")
    await cluster.create_topics({source: 1})
    builder = StreamsBuilder()
    builder.stream(source, key_serde=STR, value_serde=JSON).group_by_key().windowed_by(
        TimeWindows.of_size_with_no_grace(60_000)).count(materialized=Materialized("per-minute", persistent=False))
    topology = builder.build()
    settings = {"default_timestamp_extractor": EventTime(), "commit_interval_ms": 100,
                "processing_guarantee": guarantee}
    t = recent_ms()

    def counts(streams: object) -> dict[int, int]:
        """Window start - t: count."""
        found = streams.store("per-minute").fetch_range("s", t, t + 120_000)  # type: ignore[attr-defined]
        return {start - t: n for start, n in found}

    await cluster.produce(source, [("s", {"at": t + 1_000}), ("s", {"at": t + 61_000})], STR, JSON, partitions=1)
    async with make_streams(topology, cluster.bootstrap, names.app, state_dir=str(tmp_path / "first"),
                            **settings) as first:
        await eventually_async(lambda: counts(first) == {0: 1, 60_000: 1}, timeout=30, what="the first counts")
    committed = await committed_position(cluster, names.app, TopicPartition(source, 0))
    assert committed is not None and committed[0] == 2
    assert decode_metadata(committed[0], committed[1]).partition_time == t + 61_000

    await cluster.produce(source, [("s", {"at": t + 2_000}), ("s", {"at": t + 62_000})], STR, JSON, partitions=1)
    async with make_streams(topology, cluster.bootstrap, names.app, state_dir=str(tmp_path / "second"),
                            **settings) as second:
        # 62000 comes after 2000 in the partition: once it is counted, 2000 was dealt with.
        await eventually_async(lambda: counts(second).get(60_000) == 2, timeout=30, what="the record at 62000")
        # Without the restored stream time, 2000 would open [0, 60000) again: {0: 2}.
        assert counts(second) == {0: 1, 60_000: 2}
