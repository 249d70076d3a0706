"""Event time from the payload, and timestamped stores, end to end, on the memory broker and on
real Kafka.

First scenario: ``default.timestamp.extractor`` reads each record's event time from its JSON
value; the records written downstream carry that time (not the log's), and a windowed count groups
by it (the log timestamps all fall in one window, the event times in two, and stream time follows
the event times, so a record late by event time is not counted).

Second: a timestamped store's values and timestamps come back from its changelog alone.
"""

from __future__ import annotations

from typing import Any

import pytest

from streamloop import BaseProcessor, Materialized, Record, StreamsBuilder, TimeWindows, ValueAndTimestamp
from streamloop.serdes import JsonSerde, StringSerde
from streamloop.state import Stores
from streamloop.testing import eventually_async
from streamloop.timestamps import ConsumedRecord
from tests.support.apps import make_streams
from tests.support.cluster import Cluster

pytestmark = pytest.mark.asyncio

STR, JSON = StringSerde(), JsonSerde()


class EventTime:
    """The value's ``at`` field (ms)."""

    def extract(self, record: ConsumedRecord, partition_time: int) -> int:
        return int(record.value["at"])


async def test_records_are_stamped_and_windowed_by_the_extracted_event_time(cluster: Cluster, names) -> None:
    source, sink = names("readings"), names("stamped")
    await cluster.create_topics({source: 1, sink: 1})
    builder = StreamsBuilder()
    readings = builder.stream(source, key_serde=STR, value_serde=JSON)
    readings.to(sink, key_serde=STR, value_serde=JSON)
    readings.group_by_key().windowed_by(TimeWindows.of_size_with_no_grace(60_000)).count(
        materialized=Materialized("per-minute", persistent=False))
    events = [("s", {"at": 1_000}), ("s", {"at": 61_000}), ("s", {"at": 2_000})]
    await cluster.produce(source, events, STR, JSON, partitions=1)  # log time: now

    async with make_streams(builder.build(), cluster.bootstrap, names.app,
                            default_timestamp_extractor=EventTime(), commit_interval_ms=100) as streams:
        # The record at 2000 comes after stream time (by event time) reached 61000: its window
        # [0, 60000) has closed (no grace), so it is late and not counted; it is still written on.
        await eventually_async(lambda: dict(streams.store("per-minute").fetch_range("s", 0, 120_000)) == {
            0: 1, 60_000: 1}, timeout=30, what="the per-minute counts by event time")

    stamped = [(r.timestamp, JSON.deserialize(r.value)["at"]) for r in await cluster.read_all(sink)]
    assert stamped == [(1_000, 1_000), (61_000, 61_000), (2_000, 2_000)]


class KeepStamped(BaseProcessor):
    """Puts each record into a timestamped store (stamped with the record's timestamp)."""

    def init(self, context: Any) -> None:
        super().init(context)
        self.store = context.get_state_store("stamped")

    def process(self, record: Record) -> None:
        self.store.put(record.key, record.value)


async def test_a_timestamped_store_comes_back_from_its_changelog_with_the_timestamps(
        cluster: Cluster, names, tmp_path) -> None:
    source = names("stamps")
    await cluster.create_topics({source: 1})
    builder = StreamsBuilder()
    builder.add_state_store(Stores.timestamped_key_value_store_builder(
        Stores.persistent_timestamped_key_value_store("stamped"), STR, STR))
    builder.stream(source, key_serde=STR, value_serde=STR).process(KeepStamped, stores=["stamped"])
    topology = builder.build()
    await cluster.produce(source, [("a", "first")], STR, STR, partitions=1, timestamp=1_000)
    await cluster.produce(source, [("a", "second")], STR, STR, partitions=1, timestamp=5_000)

    def app():  # type: ignore[no-untyped-def]
        return make_streams(topology, cluster.bootstrap, names.app, state_dir=str(tmp_path / "state"),
                            commit_interval_ms=100)

    async with app() as streams:
        await eventually_async(lambda: streams.store("stamped").get("a") == ValueAndTimestamp("second", 5_000),
                               timeout=30, what="the stamped value")
    # A fresh state directory: the store can only come back from its changelog.
    tmp_path.joinpath("state").rename(tmp_path / "old-state")
    async with app() as streams:
        await eventually_async(lambda: streams.store("stamped").get("a") == ValueAndTimestamp("second", 5_000),
                               timeout=30, what="the restored value and timestamp")


class VersionedPrices(BaseProcessor):
    """``key: price`` puts a version at the record's timestamp; ``key: ?<t>`` forwards the price as of t."""

    def init(self, context: Any) -> None:
        super().init(context)
        self.prices = context.get_state_store("prices")

    def process(self, record: Record) -> None:
        if record.value.startswith("?"):
            found = self.prices.get(record.key, int(record.value[1:]))
            self.context.forward(record.with_value(None if found is None else f"{found.value}@{found.timestamp}"))
        else:
            self.prices.put(record.key, record.value, record.timestamp)


async def test_a_versioned_store_comes_back_from_its_changelog_with_its_history(
        cluster: Cluster, names, tmp_path) -> None:
    source, sink = names("prices"), names("answers")
    await cluster.create_topics({source: 1, sink: 1})
    builder = StreamsBuilder()
    builder.add_state_store(Stores.versioned_key_value_store_builder(
        Stores.persistent_versioned_key_value_store("prices", 60_000), STR, STR))
    builder.stream(source, key_serde=STR, value_serde=STR).process(VersionedPrices, stores=["prices"]).to(
        sink, key_serde=STR, value_serde=STR)
    topology = builder.build()
    for price, at in [("3", 1_000), ("5", 9_000), ("4", 5_000)]:
        await cluster.produce(source, [("apple", price)], STR, STR, partitions=1, timestamp=at)

    def app():  # type: ignore[no-untyped-def]
        return make_streams(topology, cluster.bootstrap, names.app, state_dir=str(tmp_path / "state"),
                            commit_interval_ms=100)

    async def answers(count: int) -> list[str | None]:
        records = await cluster.read(sink, count, timeout=30)
        return [STR.deserialize(r.value) for r in records]

    async with app():
        await cluster.produce(source, [("apple", "?6000")], STR, STR, partitions=1, timestamp=9_000)
        assert await answers(1) == ["4@5000"]
    # A fresh state directory: the history can only come back from the changelog.
    tmp_path.joinpath("state").rename(tmp_path / "old-state")
    async with app():
        await cluster.produce(source, [("apple", "?2000"), ("apple", "?500")], STR, STR, partitions=1,
                              timestamp=9_000)
        assert await answers(3) == ["4@5000", "3@1000", None]
