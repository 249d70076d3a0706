"""Multicast stream partitioners (KIP-837) end to end, on the memory broker and on real Kafka: a
record goes to each partition ``StreamPartitioner.partitions`` names (none for an empty set), each
partition in input order, under at-least-once and exactly-once (the copies commit together)."""

from __future__ import annotations

from collections.abc import Set
from typing import Any

import pytest

from streamloop import BroadcastPartitioner, Produced, Repartitioned, StreamPartitioner, StreamsBuilder
from streamloop.serdes import StringSerde
from tests.support.apps import make_streams
from tests.support.cluster import Cluster, by_partition

pytestmark = pytest.mark.asyncio

STR = StringSerde()


class ByValue(StreamPartitioner):
    """"0,2" -> partitions 0 and 2; "-" -> none (dropped); "" -> the default partitioning."""

    def partitions(self, topic: str, key: Any, value: Any, num_partitions: int) -> Set[int] | None:
        spec = value.split(":")[1]
        if spec == "":
            return None
        return set() if spec == "-" else {int(p) for p in spec.split(",")}


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once_v2"])
async def test_each_record_reaches_every_partition_its_partitioner_names(
        cluster: Cluster, names: Any, guarantee: str) -> None:
    """Matches RecordCollectorTest.shouldSendOnlyToEvenPartitions and shouldDropAllRecords, end to end."""
    if guarantee == "exactly_once_v2" and cluster.bootstrap.startswith("memory://"):
        pytest.skip("the memory broker has no transactions (exactly_once_v2 is refused there)")
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 2, sink: 4})
    builder = StreamsBuilder()
    builder.stream(source, key_serde=STR, value_serde=STR).to(sink, Produced.with_(STR, STR, ByValue()))
    values = [f"{i}:{spec}" for i, spec in enumerate(["0,2", "-", "1,2,3", "3", "0,2", "-", "0,1,2,3"] * 3)]
    # One key: all input in one partition, so the output order per partition is the input order.
    await cluster.produce(source, [("k", v) for v in values], STR, STR, partitions=2)
    copies = sum(0 if v.endswith("-") else len(v.split(":")[1].split(",")) for v in values)

    async with make_streams(builder.build(), cluster.bootstrap, names.app, commit_interval_ms=100,
                            processing_guarantee=guarantee):
        await cluster.read(sink, copies, timeout=60)
    output = await cluster.read_all(sink, read_committed=guarantee == "exactly_once_v2")
    parts = by_partition(output)
    for partition in range(4):
        expected = [v for v in values if not v.endswith("-") and str(partition) in v.split(":")[1].split(",")]
        assert [STR.deserialize(r.value) for r in parts.get(partition, [])] == expected


async def test_repartition_with_a_broadcasting_partitioner_writes_every_partition(
        cluster: Cluster, names: Any) -> None:
    """Matches KStreamRepartitionIntegrationTest.shouldRepartitionToMultiplePartitions."""
    source, sink = names("in"), names("broadcast-out")
    await cluster.create_topics({source: 1, sink: 4})
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=STR, value_serde=STR)
            .repartition(Repartitioned.as_("broadcasting").with_stream_partitioner(BroadcastPartitioner())
                         .with_number_of_partitions(4))
            .to(sink, Produced.stream_partitioner(BroadcastPartitioner())))
    await cluster.produce(source, [("1", "A"), ("2", "B")], STR, STR, partitions=1)

    async with make_streams(builder.build(), cluster.bootstrap, names.app, commit_interval_ms=100):
        # 2 records x 4 repartition partitions, each copy again to the 4 output partitions.
        await cluster.read(sink, 32, timeout=60)
    topic = f"{names.app}-broadcasting-repartition"
    repartitioned = by_partition(await cluster.read_all(topic))
    assert {p: [STR.deserialize(r.value) for r in rs] for p, rs in repartitioned.items()} == {
        p: ["A", "B"] for p in range(4)}
    output = by_partition(await cluster.read_all(sink))
    assert {p: sorted(STR.deserialize(r.value) for r in rs) for p, rs in output.items()} == {
        p: ["A"] * 4 + ["B"] * 4 for p in range(4)}
