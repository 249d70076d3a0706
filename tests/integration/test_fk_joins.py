"""Foreign-key table joins end to end, on the memory broker and on real Kafka (same scenarios).

Orders left-joined with their customers by the customer id in the order, the two topics of
different partition counts (a foreign-key join needs no co-partitioning: the subscription and
response topics are partitioned like the customer and the order topic). Orders move to other
customers, to none, are deleted; customers change and are deleted, some of that while the app
is down, so the restarted app answers subscriptions restored from the subscription store's
changelog (in a new state directory, as after a move to another machine).

Orders per region joined with the customers of their region: the foreign key is the region from
the order's key with the customer id from its value (``foreign_key_from_key_and_value=``, Kafka
Streams 4.0's ``BiFunction`` extractor), which a value-only extractor cannot express.
"""

from __future__ import annotations

from typing import Any

import pytest

from streamloop import StreamsBuilder
from streamloop.serdes import JsonSerde, StringSerde
from streamloop.state import Materialized
from streamloop.testing import eventually_async
from tests.support.apps import make_streams
from tests.support.cluster import Cluster

pytestmark = pytest.mark.asyncio

STR, JSON = StringSerde(), JsonSerde()
Rows = dict[str, Any]


def topology(orders: str, customers: str, out: str) -> Any:
    builder = StreamsBuilder()
    order_table = builder.table(orders, key_serde=STR, value_serde=JSON)
    customer_table = builder.table(customers, key_serde=STR, value_serde=STR)
    enriched = order_table.left_join(customer_table, lambda order: order["customer"],
                                     lambda order, name: {"amount": order["amount"], "name": name},
                                     materialized=Materialized("enriched", value_serde=JSON))
    enriched.to_stream().to(out, value_serde=JSON)
    return builder.build()


def model(orders: Rows, customers: Rows) -> Rows:
    return {o: {"amount": v["amount"], "name": customers.get(v["customer"]) if v["customer"] else None}
            for o, v in orders.items() if v is not None}


class OrdersAndCustomers:
    """The two tables' topics, the rows sent to them so far, and waiting for the joined output."""

    def __init__(self, cluster: Cluster, orders: str, customers: str, out: str) -> None:
        self.cluster, self.orders, self.customers, self.out = cluster, orders, customers, out
        self.order_rows: Rows = {}
        self.customer_rows: Rows = {}

    async def send(self, order_updates: list[tuple[str, Any]], customer_updates: list[tuple[str, Any]]) -> None:
        await self.cluster.produce(self.customers, customer_updates, STR, STR, partitions=2)
        await self.cluster.produce(self.orders, order_updates, STR, JSON, partitions=3)
        self.order_rows.update(order_updates)
        self.customer_rows.update(customer_updates)

    async def converged(self, want: Rows, what: str) -> None:
        async def matches() -> bool:
            got = {STR.deserialize(r.key): JSON.deserialize(r.value) for r in await self.cluster.read_all(self.out)}
            return {k: v for k, v in got.items() if v is not None} == want
        await eventually_async(matches, timeout=60, what=what)


async def test_left_join_by_foreign_key_across_a_restart(cluster: Cluster, names, tmp_path) -> None:
    orders, customers, out = names("orders"), names("customers"), names("enriched")
    await cluster.create_topics({orders: 3, customers: 2, out: 2})
    tables = OrdersAndCustomers(cluster, orders, customers, out)
    send = tables.send

    async def converged(what: str) -> None:
        await tables.converged(model(tables.order_rows, tables.customer_rows), what)

    def app(state_dir: str) -> Any:
        return make_streams(topology(orders, customers, out), cluster.bootstrap, names.app,
                            state_dir=str(tmp_path / state_dir), cache_max_bytes_buffering=0)

    await send([(f"o{i}", {"customer": f"c{i % 4}", "amount": i}) for i in range(10)],
               [(f"c{i}", f"name{i}") for i in range(3)])
    async with app("first"):
        await converged("orders joined with their customers (c3 has none yet)")
        await send([("o1", {"customer": "c2", "amount": 1}), ("o2", {"customer": None, "amount": 2}),
                     ("o4", None)], [("c3", "name3"), ("c0", "renamed0")])
        await converged("orders moved, one to no customer, one deleted; a customer added, one renamed")
    # While the app is down: a customer is deleted and another renamed; only the subscriptions
    # restored from their changelog (into a new state directory, as on another machine) can tell
    # which orders they reach.
    await send([("o5", {"customer": "c3", "amount": 55})], [("c1", None), ("c2", "renamed2")])
    async with app("second") as streams:
        await converged("after a restart: the deleted and renamed customers reach their orders")
        assert dict(streams.store("enriched").all()) == model(tables.order_rows, tables.customer_rows)


def regional_customer(order_key: str, order: dict[str, Any]) -> str:
    """"eu/o1" ordering customer "c1" is customer "eu/c1"."""
    return f"{order_key.split('/')[0]}/{order['customer']}"


def regional_topology(orders: str, customers: str, out: str) -> Any:
    builder = StreamsBuilder()
    order_table = builder.table(orders, key_serde=STR, value_serde=JSON)
    customer_table = builder.table(customers, key_serde=STR, value_serde=STR)
    enriched = order_table.join(customer_table, foreign_key_from_key_and_value=regional_customer,
                                joiner=lambda order, name: {"amount": order["amount"], "name": name},
                                materialized=Materialized("regional", value_serde=JSON))
    enriched.to_stream().to(out, value_serde=JSON)
    return builder.build()


async def test_join_by_a_foreign_key_from_the_key_and_the_value(cluster: Cluster, names, tmp_path) -> None:
    orders, customers, out = names("orders"), names("customers"), names("regional")
    await cluster.create_topics({orders: 3, customers: 2, out: 2})
    tables = OrdersAndCustomers(cluster, orders, customers, out)
    send = tables.send

    def model() -> Rows:
        joined = {k: (v, tables.customer_rows.get(regional_customer(k, v)))
                  for k, v in tables.order_rows.items() if v is not None}
        return {k: {"amount": v["amount"], "name": name} for k, (v, name) in joined.items() if name is not None}

    async def converged(what: str) -> None:
        await tables.converged(model(), what)

    await send([(f"{region}/o{i}", {"customer": f"c{i % 3}", "amount": i}) for region in ("eu", "us")
                for i in range(6)],
               [(f"{region}/c{i}", f"{region}-name{i}") for region in ("eu", "us") for i in range(2)])
    async with make_streams(regional_topology(orders, customers, out), cluster.bootstrap, names.app,
                            state_dir=str(tmp_path / "state"), cache_max_bytes_buffering=0) as streams:
        await converged("each order joined with the customer of its own region (c2 has none yet)")
        # eu/o0 and us/o0 both order "c0": the same value, different customers.
        store = streams.store("regional")
        assert (store.get("eu/o0"), store.get("us/o0")) == ({"amount": 0, "name": "eu-name0"},
                                                            {"amount": 0, "name": "us-name0"})
        await send([("eu/o1", {"customer": "c0", "amount": 1}), ("us/o3", None)],
                   [("eu/c0", "eu-renamed0"), ("us/c2", "us-name2"), ("us/c1", None)])
        await converged("an order moved and one deleted; a customer renamed, one added, one deleted")
        assert dict(streams.store("regional").all()) == model()
