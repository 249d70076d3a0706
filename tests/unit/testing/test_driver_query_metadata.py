"""The test driver answers queries across instances as a client would, being the only instance."""

from __future__ import annotations

from typing import Any

from streamloop import BaseProcessor, HostInfo, KeyQueryMetadata, StreamsBuilder, StreamsMetadata
from streamloop.records import Record, TopicPartition
from streamloop.serdes import LongSerde, StringSerde
from streamloop.state import Stores
from streamloop.testing import TopologyTestDriver

STR = StringSerde()


class WherePartition(BaseProcessor):
    """Keeps, per key, the partition of the task that saw it."""

    def init(self, context: Any) -> None:
        super().init(context)
        self.where = context.get_state_store("where")

    def process(self, record: Record) -> None:
        self.where.put(record.key, self.context.partition)


def topology() -> Any:
    builder = StreamsBuilder()
    builder.add_state_store(Stores.key_value_store_builder(Stores.in_memory_key_value_store("where"), STR,
                                                           LongSerde()))
    builder.stream("words", key_serde=STR, value_serde=STR).process(WherePartition, stores=["where"])
    return builder.build()


def test_each_keys_metadata_names_the_partition_of_the_task_that_holds_it() -> None:
    config = {"application.server": "localhost:7001"}
    with TopologyTestDriver(topology(), config, partitions={"words": 5}) as driver:
        words = [f"word-{i}" for i in range(30)]
        driver.create_input_topic("words", STR, STR).pipe_records([(w, "") for w in words])
        store = driver.get_key_value_store("where")
        me = HostInfo("localhost", 7001)
        assert len({store.get(w) for w in words}) == 5  # every task holds some of the keys
        for word in words:
            assert driver.query_metadata_for_key("where", word, STR) == KeyQueryMetadata(
                me, frozenset(), store.get(word))
        assert driver.metadata_for_all_clients() == [StreamsMetadata(
            me, frozenset({"where"}), frozenset(TopicPartition("words", p) for p in range(5)))]
        assert driver.query_metadata_for_key("not-a-store", "k", STR) is None


def test_without_an_endpoint_nothing_is_known_as_for_a_client() -> None:
    with TopologyTestDriver(topology()) as driver:
        assert driver.query_metadata_for_key("where", "k", STR) is KeyQueryMetadata.NOT_AVAILABLE
        assert driver.metadata_for_all_clients() == []
