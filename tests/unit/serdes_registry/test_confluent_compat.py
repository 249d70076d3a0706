"""Byte compatibility with confluent-kafka's own serializers, against one registry over HTTP.

For each format, the same value written by our serde and by confluent-kafka's serializer is the
same bytes (magic byte, schema id, Protobuf message indexes, payload), and each side reads
what the other wrote. Both clients talk to the same registry, so the ids they get must agree.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from streamloop.schema_registry import (
    AvroSerde,
    JsonSchemaSerde,
    ProtobufSerde,
    RecordNameStrategy,
    SchemaRegistryClient,
    TopicRecordNameStrategy,
)
from tests.support.schema_registry import HttpSchemaRegistry
from tests.unit.serdes_registry.confluent import confluent
from tests.unit.serdes_registry.protos import Money, Order, OrderLine, Refund

ORDER = orjson.dumps({
    "type": "record", "name": "Order", "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "amounts", "type": {"type": "array", "items": "double"}},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
    ]}).decode()

ORDER_JSON = orjson.dumps({
    "title": "Order", "type": "object",
    "properties": {"id": {"type": "integer"}, "customer": {"type": "string"}},
    "required": ["id"]}).decode()


@pytest.fixture
def theirs_client(http_registry: HttpSchemaRegistry) -> Iterator[Any]:
    """confluent-kafka's client on the same registry, closed after the test (its pooled sockets)."""
    with confluent().SchemaRegistryClient({"url": http_registry.url}) as client:
        yield client


def contexts(topic: str, is_key: bool = False) -> Any:
    serialization = pytest.importorskip("confluent_kafka.serialization")
    field = serialization.MessageField.KEY if is_key else serialization.MessageField.VALUE
    return serialization.SerializationContext(topic, field)


def unique(base: str) -> str:
    return f"{base}-{uuid.uuid4().hex[:6]}"


def order(i: int) -> dict[str, Any]:
    return {"id": i, "customer": f"c{i}", "note": None if i % 2 else "gift", "amounts": [1.5, i / 3],
            "status": "PAID" if i % 3 else "NEW"}


@pytest.mark.parametrize("is_key", [False, True], ids=["value", "key"])
def test_avro_bytes_equal_confluents_both_ways(http_registry: HttpSchemaRegistry, theirs_client: Any,
                                               is_key: bool) -> None:
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer

    topic = unique("orders")
    ours = AvroSerde(SchemaRegistryClient(http_registry.url), ORDER, topic=topic, is_key=is_key)
    ctx = contexts(topic, is_key)
    theirs = AvroSerializer(theirs_client, ORDER)
    for i in range(5):
        ours_bytes, their_bytes = ours.serialize(order(i)), theirs(order(i), ctx)
        assert ours_bytes == their_bytes
        assert ours_bytes[0] == 0 and int.from_bytes(ours_bytes[1:5], "big") == ours.schema_id
        assert ours.deserialize(their_bytes) == order(i)
        assert AvroDeserializer(theirs_client)(ours_bytes, ctx) == order(i)
    subject = f"{topic}-{'key' if is_key else 'value'}"
    assert http_registry.registry.handle("GET", f"subjects/{subject}/versions", None) == [1]


@pytest.mark.parametrize(("ours_strategy", "theirs_name", "subject"), [
    (RecordNameStrategy, "record_subject_name_strategy", "shop.Order"),
    (TopicRecordNameStrategy, "topic_record_subject_name_strategy", "{topic}-shop.Order"),
])
def test_avro_subject_strategies_register_where_confluents_do(
        http_registry: HttpSchemaRegistry, theirs_client: Any, ours_strategy: type, theirs_name: str,
        subject: str) -> None:
    sr = confluent()
    from confluent_kafka.schema_registry.avro import AvroSerializer

    topic = unique("orders")
    ours = AvroSerde(SchemaRegistryClient(http_registry.url), ORDER, topic=topic, subject_name_strategy=ours_strategy)
    theirs = AvroSerializer(theirs_client, ORDER, conf={"subject.name.strategy": getattr(sr, theirs_name)})
    before = len(http_registry.paths)
    assert ours.serialize(order(1)) == theirs(order(1), contexts(topic))
    posted = {p.split("?")[0] for p in http_registry.paths[before:]}
    expected = subject.format(topic=topic)
    assert posted == {f"POST /subjects/{expected}/versions"}
    assert ours.subject(ours.record_name) == expected


