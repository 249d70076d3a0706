"""The three serdes alone: round trips, the cache, schema evolution, and each mistake's typed error."""

from __future__ import annotations

import uuid
from typing import Any

import jsonschema
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from streamloop.schema_registry import (
    AvroSerde,
    JsonSchemaSerde,
    ProtobufSerde,
    RecordNameStrategy,
    SchemaNotRegisteredError,
    SchemaRegistryClient,
    UnknownMagicByteError,
    UnknownSchemaIdError,
    WireFormatError,
)
from streamloop.schema_registry.memory import MemoryRegistry
from streamloop.schema_registry.wire import frame
from tests.unit.serdes_registry.protos import Money, Order, OrderLine, Refund

USER_V1 = {"type": "record", "name": "User", "namespace": "app",
           "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "int"}]}
USER_V2 = {"type": "record", "name": "User", "namespace": "app",
           "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "int"},
                      {"name": "email", "type": ["null", "string"], "default": None}]}
ORDER_JSON = {"title": "Order", "type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}


def test_avro_round_trip_and_none_passes_through(client: SchemaRegistryClient) -> None:
    serde = AvroSerde(client, USER_V1, topic="users")
    data = serde.serialize({"name": "ann", "age": 30})
    assert data is not None and data[:5] == frame(serde.schema_id or 0, b"")
    assert serde.deserialize(data) == {"name": "ann", "age": 30}
    assert serde.serialize(None) is None and serde.deserialize(None) is None


def test_after_the_first_record_the_registry_is_not_asked(client: SchemaRegistryClient) -> None:
    writer = AvroSerde(client, USER_V1, topic="users")
    reader = AvroSerde(client, topic="users")
    reader.deserialize(writer.serialize({"name": "a", "age": 1}))
    asked = client.requests
    for i in range(50):
        assert reader.deserialize(writer.serialize({"name": f"u{i}", "age": i})) == {"name": f"u{i}", "age": i}
    assert client.requests == asked


def test_avro_reads_old_records_into_its_newer_schema(client: SchemaRegistryClient) -> None:
    """Avro schema resolution: a v2 reader gets v1 records with the new field's default."""
    old = AvroSerde(client, USER_V1, topic="users")
    new = AvroSerde(client, USER_V2, topic="users")
    v1_bytes = old.serialize({"name": "ann", "age": 30})
    v2_bytes = new.serialize({"name": "bob", "age": 40, "email": "b@x"})
    assert new.schema_id != old.schema_id
    assert new.deserialize(v1_bytes) == {"name": "ann", "age": 30, "email": None}
    assert old.deserialize(v2_bytes) == {"name": "bob", "age": 40}  # forward: the reader drops the new field
    assert AvroSerde(client).deserialize(v2_bytes) == {"name": "bob", "age": 40, "email": "b@x"}  # writer's shape
    assert client.get_version("users-value").version == 2


def test_without_auto_register_the_schema_must_be_registered_first(client: SchemaRegistryClient) -> None:
    strict = AvroSerde(client, USER_V1, topic="users", auto_register_schemas=False)
    with pytest.raises(SchemaNotRegisteredError, match="'users-value'"):
        strict.serialize({"name": "a", "age": 1})
    registered = AvroSerde(client, USER_V1, topic="users").serialize({"name": "a", "age": 1})
    assert strict.serialize({"name": "a", "age": 1}) == registered


def test_record_name_strategy_needs_no_topic(client: SchemaRegistryClient) -> None:
    serde = AvroSerde(client, USER_V1, subject_name_strategy=RecordNameStrategy)
    serde.serialize({"name": "a", "age": 1})
    assert client.get_version("app.User").schema_id == serde.schema_id


@pytest.mark.parametrize(("make", "value", "error"), [
    (lambda c: AvroSerde(c, USER_V1), {"name": "a", "age": 1}, ValueError),  # TopicNameStrategy, no topic
    (lambda c: AvroSerde(c, topic="t"), {"name": "a"}, TypeError),  # no schema: it only reads
    (lambda c: AvroSerde(c, USER_V1, topic="t"), {"name": "a", "age": "old"}, TypeError),  # not the schema
    (lambda c: JsonSchemaSerde(c, topic="t"), {"id": 1}, TypeError),
    (lambda c: ProtobufSerde(c, Order, topic="t"), Refund(order_id=1), TypeError),
])
def test_a_value_a_serde_cannot_write_says_why(client: SchemaRegistryClient, make: Any, value: Any,
                                               error: type[Exception]) -> None:
    with pytest.raises(error):
        make(client).serialize(value)


@pytest.mark.parametrize("make", [lambda c: AvroSerde(c, USER_V1, topic="t"), lambda c: ProtobufSerde(c, Order),
                                  lambda c: JsonSchemaSerde(c, ORDER_JSON)], ids=["avro", "protobuf", "json"])
def test_foreign_bytes_and_unknown_ids_are_typed_errors(client: SchemaRegistryClient, make: Any) -> None:
    serde = make(client)
    with pytest.raises(UnknownMagicByteError):
        serde.deserialize(b'{"name": "plain json"}')
    with pytest.raises(UnknownSchemaIdError, match="Schema id 4242"):
        serde.deserialize(frame(4242, b"\x00"))


def test_a_serde_refuses_a_schema_of_another_type(client: SchemaRegistryClient) -> None:
    json_bytes = JsonSchemaSerde(client, ORDER_JSON, topic="t").serialize({"id": 1})
    with pytest.raises(TypeError, match="JSON schema, not Avro"):
        AvroSerde(client).deserialize(json_bytes)
    with pytest.raises(TypeError, match="JSON schema, not Protobuf"):
        ProtobufSerde(client, Order).deserialize(json_bytes)


def test_protobuf_round_trip_registers_imports_as_references(client: SchemaRegistryClient) -> None:
    serde = ProtobufSerde(client, Order, topic="orders")
    order = Order(id=3, customer="ann", total=Money(currency="EUR", cents=250), lines=[OrderLine(sku="x")])
    order.placed.seconds = 1_700_000_000
    data = serde.serialize(order)
    assert data is not None and data[5:7] == b"\x02\x02"  # indexes [1]: the file's second message
    assert serde.deserialize(data) == order
    registered = client.get_version("orders-value").schema
    assert [r.subject for r in registered.references] == ["shop/common.proto"]  # not Google's timestamp
    assert client.get_version("shop/common.proto").version == 1


def test_protobuf_refuses_a_record_of_another_message(client: SchemaRegistryClient) -> None:
    line_bytes = ProtobufSerde(client, OrderLine, topic="t").serialize(OrderLine(sku="x"))
    with pytest.raises(WireFormatError, match=r"indexes \[1, 0\].*shop.Order "):
        ProtobufSerde(client, Order, topic="t").deserialize(line_bytes)


def test_json_schema_validates_both_ways_unless_told_not_to(client: SchemaRegistryClient) -> None:
    serde = JsonSchemaSerde(client, ORDER_JSON, topic="orders")
    assert serde.deserialize(serde.serialize({"id": 1, "extra": [1, 2]})) == {"id": 1, "extra": [1, 2]}
    with pytest.raises(jsonschema.ValidationError, match="'id' is a required property"):
        serde.serialize({"name": "no id"})
    lax = JsonSchemaSerde(client, ORDER_JSON, topic="orders", validate=False)
    invalid = lax.serialize({"id": "not a number"})
    assert lax.deserialize(invalid) == {"id": "not a number"}
    with pytest.raises(jsonschema.ValidationError):
        JsonSchemaSerde(client).deserialize(invalid)  # the writer's schema, read from the registry


def test_serdes_that_write_the_same_bytes_are_equal(client: SchemaRegistryClient) -> None:
    """As the core serdes, so that a merge of two streams read with equal serdes keeps its serde."""
    assert AvroSerde(client, USER_V1, topic="t") == AvroSerde(client, dict(USER_V1), topic="t")
    assert len({AvroSerde(client, USER_V1, topic="t"), AvroSerde(client, USER_V1, topic="t")}) == 1
    assert AvroSerde(client, USER_V1, topic="t") != AvroSerde(client, USER_V2, topic="t")
    assert AvroSerde(client, USER_V1, topic="t") != AvroSerde(client, USER_V1, topic="t", is_key=True)
    assert AvroSerde(client, USER_V1, topic="t") != AvroSerde(SchemaRegistryClient("mock://other"), USER_V1, topic="t")
    assert ProtobufSerde(client, Order, topic="t") == ProtobufSerde(client, Order, topic="t")
    assert ProtobufSerde(client, Order, topic="t") != ProtobufSerde(client, Refund, topic="t")
    assert JsonSchemaSerde(client, ORDER_JSON) != JsonSchemaSerde(client, ORDER_JSON, validate=False)
    assert AvroSerde(client, topic="t") != JsonSchemaSerde(client, topic="t")  # readers alike but for the format


def model_read(record: dict[str, Any], reader: dict[str, Any]) -> dict[str, Any]:
    """Avro schema resolution for these record schemas: the reader's fields, in its order, each
    from the record or else its default; the writer's other fields dropped."""
    return {f["name"]: record[f["name"]] if f["name"] in record else f["default"] for f in reader["fields"]}


users = st.fixed_dictionaries({"name": st.text(max_size=12), "age": st.integers(-(2 ** 31), 2 ** 31 - 1)})
written = st.lists(st.tuples(st.booleans(), users, st.none() | st.text(max_size=8)), max_size=12)


@hsettings(max_examples=50)
@given(written)
def test_property_mixed_writer_versions_read_as_avro_resolution_says(records: list[Any]) -> None:
    """Records of v1 and v2 writers interleaved on one subject: a v2 reader and a v1 reader each
    get what Avro's resolution rules (the model above) give, record by record."""
    scope = f"prop-{uuid.uuid4().hex[:8]}"
    try:
        client = SchemaRegistryClient(f"mock://{scope}")
        v1, v2 = AvroSerde(client, USER_V1, topic="users"), AvroSerde(client, USER_V2, topic="users")
        sent = [({**user, "email": email} if newer else user, newer) for newer, user, email in records]
        data = [(v2 if newer else v1).serialize(value) for value, newer in sent]
        assert [v2.deserialize(d) for d in data] == [model_read(value, USER_V2) for value, _ in sent]
        assert [v1.deserialize(d) for d in data] == [model_read(value, USER_V1) for value, _ in sent]
    finally:
        MemoryRegistry.reset(scope)


def test_prepare_asks_the_registry_before_any_record(client: SchemaRegistryClient) -> None:
    serdes = [AvroSerde(client, USER_V1, topic="users"), ProtobufSerde(client, Order, topic="orders"),
              JsonSchemaSerde(client, ORDER_JSON, topic="orders-json")]
    ids = [serde.prepare() for serde in serdes]
    assert ids == [serde.schema_id for serde in serdes] and len(set(ids)) == 3
    asked = client.requests
    serdes[0].serialize({"name": "a", "age": 1})
    serdes[1].serialize(Order(id=1))
    serdes[2].serialize({"id": 1})
    assert client.requests == asked
    with pytest.raises(SchemaNotRegisteredError):
        AvroSerde(client, USER_V2, topic="users", auto_register_schemas=False).prepare()
    with pytest.raises(TypeError, match="only reads"):
        AvroSerde(client).prepare()


def test_aprepare_runs_off_the_loop(client: SchemaRegistryClient) -> None:
    import threading

    import anyio

    serde = AvroSerde(client, USER_V1, topic="users")
    seen: list[threading.Thread] = []
    register = client.register

    def recording(*args: Any) -> int:
        seen.append(threading.current_thread())
        return register(*args)

    client.register = recording  # type: ignore[method-assign]

    async def main() -> tuple[int, threading.Thread]:
        return await serde.aprepare(anyio.CapacityLimiter(1)), threading.current_thread()

    schema_id, loop_thread = anyio.run(main)
    assert schema_id == serde.schema_id and seen and loop_thread not in seen
