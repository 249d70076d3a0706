"""What the Schema Registry serdes cost a record once their schema is cached, against
confluent-kafka's serializers and deserializers for the same values, side by side.

Avro (a 5-field record), JSON Schema (the same as JSON, validated) and Protobuf (a message
with a nested one): µs per record to serialize and to deserialize, and confluent's time over
ours. Both sides use in-process registries (``mock://``), warmed first, so no I/O is timed.
Run: ``.venv/bin/python benchmarks/registry_serdes.py [--records N]``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamloop.schema_registry import AvroSerde, JsonSchemaSerde, ProtobufSerde, SchemaRegistryClient
from tests.unit.serdes_registry.protos import Money, Order

AVRO = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"}, {"name": "customer", "type": "string"},
    {"name": "note", "type": ["null", "string"], "default": None},
    {"name": "amounts", "type": {"type": "array", "items": "double"}},
    {"name": "paid", "type": "boolean"}]}
JSON = {"title": "Order", "type": "object", "required": ["id"], "properties": {
    "id": {"type": "integer"}, "customer": {"type": "string"}, "note": {"type": ["null", "string"]},
    "amounts": {"type": "array", "items": {"type": "number"}}, "paid": {"type": "boolean"}}}


def value(i: int) -> dict[str, Any]:
    return {"id": i, "customer": f"customer-{i % 100}", "note": None if i % 2 else "gift",
            "amounts": [1.5, i / 7], "paid": bool(i % 3)}


def message(i: int) -> Any:
    return Order(id=i, customer=f"customer-{i % 100}", total=Money(currency="EUR", cents=i))


def per_record_us(call: Callable[[Any], Any], inputs: list[Any]) -> float:
    """The best of 3 rounds over ``inputs``, in µs a record."""
    best = float("inf")
    for _ in range(3):
        began = time.perf_counter()
        for item in inputs:
            call(item)
        best = min(best, time.perf_counter() - began)
    return best / len(inputs) * 1e6


def confluent() -> Any:
    with warnings.catch_warnings():
        # authlib (which confluent's client imports) puts an "always" filter for its deprecation
        # warning in front when imported: import it first so that "ignore" goes in front of it.
        with contextlib.suppress(ImportError):
            import authlib.deprecate  # noqa: F401
        warnings.simplefilter("ignore")
        try:
            import confluent_kafka.schema_registry as sr
            import confluent_kafka.schema_registry.avro
            import confluent_kafka.schema_registry.json_schema
            import confluent_kafka.schema_registry.protobuf  # noqa: F401
            from confluent_kafka.serialization import MessageField, SerializationContext
        except ImportError:
            return None
    return sr, SerializationContext("orders", MessageField.VALUE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    n = parser.parse_args().records
    ours_client = SchemaRegistryClient("mock://bench-registry-serdes")
    theirs = confluent()
    cases: list[tuple[str, Any, list[Any], Any]] = [
        ("Avro", AvroSerde(ours_client, AVRO, topic="orders"), [value(i) for i in range(n)], None),
        ("JSON Schema", JsonSchemaSerde(ours_client, JSON, topic="orders-json"), [value(i) for i in range(n)], None),
        ("Protobuf", ProtobufSerde(ours_client, Order, topic="orders-pb"), [message(i) for i in range(n)], None),
    ]
    if theirs is not None:
        sr, ctx = theirs
        client = sr.SchemaRegistryClient.new_client({"url": "mock://bench"})
        import orjson
        pairs = [
            (sr.avro.AvroSerializer(client, orjson.dumps(AVRO).decode()), sr.avro.AvroDeserializer(client)),
            (sr.json_schema.JSONSerializer(orjson.dumps(JSON).decode(), client),
             sr.json_schema.JSONDeserializer(orjson.dumps(JSON).decode(), schema_registry_client=client)),
            (sr.protobuf.ProtobufSerializer(Order, client, {"use.deprecated.format": False}),
             sr.protobuf.ProtobufDeserializer(Order, {"use.deprecated.format": False})),
        ]
        cases = [(name, serde, inputs, (pair, ctx))
                 for (name, serde, inputs, _), pair in zip(cases, pairs, strict=True)]

    print(f"{n} records, µs per record (best of 3), schemas cached; confluent-kafka "
          f"{'not installed' if theirs is None else 'for comparison'}")
    print(f"{'format':<12} {'serialize':>10} {'confluent':>10} {'ratio':>6}   {'deserialize':>11} {'confluent':>10} "
          f"{'ratio':>6}")
    for name, serde, inputs, other in cases:
        data = [serde.serialize(v) for v in inputs]  # warms the cache
        ser = per_record_us(serde.serialize, inputs)
        de = per_record_us(serde.deserialize, data)
        if other is None:
            print(f"{name:<12} {ser:>10.2f} {'-':>10} {'-':>6}   {de:>11.2f} {'-':>10} {'-':>6}")
            continue
        (serializer, deserializer), ctx = other
        their_data = [serializer(v, ctx) for v in inputs]
        assert their_data == data, f"{name}: confluent's bytes differ"
        their_ser = per_record_us(lambda v: serializer(v, ctx), inputs)  # noqa: B023
        their_de = per_record_us(lambda b: deserializer(b, ctx), their_data)  # noqa: B023
        print(f"{name:<12} {ser:>10.2f} {their_ser:>10.2f} {their_ser / ser:>5.1f}×   {de:>11.2f} {their_de:>10.2f} "
              f"{their_de / de:>5.1f}×")


if __name__ == "__main__":
    main()
