"""Stream-stream windowed joins end to end, on the memory broker and on real Kafka.

One left join over two co-partitioned topics, run by a client, stopped, its state directory
wiped, and run again: the join's window stores and its outer store come back from their
changelogs, so a record from before the restart still finds its partner, and one that never
did is emitted with None once its window has closed (KStreamKStreamLeftJoinTest semantics).
"""

from __future__ import annotations

import shutil

import pytest

from streamloop import JoinWindows, KafkaStreams, StreamsBuilder
from streamloop.errors import TopologyError
from streamloop.records import ConsumerRecord
from streamloop.serdes import StringSerde
from tests.support.apps import make_streams
from tests.support.cluster import Cluster
from tests.support.event_time import recent_ms

pytestmark = pytest.mark.asyncio

STR = StringSerde()


def payments_topology(orders: str, payments: str, out: str) -> StreamsBuilder:
    builder = StreamsBuilder()
    left = builder.stream(orders, key_serde=STR, value_serde=STR)
    right = builder.stream(payments, key_serde=STR, value_serde=STR)
    left.left_join(right, lambda order, payment: f"{order}+{payment}",
                   JoinWindows.of_time_difference_with_no_grace(1000)).to(out, key_serde=STR, value_serde=STR)
    return builder


async def test_left_join_survives_a_restart_from_its_changelogs(cluster: Cluster, names, tmp_path) -> None:
    orders, payments, out = names("orders"), names("payments"), names("paid")
    await cluster.create_topics({orders: 2, payments: 2, out: 2})
    t = recent_ms()  # the join's window changelogs must outlive the broker's time-based retention
    await cluster.produce(orders, [("a", "oa"), ("b", "ob"), ("d", "od")], STR, STR, partitions=2, timestamp=t + 1000)
    await cluster.produce(payments, [("a", "pa")], STR, STR, partitions=2, timestamp=t + 1500)

    def app() -> KafkaStreams:
        return make_streams(payments_topology(orders, payments, out).build(), cluster.bootstrap, names.app,
                            state_dir=str(tmp_path), cache_max_bytes_buffering=0)

    def joined(records: list[ConsumerRecord]) -> list[tuple[str, str, int]]:
        """(key, value, timestamp - t), sorted."""
        return sorted((STR.deserialize(r.key), STR.deserialize(r.value), r.timestamp - t) for r in records)

    async with app():
        first = await cluster.read(out, 1)
    assert joined(first) == [("a", "oa+pa", 1500)]
    shutil.rmtree(tmp_path / names.app)  # nothing left locally: the stores come from the changelogs

    await cluster.produce(payments, [("b", "pb")], STR, STR, partitions=2, timestamp=t + 1800)
    await cluster.produce(orders, [("d", "od2")], STR, STR, partitions=2, timestamp=t + 5000)
    async with app():
        records = await cluster.read(out, 3)
    assert joined(records) == [("a", "oa+pa", 1500), ("b", "ob+pb", 1800), ("d", "od+None", 1000)]


async def test_join_of_topics_with_different_partition_counts_is_refused_at_start(cluster: Cluster, names,
                                                                                  tmp_path) -> None:
    orders, payments, out = names("orders"), names("payments"), names("paid")
    await cluster.create_topics({orders: 2, payments: 3, out: 2})
    streams = make_streams(payments_topology(orders, payments, out).build(), cluster.bootstrap, names.app,
                           state_dir=str(tmp_path))
    with pytest.raises(TopologyError, match="same number of partitions"):
        await streams.start_async()
