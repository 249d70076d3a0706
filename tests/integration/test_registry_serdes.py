"""Schema Registry serdes end to end, on the memory broker and on real Kafka.

Orders in Avro are totalled per customer in a store whose values are Avro too (its changelog
holds Confluent-framed records) and written out in Avro; the registry is the HTTP one of the
test suite, so the stream threads use the client's HTTP path. The application then restarts
with its local state gone: the totals come back from the changelog through the Avro serde.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from streamloop import StreamsBuilder
from streamloop.schema_registry import AvroSerde, SchemaRegistryClient
from streamloop.schema_registry.wire import unframe
from streamloop.serdes import StringSerde
from streamloop.state import Materialized
from streamloop.testing import eventually_async
from tests.support.apps import make_streams
from tests.support.cluster import Cluster
from tests.support.schema_registry import HttpSchemaRegistry

pytestmark = pytest.mark.asyncio

STR = StringSerde()
ORDER = {"type": "record", "name": "Order", "namespace": "shop",
         "fields": [{"name": "customer", "type": "string"}, {"name": "cents", "type": "long"}]}
TOTAL = {"type": "record", "name": "Total", "namespace": "shop",
         "fields": [{"name": "orders", "type": "long"}, {"name": "cents", "type": "long"}]}


@pytest.fixture(scope="module")
def registry() -> Iterator[HttpSchemaRegistry]:
    with HttpSchemaRegistry() as served:
        yield served


def totals(client: SchemaRegistryClient, source: str, sink: str, app: str) -> StreamsBuilder:
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=STR, value_serde=AvroSerde(client, ORDER, topic=source))
            .group_by_key()
            .aggregate(lambda: {"orders": 0, "cents": 0},
                       lambda _k, order, total: {"orders": total["orders"] + 1,
                                                 "cents": total["cents"] + order["cents"]},
                       materialized=Materialized("totals", value_serde=AvroSerde(
                           client, TOTAL, topic=f"{app}-totals-changelog")))
            .to_stream()
            .to(sink, key_serde=STR, value_serde=AvroSerde(client, TOTAL, topic=sink)))
    return builder


async def test_avro_through_a_topology_and_its_changelog(cluster: Cluster, names: Any, tmp_path: Any,
                                                         registry: HttpSchemaRegistry) -> None:
    source, sink = names("orders"), names("totals")
    await cluster.create_topics({source: 2, sink: 2})
    client = SchemaRegistryClient(registry.url)
    orders = AvroSerde(client, ORDER, topic=source)
    reader = AvroSerde(client)  # no schema: reads each record in its writer's
    first = [("ann", 250), ("bob", 100), ("ann", 50), ("cid", 7)]
    await cluster.produce(source, [(c, {"customer": c, "cents": n}) for c, n in first], STR, orders, partitions=2)

    async def latest_totals(expected: dict[str, dict[str, int]]) -> None:
        latest: dict[str, Any] = {}

        async def arrived() -> bool:
            latest.clear()
            for record in await cluster.read_all(sink):
                latest[STR.deserialize(record.key)] = reader.deserialize(record.value)
            return latest == expected

        await eventually_async(arrived, timeout=30, what=f"totals {expected}")

    state = tmp_path / "state"
    async with make_streams(totals(client, source, sink, names.app).build(), cluster.bootstrap, names.app,
                            state_dir=str(state)):
        await latest_totals({"ann": {"orders": 2, "cents": 300}, "bob": {"orders": 1, "cents": 100},
                             "cid": {"orders": 1, "cents": 7}})

    changelog = await cluster.read_all(f"{names.app}-totals-changelog")
    assert changelog and {unframe(r.value)[0] for r in changelog} == {client.get_version(
        f"{names.app}-totals-changelog-value").schema_id}

    shutil.rmtree(state)  # the restarted app has only the changelog to restore from
    await cluster.produce(source, [("ann", {"customer": "ann", "cents": 1})], STR, orders, partitions=2)
    async with make_streams(totals(client, source, sink, names.app).build(), cluster.bootstrap, names.app,
                            state_dir=str(state)):
        await latest_totals({"ann": {"orders": 3, "cents": 301}, "bob": {"orders": 1, "cents": 100},
                             "cid": {"orders": 1, "cents": 7}})
