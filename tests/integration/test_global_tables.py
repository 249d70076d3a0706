"""Global tables end to end, on the memory broker and on real Kafka (same scenario).

Every order produced before the start joins its product (an inner join drops an order
whose product is missing), which holds only if the global table holds its whole topic
before any stream thread processes; updates and deletes of products reach running
joins; a restarted client has the whole table again before its first rebalance ends.
"""

from __future__ import annotations

from typing import Any

import pytest

from streamloop import BaseProcessor, Record, StreamsBuilder
from streamloop.serdes import IntegerSerde, StringSerde
from streamloop.testing import eventually_async
from tests.support.apps import make_streams
from tests.support.cluster import Cluster

pytestmark = pytest.mark.asyncio

STR, INT = StringSerde(), IntegerSerde()


class SeenRows(BaseProcessor):
    """Notes how many rows the global table has when each record arrives (read through the context,
    as any processor may read a global store)."""

    def __init__(self, seen: list[int]) -> None:
        self.seen = seen

    def init(self, context: Any) -> None:
        super().init(context)
        self.store = context.get_state_store("products")

    def process(self, record: Record) -> None:
        self.seen.append(self.store.approximate_num_entries())
        self.context.forward(record)


def topology(orders: str, products: str, out: str, seen: list[int]) -> Any:
    builder = StreamsBuilder()
    catalog = builder.global_table(products, key_serde=STR, value_serde=STR, materialized="products")
    (builder.stream(orders, key_serde=INT, value_serde=STR)
            .process(lambda: SeenRows(seen))
            .join(catalog, lambda _order, product: product, lambda product, name: f"{product}={name}")
            .to(out, key_serde=INT, value_serde=STR))
    return builder.build()


async def test_orders_join_a_global_table_bootstrapped_before_processing(cluster: Cluster, names,
                                                                         tmp_path) -> None:
    orders, products, out = names("orders"), names("products"), names("out")
    # Partition counts differ: a global table needs no co-partitioning.
    await cluster.create_topics({orders: 2, products: 3, out: 1})
    # Enough rows that stream threads starting before the table is whole would see it partial.
    rows = {f"p{i}": f"name{i}" for i in range(2000)}
    await cluster.produce(products, list(rows.items()), STR, STR, partitions=3)
    await cluster.produce(orders, [(i, f"p{i % 30}") for i in range(40)], INT, STR, partitions=2)

    seen: list[int] = []

    def app() -> Any:
        return make_streams(topology(orders, products, out, seen), cluster.bootstrap, names.app,
                            state_dir=str(tmp_path), num_stream_threads=2, default_dsl_store="in_memory")

    async def joined() -> dict[int, str]:
        return {INT.deserialize(r.key): STR.deserialize(r.value) for r in await cluster.read_all(out)}

    async def joined_all() -> bool:
        return await joined() == want

    want = {i: f"p{i % 30}=name{i % 30}" for i in range(40)}
    async with app() as streams:
        await eventually_async(joined_all, timeout=60, what="every early order joined")
        assert seen[:40] == [2000] * 40
        # Rows change while running: an update, a delete; later orders see them.
        await cluster.produce(products, [("p1", "renamed1"), ("p2", None)], STR, STR, partitions=3)
        rows.update(p1="renamed1")
        del rows["p2"]
        store = streams.store("products")
        await eventually_async(lambda: store.get("p1") == "renamed1" and store.get("p2") is None,
                               timeout=30, what="the global table updated")
        await cluster.produce(orders, [(100, "p1"), (101, "p2"), (102, "p3")], INT, STR, partitions=2)
        want.update({100: "p1=renamed1", 102: "p3=name3"})
        await eventually_async(joined_all, timeout=60, what="later orders joined")
        assert dict(store.all()) == rows
    async with app() as streams:
        # Queryable from the start, and whole: it was read to the topic's end before the threads started.
        assert dict(streams.store("products").all()) == rows

