"""The serdes in a topology under ``TopologyTestDriver``: Avro in, a changelogged Avro store, JSON
Schema out, all against one ``mock://`` registry; and a foreign record is a DeserializationError."""

from __future__ import annotations

import pytest

from streamloop import StreamsBuilder
from streamloop.errors import DeserializationError
from streamloop.schema_registry import AvroSerde, JsonSchemaSerde, SchemaRegistryClient, UnknownMagicByteError
from streamloop.serdes import StringSerde
from streamloop.state import Materialized
from streamloop.testing import TopologyTestDriver

STR = StringSerde()
ORDER = {"type": "record", "name": "Order", "namespace": "shop",
         "fields": [{"name": "customer", "type": "string"}, {"name": "cents", "type": "long"}]}
TOTAL = {"type": "record", "name": "Total", "namespace": "shop",
         "fields": [{"name": "orders", "type": "long"}, {"name": "cents", "type": "long"}]}
TOTAL_JSON = {"title": "CustomerTotal", "type": "object",
              "properties": {"customer": {"type": "string"}, "cents": {"type": "integer"}},
              "required": ["customer", "cents"]}
APP = "registry-driver"


def totals_topology(registry: SchemaRegistryClient) -> StreamsBuilder:
    builder = StreamsBuilder()
    # The store's serde writes to its changelog topic, so its subject is the changelog's, as in
    # Kafka Streams (where the serde is handed the changelog topic's name).
    totals_store = AvroSerde(registry, TOTAL, topic=f"{APP}-totals-changelog")
    (builder.stream("orders", key_serde=STR, value_serde=AvroSerde(registry, ORDER, topic="orders"))
            .group_by_key()
            .aggregate(lambda: {"orders": 0, "cents": 0},
                       lambda _k, order, total: {"orders": total["orders"] + 1,
                                                 "cents": total["cents"] + order["cents"]},
                       materialized=Materialized("totals", value_serde=totals_store))
            .to_stream()
            .map_values(lambda total: {"cents": total["cents"]})
            .map(lambda customer, v: (customer, {"customer": customer, **v}))
            .to("totals", key_serde=STR, value_serde=JsonSchemaSerde(registry, TOTAL_JSON, topic="totals")))
    return builder


def test_avro_in_a_changelogged_store_and_json_schema_out(mock_url: str) -> None:
    registry = SchemaRegistryClient(mock_url)
    with TopologyTestDriver(totals_topology(registry).build(),
                            {"application.id": APP, "commit.interval.ms": 1_000,
                             "cache.max.bytes.buffering": 0}) as driver:
        orders = driver.create_input_topic("orders", STR, AvroSerde(registry, ORDER, topic="orders"))
        out = driver.create_output_topic("totals", STR, JsonSchemaSerde(registry))
        orders.pipe_input("ann", {"customer": "ann", "cents": 250})
        orders.pipe_input("bob", {"customer": "bob", "cents": 100})
        orders.pipe_input("ann", {"customer": "ann", "cents": 50})
        store = driver.get_key_value_store("totals")
        assert store.get("ann") == {"orders": 2, "cents": 300}

        driver.advance_wall_clock_time(1_000)  # the input is committed: a crash replays none of it
        assert driver.committed("orders") == 3

        driver.crash()  # so the store can only come back from its changelog, read with the Avro serde
        assert store.get("ann") == {"orders": 2, "cents": 300}
        orders.pipe_input("ann", {"customer": "ann", "cents": 1})
        assert store.get("ann") == {"orders": 3, "cents": 301}
        assert dict(out.read_key_values())["ann"] == {"customer": "ann", "cents": 301}

    subjects = registry._memory.handle("GET", "subjects", None) if registry._memory else []
    assert subjects == sorted(["orders-value", f"{APP}-totals-changelog-value", "totals-value"])


def test_a_record_not_in_the_wire_format_is_a_deserialization_error(mock_url: str) -> None:
    registry = SchemaRegistryClient(mock_url)
    with TopologyTestDriver(totals_topology(registry).build(), {"application.id": APP}) as driver:
        driver.create_output_topic("totals")
        with pytest.raises(DeserializationError, match="orders-0 offset 0") as caught:
            driver.pipe_raw("orders", b"ann", b'{"customer": "ann"}')
    assert isinstance(caught.value.__cause__, UnknownMagicByteError)