def _order_message(i: int) -> Any:
    message = Order(id=i, customer=f"c{i}", total=Money(currency="EUR", cents=100 * i),
                    lines=[OrderLine(sku=f"s{j}", quantity=j) for j in range(i % 3)])
    message.placed.seconds = 1_700_000_000 + i
    return message


@pytest.mark.parametrize(("message_type", "make"), [
    (Order, _order_message),                               # indexes [1], with an import to reference
    (OrderLine, lambda i: OrderLine(sku=f"s{i}", quantity=i)),  # a nested message: indexes [1, 0]
    (Refund, lambda i: Refund(order_id=i)),                # the first message: indexes [0], one byte
], ids=["Order", "Order.Line", "Refund"])
def test_protobuf_bytes_equal_confluents_both_ways(http_registry: HttpSchemaRegistry, theirs_client: Any,
                                                   message_type: Any, make: Any) -> None:
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer

    topic = unique("orders-pb")
    ctx = contexts(topic)
    # Confluent's serializer registers the import (shop/common.proto) before the file; ours finds
    # it registered then, or registers it itself: run ours first on half the cases.
    ours = ProtobufSerde(SchemaRegistryClient(http_registry.url), message_type, topic=topic)
    theirs = ProtobufSerializer(message_type, theirs_client)
    for i in range(1, 4):
        ours_bytes = ours.serialize(make(i))
        their_bytes = theirs(make(i), ctx)
        assert ours_bytes == their_bytes
        assert ours.deserialize(their_bytes) == make(i)
        assert ProtobufDeserializer(message_type)(ours_bytes, ctx) == make(i)
    registered = http_registry.registry.handle("GET", f"subjects/{topic}-value/versions/1", None)
    assert registered["schemaType"] == "PROTOBUF"
    assert [r["name"] for r in registered.get("references", [])] == ["shop/common.proto"]


def test_json_schema_bytes_equal_confluents_both_ways(http_registry: HttpSchemaRegistry, theirs_client: Any) -> None:
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer

    topic = unique("orders-json")
    ctx = contexts(topic)
    ours = JsonSchemaSerde(SchemaRegistryClient(http_registry.url), ORDER_JSON, topic=topic)
    theirs = JSONSerializer(ORDER_JSON, theirs_client)
    for value in ({"id": 1, "customer": "ann"}, {"id": 2}, {"id": 3, "customer": "é ü"}):
        ours_bytes, their_bytes = ours.serialize(value), theirs(value, ctx)
        assert ours_bytes == their_bytes
        assert ours.deserialize(their_bytes) == value
        assert JSONDeserializer(ORDER_JSON, schema_registry_client=theirs_client)(ours_bytes, ctx) == value


# A registry and the two serializers shared by the examples: each example is one value.
_SHARED: dict[str, Any] = {}


def _shared_avro() -> tuple[AvroSerde, Any, Any]:
    if not _SHARED:
        sr = confluent()
        from confluent_kafka.schema_registry.avro import AvroSerializer

        registry = HttpSchemaRegistry()
        _SHARED["registry"] = registry
        _SHARED["client"] = sr.SchemaRegistryClient({"url": registry.url})
        _SHARED["ours"] = AvroSerde(SchemaRegistryClient(registry.url), ORDER, topic="drawn")
        _SHARED["theirs"] = AvroSerializer(_SHARED["client"], ORDER)
    return _SHARED["ours"], _SHARED["theirs"], contexts("drawn")


@pytest.fixture(scope="module", autouse=True)
def _close_shared() -> Any:
    yield
    if _SHARED:
        _SHARED.pop("client").__exit__(None, None, None)
        _SHARED.pop("registry").close()
        _SHARED.clear()


orders = st.fixed_dictionaries({
    "id": st.integers(-(2 ** 63), 2 ** 63 - 1),
    "customer": st.text(max_size=20),
    "note": st.none() | st.text(max_size=10),
    "amounts": st.lists(st.floats(allow_nan=False), max_size=5),
    "status": st.sampled_from(["NEW", "PAID"]),
})


@hsettings(max_examples=60)
@given(orders)
def test_property_drawn_avro_records_are_confluents_bytes_and_read_back(value: dict[str, Any]) -> None:
    """For any record of the schema: our bytes equal confluent-kafka's, and read back as written."""
    ours, theirs, ctx = _shared_avro()
    data = ours.serialize(value)
    assert data == theirs(value, ctx)
    assert ours.deserialize(data) == value
