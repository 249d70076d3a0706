"""Avro in Confluent's wire format, through fastavro (the ``schema-registry`` extra).

Values are what fastavro writes and reads: dicts for records, and Python values for the rest.
With a ``schema`` the serde writes with it and reads every record into it (Avro schema
resolution from the record's writer schema, so a reader keeps its shape across compatible
evolutions); without one it only reads, each record in its writer's schema.
"""

from __future__ import annotations

import io
from typing import Any

import orjson

from streamloop.errors import MissingExtraError
from streamloop.schema_registry.client import RegistrySchema, SchemaRegistryClient
from streamloop.schema_registry.serde import RegistrySerde
from streamloop.schema_registry.strategies import SubjectNameStrategy, TopicNameStrategy
from streamloop.schema_registry.wire import unframe

try:
    import fastavro
except ImportError as exc:
    raise MissingExtraError("The Avro serde (AvroSerde)", "schema-registry", "fastavro") from exc


def _as_text(schema: str | dict[str, Any] | list[Any]) -> str:
    return schema if isinstance(schema, str) else orjson.dumps(schema).decode()


class AvroSerde(RegistrySerde):
    """Writes and reads Avro records framed with their schema id.

    ``topic`` and ``is_key`` name the subject under ``TopicNameStrategy`` (the default):
    ``<topic>-value`` or ``<topic>-key``. Pass the schema as JSON text or as a dict.
    """

    def __init__(self, registry: SchemaRegistryClient | str, schema: str | dict[str, Any] | None = None, *,
                 topic: str | None = None, is_key: bool = False,
                 subject_name_strategy: SubjectNameStrategy | type = TopicNameStrategy,
                 auto_register_schemas: bool = True) -> None:
        super().__init__(registry, topic=topic, is_key=is_key, subject_name_strategy=subject_name_strategy,
                         auto_register_schemas=auto_register_schemas)
        self._schema: RegistrySchema | None = None
        self._parsed: Any = None
        if schema is not None:
            text = _as_text(schema)
            self._schema = RegistrySchema(text, "AVRO")
            self._parsed = fastavro.parse_schema(orjson.loads(text))
            if isinstance(self._parsed, dict):
                self.record_name = self._parsed.get("name")
        # Per id read so far: its writer schema parsed once, and the reader schema to resolve it
        # into (None where the writer schema is the serde's own: no resolution needed).
        self._writers: dict[int, tuple[Any, Any]] = {}

    def serialize(self, value: Any) -> bytes | None:
        if value is None:
            return None
        header = self._writer_header()
        out = io.BytesIO()
        out.write(header)
        fastavro.schemaless_writer(out, self._parsed, value)
        return out.getvalue()

    def _registry_schema(self) -> RegistrySchema:
        if self._schema is None:
            raise TypeError("This AvroSerde has no schema, so it only reads: pass schema= to write")
        return self._schema

    def deserialize(self, data: bytes | None) -> Any:
        if data is None:
            return None
        schema_id, payload = unframe(data)
        schemas = self._writers.get(schema_id)
        if schemas is None:
            schemas = self._writer_schema(schema_id)
        return fastavro.schemaless_reader(io.BytesIO(payload), schemas[0], schemas[1])

    def _writer_schema(self, schema_id: int) -> tuple[Any, Any]:
        schema = self.registry.get_schema(schema_id)
        if schema.schema_type != "AVRO":
            raise TypeError(f"Schema id {schema_id} is a {schema.schema_type} schema, not Avro: "
                            "read this topic with the serde of that type")
        if self._schema is not None and schema.schema == self._schema.schema:
            schemas = (self._parsed, None)
        else:
            schemas = (fastavro.parse_schema(orjson.loads(schema.schema)), self._parsed)
        self._writers[schema_id] = schemas
        return schemas

    def _settings(self) -> tuple[object, ...]:
        return (*super()._settings(), self._schema)

    def __repr__(self) -> str:
        return f"AvroSerde({self.record_name or 'reader'}, {self._what()})"
