"""Versioned key-value stores (KIP-889): puts in and out of order, reads as of a time, deletes,
history retention, and a restore from the changelog through the test driver. The cases follow
Kafka Streams' ``RocksDBVersionedStoreTest`` (named in each test)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from streamloop import StreamsBuilder
from streamloop.errors import TopologyError
from streamloop.processors.api import BaseProcessor
from streamloop.records import Record
from streamloop.serdes import StringSerde
from streamloop.state import Stores
from streamloop.state.bytes_stores import InMemoryBytesStore
from streamloop.state.versioned import (
    PUT_RETURN_CODE_NOT_PUT,
    PUT_RETURN_CODE_VALID_TO_UNDEFINED,
    VersionedKeyValueStore,
    VersionedRecord,
)
from streamloop.testing import TopologyTestDriver

STR = StringSerde()


def store(history_retention_ms: int = 100) -> VersionedKeyValueStore:
    return VersionedKeyValueStore("v", InMemoryBytesStore("v"), STR, STR, None, None, "0_0/v", lambda: 0,
                                  lambda: None, history_retention_ms=history_retention_ms)


def test_puts_in_order_and_out_of_order_return_when_the_version_stops_being_valid() -> None:
    """``shouldPutLatest``, ``shouldPutOlderWithNonNullLatest``, ``shouldPutRepeatTimestamps``."""
    s = store()
    assert s.put("k", "v1", 10) == PUT_RETURN_CODE_VALID_TO_UNDEFINED
    assert s.put("k", "v3", 30) == PUT_RETURN_CODE_VALID_TO_UNDEFINED
    assert s.put("k", "v2", 20) == 30  # valid until the newer version at 30
    assert s.put("k", "v2b", 20) == 30  # the same timestamp replaces
    assert s.get("k") == VersionedRecord("v3", 30)
    assert s.get("k", 25) == VersionedRecord("v2b", 20, 30)
    assert s.get("k", 10) == VersionedRecord("v1", 10, 20)
    assert s.get("k", 9) is None  # before the first version
    assert s.get("other") is None


def test_a_delete_is_a_tombstone_that_ends_the_version_before_it() -> None:
    """``shouldDelete``/``shouldGetNullForDeletedLatest``: reads at or after the tombstone find
    nothing, reads before it the old version, now with a valid-to."""
    s = store()
    s.put("k", "v1", 10)
    assert s.delete("k", 20) == VersionedRecord("v1", 10)
    assert s.get("k") is None and s.get("k", 25) is None
    assert s.get("k", 15) == VersionedRecord("v1", 10, 20)
    assert s.put("k", "v0", 5) == 10
    assert s.put("k", "v3", 30) == PUT_RETURN_CODE_VALID_TO_UNDEFINED
    assert s.get("k") == VersionedRecord("v3", 30)


def test_history_older_than_the_retention_cannot_be_put_or_read() -> None:
    """``shouldNotPutExpired`` / ``shouldNotGetExpired``: the history kept ends at observed stream
    time minus the retention; the version valid at that point can still be read from it on."""
    s = store(history_retention_ms=100)
    s.put("k", "v1", 10)
    s.put("k", "v2", 50)
    s.put("j", "w", 160)  # observed stream time 160 (any key): history from 60
    assert s.put("k", "too-old", 59) == PUT_RETURN_CODE_NOT_PUT
    assert s.put("k", "at-horizon", 60) == PUT_RETURN_CODE_VALID_TO_UNDEFINED
    assert s.get("k", 59) is None  # older than the history kept
    assert s.get("k", 60) == VersionedRecord("at-horizon", 60)
    assert s.get("k", 70) == VersionedRecord("at-horizon", 60)


def test_the_builder_takes_only_versioned_suppliers() -> None:
    with pytest.raises(TopologyError, match="not a versioned store"):
        Stores.versioned_key_value_store_builder(Stores.in_memory_key_value_store("x"))
    with pytest.raises(TopologyError, match="history_retention_ms"):
        Stores.persistent_versioned_key_value_store("x", -1)


class Prices(BaseProcessor):
    """A record ``key: {"price": p}`` puts a version at its timestamp; ``{"at": t}`` asks for the
    price as of ``t`` and forwards it (or null)."""

    def init(self, context: Any) -> None:
        super().init(context)
        self.prices: VersionedKeyValueStore = context.get_state_store("prices")

    def process(self, record: Record) -> None:
        request = json.loads(record.value)
        if "at" in request:
            found = self.prices.get(record.key, request["at"])
            self.context.forward(record.with_value(None if found is None else f"{found.value}@{found.timestamp}"))
        else:
            self.prices.put(record.key, request["price"], record.timestamp)


def prices_topology() -> Any:
    builder = StreamsBuilder()
    builder.add_state_store(Stores.versioned_key_value_store_builder(
        Stores.in_memory_versioned_key_value_store("prices", 60_000), STR, STR))
    builder.stream("prices", key_serde=STR, value_serde=STR).process(Prices, stores=["prices"]).to(
        "answers", key_serde=STR, value_serde=STR)
    return builder.build()


def test_the_driver_runs_a_versioned_store_and_a_rebalance_restores_its_history() -> None:
    with TopologyTestDriver(prices_topology()) as driver:
        source = driver.create_input_topic("prices", STR, STR)
        answers = driver.create_output_topic("answers", STR, STR)
        source.pipe_input("apple", json.dumps({"price": "3"}), timestamp=1_000)
        source.pipe_input("apple", json.dumps({"price": "5"}), timestamp=9_000)
        source.pipe_input("apple", json.dumps({"price": "4"}), timestamp=5_000)  # out of order
        # In memory: after the task is revoked and assigned again, only the changelog has it.
        driver.rebalance(driver.task_ids[0])
        for at in (500, 1_000, 6_000, 20_000):
            source.pipe_input("apple", json.dumps({"at": at}), timestamp=9_000)
        assert answers.read_values() == [None, "3@1000", "4@5000", "5@9000"]
