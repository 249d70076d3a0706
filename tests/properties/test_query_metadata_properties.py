"""For drawn keys, serdes, partition counts and spreads of partitions over instances, a key's query
metadata names the partition the producers write the key to (the engine's record collector and
aiokafka's default partitioner, Kafka's murmur2) and the instance that owns that partition.

The lookup follows Kafka Streams' ``StreamsMetadataState.keyQueryMetadataForKey``: the partition count
is that of the store's source topic with the most partitions, and the key is found on the host that
owns that partition of any of the store's source topics (``shouldGetInstanceWithKeyWithMergedStreams``).
"""

from __future__ import annotations

from typing import Any

from aiokafka.partitioner import DefaultPartitioner
from hypothesis import given, settings
from hypothesis import strategies as st

from streamloop.collector import RecordCollector
from streamloop.records import TopicPartition
from streamloop.serdes import IntegerSerde, JsonSerde, LongSerde, Serde, StringSerde
from streamloop.state.metadata import HostInfo, KeyQueryMetadata, StreamsMetadataState

SERDES_AND_KEYS: list[tuple[Serde, st.SearchStrategy[Any]]] = [
    (StringSerde(), st.text(min_size=0, max_size=30)),
    (IntegerSerde(), st.integers(-(2**31), 2**31 - 1)),
    (LongSerde(), st.integers(-(2**63), 2**63 - 1)),
    # JSON numbers as orjson writes them: 64-bit integers.
    (JsonSerde(), st.dictionaries(st.text(max_size=5), st.integers(-(2**63), 2**63 - 1), max_size=3)),
]


async def _no_lookup(_topic: str) -> int | None:
    raise AssertionError("the collector knows every partition count here")


@st.composite
def cluster_views(draw: st.DrawFn) -> tuple[dict[HostInfo, set[TopicPartition]], dict[str, int]]:
    """A store read from one or two co-partitioned topics, their partitions spread over 1-4 instances."""
    partitions = draw(st.integers(1, 64))
    topics = draw(st.sampled_from([("in",), ("left", "right")]))
    hosts = [HostInfo(f"instance-{i}", 8000 + i) for i in range(draw(st.integers(1, 4)))]
    by_host: dict[HostInfo, set[TopicPartition]] = {h: set() for h in hosts}
    for p in range(partitions):
        owner = draw(st.sampled_from(hosts))
        by_host[owner].update(TopicPartition(t, p) for t in topics)
    return by_host, dict.fromkeys(topics, partitions)


@settings(max_examples=200)
@given(st.data(), cluster_views())
def test_a_keys_metadata_names_the_producers_partition_and_its_owner(
    data: st.DataObject, view: tuple[dict[HostInfo, set[TopicPartition]], dict[str, int]]
) -> None:
    by_host, counts = view
    serde, keys = data.draw(st.sampled_from(SERDES_AND_KEYS))
    key = data.draw(keys)
    state = StreamsMetadataState(data.draw(st.sampled_from([*by_host, None])), {"store": tuple(counts)})
    state.on_change(by_host, {})

    metadata = state.key_query_metadata_for_key("store", key, serde)

    key_bytes = serde.serialize(key)
    assert key_bytes is not None
    collector = RecordCollector(producer=None, partition_counts=counts, lookup=_no_lookup)  # type: ignore[arg-type]
    for topic, count in counts.items():
        assert metadata is not None and metadata is not KeyQueryMetadata.NOT_AVAILABLE
        assert metadata.partition == collector.default_partition(topic, key_bytes, count)
        assert metadata.partition == DefaultPartitioner()(key_bytes, list(range(count)), list(range(count)))
        (owner,) = [h for h, tps in by_host.items() if TopicPartition(topic, metadata.partition) in tps]
        assert metadata.active_host == owner
    assert metadata.standby_hosts == frozenset()
