"""Cogroup, ``to_table``, ``process_values``, ``transform_values`` and ``print`` end to end, on the
memory broker and on real Kafka (same scenarios).

Three streams cogrouped into one table (one of them re-keyed, so through a repartition topic),
its store in memory so that after a restart with a fresh state directory it comes back from its
one changelog only; two streams in one session per key, merged across them and across a restart;
a stream whose values a FixedKeyProcessor rewrites, made a table and
transformed, printed to a file; and the co-partitioning check of a cogroup's inputs at start-up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamloop import FixedKeyRecord, Materialized, Printed, SessionWindows, Stores, StreamsBuilder, Windowed
from streamloop.errors import TopologyError
from streamloop.serdes import JsonSerde, LongSerde, StringSerde
from streamloop.testing import eventually_async
from tests.support.apps import make_streams
from tests.support.cluster import Cluster
from tests.support.event_time import recent_ms

pytestmark = pytest.mark.asyncio

STR, LONG, JSON = StringSerde(), LongSerde(), JsonSerde()
DEADLINE = 60


def add(slot: str) -> Any:
    def aggregate(_key: str, value: int, totals: dict[str, int]) -> dict[str, int]:
        return {**totals, slot: totals[slot] + value}
    return aggregate


def cogroup_topology(clicks: str, buys: str, refunds: str, out: str) -> Any:
    builder = StreamsBuilder()
    by_user = builder.stream(clicks, key_serde=STR, value_serde=LONG).group_by_key()
    bought = builder.stream(buys, key_serde=STR, value_serde=LONG).group_by_key()
    # Refunds are keyed by order id with the user in the value: re-keyed, so repartitioned.
    refunded = (builder.stream(refunds, key_serde=STR, value_serde=JSON)
                .map(lambda _order, v: (v["user"], v["amount"])).group_by_key(key_serde=STR, value_serde=LONG))
    totals = (by_user.cogroup(add("clicks")).cogroup(bought, add("bought")).cogroup(refunded, add("refunded"))
              .aggregate(lambda: {"clicks": 0, "bought": 0, "refunded": 0},
                         materialized=Materialized("totals", value_serde=JSON, persistent=False)))
    totals.to_stream().to(out, key_serde=STR, value_serde=JSON)
    return builder.build()


async def test_cogrouped_totals_survive_a_restart_from_their_one_changelog(cluster: Cluster, names,
                                                                          tmp_path: Path) -> None:
    clicks, buys, refunds, out = names("clicks"), names("buys"), names("refunds"), names("totals")
    await cluster.create_topics({clicks: 2, buys: 2, refunds: 2, out: 2})
    await cluster.produce(clicks, [("ann", 1), ("bob", 1), ("ann", 1)], STR, LONG, partitions=2)
    await cluster.produce(buys, [("ann", 30), ("bob", 5)], STR, LONG, partitions=2)
    await cluster.produce(refunds, [("o-1", {"user": "ann", "amount": 10})], STR, JSON, partitions=2)

    def app():  # type: ignore[no-untyped-def]
        return make_streams(cogroup_topology(clicks, buys, refunds, out), cluster.bootstrap, names.app,
                            state_dir=str(tmp_path / "state"), commit_interval_ms=100)

    first = {"ann": {"clicks": 2, "bought": 30, "refunded": 10}, "bob": {"clicks": 1, "bought": 5, "refunded": 0}}
    async with app() as streams:
        await eventually_async(lambda: dict(streams.store("totals").all()) == first, timeout=DEADLINE,
                               what="the totals of the first records")

        async def written() -> bool:
            latest = {STR.deserialize(r.key): JSON.deserialize(r.value) for r in await cluster.read_all(out)}
            return latest == first
        await eventually_async(written, timeout=DEADLINE, what="the totals written to the output")
    changelog = f"{names.app}-totals-changelog"
    assert await cluster.partition_counts([changelog]) == {changelog: 2}
    # A fresh state directory: the totals can only come back from the one changelog.
    (tmp_path / "state").rename(tmp_path / "old-state")
    async with app() as streams:
        await cluster.produce(refunds, [("o-2", {"user": "bob", "amount": 5})], STR, JSON, partitions=2)
        await cluster.produce(clicks, [("ann", 1)], STR, LONG, partitions=2)
        after = {"ann": {"clicks": 3, "bought": 30, "refunded": 10}, "bob": {"clicks": 1, "bought": 5, "refunded": 5}}
        await eventually_async(lambda: dict(streams.store("totals").all()) == after, timeout=DEADLINE,
                               what="the restored totals with the later records")


async def test_session_windowed_cogroup_merges_across_inputs_and_a_restart(cluster: Cluster, names,
                                                                         tmp_path: Path) -> None:
    """Views and likes of a page in one session per page: a record of either input joins the
    session; after a restart with a fresh state directory the session comes back from the one
    changelog and a later record of the other input still merges into it."""
    views, likes = names("views"), names("likes")
    await cluster.create_topics({views: 2, likes: 2})
    t = recent_ms()  # the session changelog must outlive the broker's time-based retention

    def topology() -> Any:
        builder = StreamsBuilder()
        seen = builder.stream(views, key_serde=STR, value_serde=LONG).group_by_key()
        liked = builder.stream(likes, key_serde=STR, value_serde=LONG).group_by_key()
        (seen.cogroup(add("views")).cogroup(liked, add("likes"))
             .windowed_by(SessionWindows.of_inactivity_gap_with_no_grace(1000))
             .aggregate(lambda: {"views": 0, "likes": 0},
                        lambda _k, a, b: {"views": a["views"] + b["views"], "likes": a["likes"] + b["likes"]},
                        materialized=Materialized("activity", value_serde=JSON, persistent=False)))
        return builder.build()

    def app():  # type: ignore[no-untyped-def]
        return make_streams(topology(), cluster.bootstrap, names.app, state_dir=str(tmp_path / "state"),
                            commit_interval_ms=100)

    await cluster.produce(views, [("home", 1)], STR, LONG, partitions=2, timestamp=t)
    await cluster.produce(likes, [("home", 1)], STR, LONG, partitions=2, timestamp=t + 400)
    async with app() as streams:
        await eventually_async(
            lambda: streams.store("activity").fetch("home") == [(Windowed("home", t, t + 400),
                                                                 {"views": 1, "likes": 1})],
            timeout=DEADLINE, what="one session from both inputs")
    (tmp_path / "state").rename(tmp_path / "old-state")
    async with app() as streams:
        await cluster.produce(views, [("home", 2)], STR, LONG, partitions=2, timestamp=t + 900)
        await eventually_async(
            lambda: streams.store("activity").fetch("home") == [(Windowed("home", t, t + 900),
                                                                 {"views": 3, "likes": 1})],
            timeout=DEADLINE, what="the restored session merged with a later view")


class Tagging:
    """Counts each key's records in the store "seen" and tags the value with the count."""

    def init(self, context: Any) -> None:
        self.context = context
        self.seen = context.get_state_store("seen")

    def process(self, record: FixedKeyRecord) -> None:
        count = (self.seen.get(record.key) or 0) + 1
        self.seen.put(record.key, count)
        self.context.forward(record.with_value(f"{record.value}#{count}"))

    def close(self) -> None:
        pass


