"""Time to live for key-value stores end to end, on the memory broker and on real Kafka.

A DSL count whose rows expire by record time: a row not updated for the TTL leaves the store when
stream time passes it, its delete goes to the changelog as a tombstone and downstream as a
table delete, and a client restarted with a fresh state directory (its store restored from the
changelog alone) has only the live rows and counts an expired key from 1 again. A Processor API
store whose entries expire by wall clock does the same without any record moving time.
"""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from streamloop import Materialized, StreamsBuilder
from streamloop.processors.api import BaseProcessor
from streamloop.records import Record
from streamloop.serdes import LongSerde, StringSerde
from streamloop.state import Stores
from streamloop.testing import eventually_async
from tests.support.apps import make_streams
from tests.support.cluster import Cluster
from tests.support.event_time import recent_ms

pytestmark = pytest.mark.asyncio

STR, LONG = StringSerde(), LongSerde()


def counting(source: str, sink: str) -> Any:
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=STR, value_serde=STR).group_by_key()
        .count(materialized=Materialized("counts", persistent=False).with_ttl(1_000, sweep_interval=100))
        .to_stream().to(sink, key_serde=STR, value_serde=LONG))
    return builder.build()


async def last_values(cluster: Cluster, topic: str, stamped: bool = False) -> dict[str, Any]:
    """Each key's last count on ``topic`` (None: a tombstone); ``stamped``: a changelog's values,
    with the 8 bytes of their stamp in front."""
    return {STR.deserialize(r.key): None if r.value is None else LONG.deserialize(r.value[8:] if stamped else r.value)
            for r in await cluster.read_all(topic)}


async def test_expired_counts_leave_the_store_changelog_and_table_and_stay_gone_after_a_restore(
        cluster: Cluster, names, tmp_path) -> None:
    source, sink = names("visits"), names("visit-counts")
    changelog = f"{names.app}-counts-changelog"
    await cluster.create_topics({source: 1, sink: 1})
    t = recent_ms()
    for key, at in [("a", t), ("a", t + 100), ("b", t + 200)]:
        await cluster.produce(source, [(key, "visit")], STR, STR, partitions=1, timestamp=at)

    def app() -> Any:
        return make_streams(counting(source, sink), cluster.bootstrap, names.app,
                            state_dir=str(tmp_path / "state"), commit_interval_ms=100)

    async with app() as streams:
        await eventually_async(lambda: dict(streams.store("counts").all()) == {"a": 2, "b": 1},
                               timeout=30, what="the counts of a and b")
        # Stream time 1.2 s past b's last update (a's and b's rows expire), c's row is new.
        await cluster.produce(source, [("c", "visit")], STR, STR, partitions=1, timestamp=t + 1_400)
        await eventually_async(lambda: dict(streams.store("counts").all()) == {"c": 1},
                               timeout=30, what="only c's count live")

        async def swept() -> bool:
            return (await last_values(cluster, changelog, stamped=True) == {"a": None, "b": None, "c": 1}
                    and await last_values(cluster, sink) == {"a": None, "b": None, "c": 1})
        await eventually_async(swept, timeout=30, what="tombstones for a and b in the changelog and downstream")
    # A fresh state directory: the store comes back from its changelog alone.
    shutil.rmtree(tmp_path / "state")
    async with app() as streams:
        await eventually_async(lambda: dict(streams.store("counts").all()) == {"c": 1},
                               timeout=30, what="the restored live count of c")
        await cluster.produce(source, [("a", "visit")], STR, STR, partitions=1, timestamp=t + 1_500)
        await eventually_async(lambda: dict(streams.store("counts").all()) == {"a": 1, "c": 1},
                               timeout=30, what="a counted from 1 again")


class Sessions(BaseProcessor):
    """Keeps each key's last value in a store whose entries expire by wall clock."""

    def init(self, context: Any) -> None:
        super().init(context)
        self.store = context.get_state_store("sessions")

    def process(self, record: Record) -> None:
        self.store.put(record.key, record.value)


async def test_wall_clock_expiry_deletes_entries_without_any_record(cluster: Cluster, names, tmp_path) -> None:
    source = names("logins")
    changelog = f"{names.app}-sessions-changelog"
    await cluster.create_topics({source: 2})
    builder = StreamsBuilder()
    builder.add_state_store(Stores.key_value_store_builder(Stores.in_memory_key_value_store("sessions"), STR, STR)
                            .with_ttl(1_500, by="wall_clock", sweep_interval=100))
    builder.stream(source, key_serde=STR, value_serde=STR).process(Sessions, stores=["sessions"])
    await cluster.produce(source, [("ann", "s1"), ("bob", "s2")], STR, STR, partitions=2)
    async with make_streams(builder.build(), cluster.bootstrap, names.app, state_dir=str(tmp_path / "state"),
                            commit_interval_ms=100) as streams:
        await eventually_async(lambda: dict(streams.store("sessions").all()) == {"ann": "s1", "bob": "s2"},
                               timeout=30, what="both sessions stored")

        async def expired() -> bool:
            # The stamp is 8 bytes in front of the value: a tombstone's value is None.
            logged = {STR.deserialize(r.key): r.value for r in await cluster.read_all(changelog)}
            return dict(streams.store("sessions").all()) == {} and logged == {"ann": None, "bob": None}
        await eventually_async(expired, timeout=30, what="both sessions expired and tombstoned")
