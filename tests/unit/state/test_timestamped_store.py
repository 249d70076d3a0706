"""Timestamped key-value stores: values kept with their timestamps, through the changelog, and read
back as ``ValueAndTimestamp`` by processors and queries (Kafka Streams' ``TimestampedKeyValueStore``;
cases after ``ValueAndTimestampSerdeTest`` and ``TimestampedKeyValueStoreBuilderTest``)."""

from __future__ import annotations

from typing import Any

import pytest

from streamloop import StreamsBuilder, ValueAndTimestamp
from streamloop.errors import TopologyError
from streamloop.processors.api import BaseProcessor
from streamloop.records import Record
from streamloop.serdes import StringSerde
from streamloop.state import Stores, TimestampedKeyValueStore
from streamloop.state.timestamped import ValueAndTimestampSerde
from streamloop.testing import TopologyTestDriver

STR = StringSerde()


def test_the_serde_puts_the_timestamp_before_the_values_bytes_and_reads_both_back() -> None:
    """``ValueAndTimestampSerdeTest.shouldSerializeNonNullDataUsingTheInternalSerializer``, and a
    None value is a delete (``ValueAndTimestamp.make(null, ts)`` is null)."""
    serde = ValueAndTimestampSerde(STR)
    data = serde.serialize(ValueAndTimestamp("hi", 1_700_000_000_000))
    assert data == (1_700_000_000_000).to_bytes(8, "big") + b"hi"
    assert serde.deserialize(data) == ValueAndTimestamp("hi", 1_700_000_000_000)
    assert serde.serialize(None) is None and serde.deserialize(None) is None
    assert ValueAndTimestamp.make(None, 5) is None
    with pytest.raises(TypeError, match="ValueAndTimestamp"):
        serde.serialize("bare")  # type: ignore[arg-type]


class Latest(BaseProcessor):
    """Keeps each key's value with the largest timestamp (an out-of-order guard); a None value
    deletes the key. Forwards what it keeps."""

    def init(self, context: Any) -> None:
        super().init(context)
        self.store: TimestampedKeyValueStore = context.get_state_store("latest")

    def process(self, record: Record) -> None:
        if record.value is None:
            self.store.delete(record.key)
            return
        held = self.store.get(record.key)
        if held is None or record.timestamp >= held.timestamp:
            self.store.put(record.key, record.value)  # stamped with the record's timestamp
            self.context.forward(record)


def latest_topology(supplier: Any = None) -> Any:
    builder = StreamsBuilder()
    builder.add_state_store(Stores.timestamped_key_value_store_builder(
        supplier or Stores.in_memory_key_value_store("latest"), STR, STR))
    builder.stream("in", key_serde=STR, value_serde=STR).process(Latest, stores=["latest"]).to(
        "out", key_serde=STR, value_serde=STR)
    return builder.build()


def test_a_processor_reads_values_with_timestamps_and_they_come_back_from_the_changelog() -> None:
    with TopologyTestDriver(latest_topology()) as driver:
        source = driver.create_input_topic("in", STR, STR)
        source.pipe_input("k", "new", timestamp=200)
        source.pipe_input("k", "old", timestamp=100)  # out of order: kept out
        source.pipe_input("j", "x", timestamp=50)
        source.pipe_input("j", None, timestamp=60)
        store = driver.get_key_value_store("latest")
        assert store.get("k") == ValueAndTimestamp("new", 200)
        assert list(store.all()) == [("k", ValueAndTimestamp("new", 200))]
        # In memory: after the task is revoked and assigned again, only the changelog has them.
        driver.rebalance(driver.task_ids[0])
        assert store.get("k") == ValueAndTimestamp("new", 200)
        source.pipe_input("k", "older", timestamp=150)  # the restored timestamp still guards
        assert store.get("k") == ValueAndTimestamp("new", 200)
        assert driver.create_output_topic("out", STR, STR).read_values() == ["new", "x"]


def test_the_builder_takes_only_key_value_suppliers_and_persistent_ones_are_timestamped() -> None:
    supplier = Stores.persistent_timestamped_key_value_store("t")
    assert (supplier.persistent, supplier.timestamped) == (True, True)
    with pytest.raises(TopologyError, match="not a key-value store"):
        Stores.timestamped_key_value_store_builder(Stores.in_memory_window_store("w", 10, 10))