class Shouting:
    def init(self, context: Any) -> None:
        pass

    def transform(self, key: str, value: str | None) -> str | None:
        return None if value is None else f"{key}:{value.upper()}"

    def close(self) -> None:
        pass


async def test_fixed_key_values_made_a_table_transformed_and_printed(cluster: Cluster, names, tmp_path: Path) -> None:
    source, out = names("events"), names("shown")
    await cluster.create_topics({source: 2, out: 2})
    printed = tmp_path / "printed.txt"
    builder = StreamsBuilder()
    builder.add_state_store(Stores.key_value_store_builder(Stores.in_memory_key_value_store("seen"), STR, LONG))
    tagged = builder.stream(source, key_serde=STR, value_serde=STR).process_values(Tagging, stores=["seen"])
    tagged.print(Printed.to_file(printed).with_label("tagged"))
    shown = tagged.to_table(materialized=Materialized("latest", value_serde=STR)) \
        .transform_values(Shouting, materialized=Materialized("shown", value_serde=STR))
    shown.to_stream().to(out, key_serde=STR, value_serde=STR)
    await cluster.produce(source, [("a", "x"), ("b", "y"), ("a", "z")], STR, STR, partitions=2)
    streams = make_streams(builder.build(), cluster.bootstrap, names.app, state_dir=str(tmp_path / "state"))
    async with streams:
        await eventually_async(lambda: dict(streams.store("shown").all()) == {"a": "a:Z#2", "b": "b:Y#1"},
                               timeout=DEADLINE, what="the transformed table")
        assert dict(streams.store("latest").all()) == {"a": "z#2", "b": "y#1"}

        async def written() -> bool:
            # The latest update per key (the record cache may coalesce a key's updates).
            latest = {STR.deserialize(r.key): STR.deserialize(r.value) for r in await cluster.read_all(out)}
            return latest == {"a": "a:Z#2", "b": "b:Y#1"}
        await eventually_async(written, timeout=DEADLINE, what="the table's updates in the output")
    lines = printed.read_text(encoding="utf-8").splitlines()
    assert sorted(lines) == ["[tagged]: a, x#1", "[tagged]: a, z#2", "[tagged]: b, y#1"]
    assert lines.index("[tagged]: a, x#1") < lines.index("[tagged]: a, z#2")  # a key's records in order


async def test_a_cogroup_of_topics_with_different_partition_counts_is_refused_at_start(cluster: Cluster, names,
                                                                                       tmp_path: Path) -> None:
    one, two = names("one"), names("two")
    await cluster.create_topics({one: 2, two: 3})
    builder = StreamsBuilder()
    first = builder.stream(one, key_serde=STR, value_serde=LONG).group_by_key()
    second = builder.stream(two, key_serde=STR, value_serde=LONG).group_by_key()
    first.cogroup(lambda _k, v, a: a + v).cogroup(second, lambda _k, v, a: a - v).aggregate(lambda: 0)
    streams = make_streams(builder.build(), cluster.bootstrap, names.app, state_dir=str(tmp_path))
    with pytest.raises(TopologyError, match=rf"cogroup\(\) needs co-partitioned inputs.*'{one}' \(2\), '{two}' \(3\)"):
        await streams.start_async()
