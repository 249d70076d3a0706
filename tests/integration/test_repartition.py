"""``repartition()`` end to end, on the memory broker and on real Kafka: the records go through
``<application.id>-<name>-repartition``, created with the partitions asked for, and a count after
it sees each new key in one task (Kafka Streams ``KStreamRepartitionIntegrationTest.
shouldCreateRepartitionTopicWithSpecifiedNumberOfPartitions``)."""

from __future__ import annotations

import pytest

from streamloop import Materialized, Repartitioned, StreamsBuilder
from streamloop.serdes import StringSerde
from streamloop.testing import eventually_async
from tests.support.apps import make_streams
from tests.support.cluster import Cluster

pytestmark = pytest.mark.asyncio

STR = StringSerde()


async def test_records_are_counted_by_their_new_key_over_the_partitions_asked_for(cluster: Cluster, names) -> None:
    source = names("words")
    await cluster.create_topics({source: 1})
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=STR, value_serde=STR)
            .select_key(lambda _key, word: word)
            .repartition(Repartitioned.with_(STR, STR).with_name("by-word").with_number_of_partitions(3))
            .group_by_key()
            .count(materialized=Materialized("word-counts", persistent=False)))
    words = ["x", "y", "x", "z", "x", "y"]
    await cluster.produce(source, [(str(i), w) for i, w in enumerate(words)], STR, STR, partitions=1)

    async with make_streams(builder.build(), cluster.bootstrap, names.app, commit_interval_ms=100) as streams:
        store = streams.store("word-counts")
        await eventually_async(lambda: [store.get(w) for w in "xyz"] == [3, 2, 1], timeout=30,
                               what="counts by the new key")
    topic = f"{names.app}-by-word-repartition"
    assert await cluster.partition_counts([topic]) == {topic: 3}
