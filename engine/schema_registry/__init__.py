"""Schema Registry serdes: Avro, Protobuf and JSON Schema in Confluent's wire format.

The client, the strategies and the errors need nothing beyond the core; each serde needs its
format's package from the ``schema-registry`` extra (``pip install 'streamloop[schema-registry]'``)
and imports it only when the serde is first named, so that the core runs without them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from streamloop.schema_registry.client import RegisteredSchema, RegistrySchema, SchemaReference, SchemaRegistryClient
from streamloop.schema_registry.errors import (
    IncompatibleSchemaError,
    RegistryUnreachableError,
    SchemaNotRegisteredError,
    SchemaRegistryError,
    UnknownMagicByteError,
    UnknownSchemaIdError,
    WireFormatError,
)
from streamloop.schema_registry.strategies import (
    RecordNameStrategy,
    SubjectNameStrategy,
    TopicNameStrategy,
    TopicRecordNameStrategy,
)

if TYPE_CHECKING:
    from streamloop.schema_registry.avro import AvroSerde
    from streamloop.schema_registry.json_schema import JsonSchemaSerde
    from streamloop.schema_registry.protobuf import ProtobufSerde

_LAZY = {"AvroSerde": "streamloop.schema_registry.avro", "ProtobufSerde": "streamloop.schema_registry.protobuf",
         "JsonSchemaSerde": "streamloop.schema_registry.json_schema"}

__all__ = [
    "AvroSerde",
    "IncompatibleSchemaError",
    "JsonSchemaSerde",
    "ProtobufSerde",
    "RecordNameStrategy",
    "RegisteredSchema",
    "RegistrySchema",
    "RegistryUnreachableError",
    "SchemaNotRegisteredError",
    "SchemaReference",
    "SchemaRegistryClient",
    "SchemaRegistryError",
    "SubjectNameStrategy",
    "TopicNameStrategy",
    "TopicRecordNameStrategy",
    "UnknownMagicByteError",
    "UnknownSchemaIdError",
    "WireFormatError",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
