"""Table operations end to end, on the memory broker and on real Kafka (same scenarios).

A left join of two tables, filtered, regrouped and counted, with updates and deletes of
both sides, across a restart that restores the stores from their changelogs; and the
co-partitioning check of a join's input topics at start-up.
"""

from __future__ import annotations

from typing import Any

import pytest

from streamloop import StreamsBuilder
from streamloop.errors import TopologyError
from streamloop.serdes import JsonSerde, LongSerde, StringSerde
from streamloop.state import Materialized
from streamloop.testing import eventually_async
from tests.support.apps import make_streams
from tests.support.cluster import Cluster

pytestmark = pytest.mark.asyncio

STR, LONG, JSON = StringSerde(), LongSerde(), JsonSerde()


def topology(users: str, regions: str, joined: str, counts: str) -> Any:
    builder = StreamsBuilder()
    names = builder.table(users, key_serde=STR, value_serde=STR)
    where = builder.table(regions, key_serde=STR, value_serde=STR, materialized="regions")
    profiles = names.left_join(where, lambda name, region: {"name": name, "region": region},
                               materialized=Materialized("profiles", value_serde=JSON))
    profiles.to_stream().to(joined, value_serde=JSON)
    (profiles.filter(lambda _k, v: v["region"] is not None)
             .group_by(lambda _k, v: (v["region"], v["name"]), key_serde=STR, value_serde=STR)
             .count(materialized="per-region")
             .to_stream().to(counts, key_serde=STR, value_serde=LONG))
    return builder.build()


async def latest(cluster: Cluster, topic: str, serde: Any) -> dict[str, Any]:
    """The last value per key on ``topic`` (None for a key whose last record is a delete)."""
    return {STR.deserialize(r.key): serde.deserialize(r.value) for r in await cluster.read_all(topic)}


def model(users: dict[str, str | None], regions: dict[str, str | None]) -> tuple[dict[str, Any], dict[str, int]]:
    """What the join and the counts end at for the final rows of both tables."""
    joined = {u: {"name": n, "region": regions.get(u)} for u, n in users.items() if n is not None}
    counts: dict[str, int] = {}
    for row in joined.values():
        if row["region"] is not None:
            counts[row["region"]] = counts.get(row["region"], 0) + 1
    return joined, counts


async def test_left_join_filter_and_regrouped_count_across_a_restart(cluster: Cluster, names, tmp_path) -> None:
    users, regions, joined, counts = names("users"), names("regions"), names("profiles"), names("counts")
    await cluster.create_topics({users: 2, regions: 2, joined: 2, counts: 2})
    first_users = [(f"u{i}", f"name{i}") for i in range(8)]
    first_regions = [(f"u{i}", ["eu", "us"][i % 2]) for i in range(0, 8, 2)] + [("u3", "eu")]
    await cluster.produce(users, first_users, STR, STR, partitions=2)
    await cluster.produce(regions, first_regions, STR, STR, partitions=2)
    user_rows: dict[str, str | None] = dict(first_users)
    region_rows: dict[str, str | None] = dict(first_regions)

    async def converged(what: str) -> None:
        want_joined, want_counts = model(user_rows, region_rows)

        async def matches() -> bool:
            got_joined = {k: v for k, v in (await latest(cluster, joined, JSON)).items() if v is not None}
            got_counts = {k: v for k, v in (await latest(cluster, counts, LONG)).items() if v}
            return got_joined == want_joined and got_counts == want_counts
        await eventually_async(matches, timeout=60, what=what)

    def app() -> Any:
        return make_streams(topology(users, regions, joined, counts), cluster.bootstrap, names.app,
                            state_dir=str(tmp_path), cache_max_bytes_buffering=0)

    async with app():
        await converged("the first rows joined and counted")
    # Moves between regions, deletes on both sides, a region for a user that has none yet: the
    # restarted client subtracts from counts restored from the changelogs.
    later_users: list[tuple[str, str | None]] = [("u1", None), ("u6", "renamed6"), ("u8", "name8")]
    later_regions: list[tuple[str, str | None]] = [("u0", "us"), ("u2", None), ("u8", "eu"), ("u5", "us")]
    await cluster.produce(users, later_users, STR, STR, partitions=2)
    await cluster.produce(regions, later_regions, STR, STR, partitions=2)
    user_rows.update(later_users)
    region_rows.update(later_regions)
    async with app() as streams:
        await converged("the later updates and deletes after a restart")
        assert dict(streams.store("per-region").all()) == {**{r: 0 for r in ("eu", "us")},
                                                            **model(user_rows, region_rows)[1]}


async def test_a_join_of_topics_with_different_partition_counts_is_refused_at_start(cluster: Cluster, names,
                                                                                    tmp_path) -> None:
    left, right, out = names("left"), names("right"), names("out")
    await cluster.create_topics({left: 2, right: 3, out: 1})
    builder = StreamsBuilder()
    builder.table(left).join(builder.table(right), lambda a, b: a).to_stream().to(out)
    streams = make_streams(builder.build(), cluster.bootstrap, names.app, state_dir=str(tmp_path))
    with pytest.raises(TopologyError, match=rf"join\(\) needs co-partitioned inputs.*'{left}' \(2\), '{right}' \(3\)"):
        await streams.start_async()
