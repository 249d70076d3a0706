"""JSON Schema in Confluent's wire format (the ``schema-registry`` extra's ``jsonschema``).

The payload is the value's JSON (orjson, as confluent-kafka writes it). Values are validated
against the serde's schema before they are written and, on reading, against the writer's
schema of the record's id (``validate=False`` skips both).
"""

from __future__ import annotations

from typing import Any

import orjson

from streamloop.errors import MissingExtraError
from streamloop.schema_registry.client import RegistrySchema, SchemaRegistryClient
from streamloop.schema_registry.serde import RegistrySerde
from streamloop.schema_registry.strategies import SubjectNameStrategy, TopicNameStrategy
from streamloop.schema_registry.wire import unframe

try:
    import jsonschema
    import jsonschema.validators
except ImportError as exc:
    raise MissingExtraError("The JSON Schema serde (JsonSchemaSerde)", "schema-registry", "jsonschema") from exc


def _validator(schema: dict[str, Any]) -> Any:
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


class JsonSchemaSerde(RegistrySerde):
    """Writes and reads JSON values framed with the id of their JSON Schema."""

    def __init__(self, registry: SchemaRegistryClient | str, schema: str | dict[str, Any] | None = None, *,
                 topic: str | None = None, is_key: bool = False,
                 subject_name_strategy: SubjectNameStrategy | type = TopicNameStrategy,
                 auto_register_schemas: bool = True, validate: bool = True) -> None:
        super().__init__(registry, topic=topic, is_key=is_key, subject_name_strategy=subject_name_strategy,
                         auto_register_schemas=auto_register_schemas)
        self.validate = validate
        self._schema: RegistrySchema | None = None
        self._validator: Any = None
        if schema is not None:
            text = schema if isinstance(schema, str) else orjson.dumps(schema).decode()
            parsed = orjson.loads(text)
            self._schema = RegistrySchema(text, "JSON")
            self._validator = _validator(parsed)
            self.record_name = parsed.get("title") if isinstance(parsed, dict) else None
        self._readers: dict[int, Any] = {}  # id -> validator of its writer schema (None: not validating)

    def serialize(self, value: Any) -> bytes | None:
        if value is None:
            return None
        header = self._writer_header()
        if self.validate:
            self._validator.validate(value)
        return header + orjson.dumps(value)

    def _registry_schema(self) -> RegistrySchema:
        if self._schema is None:
            raise TypeError("This JsonSchemaSerde has no schema, so it only reads: pass schema= to write")
        return self._schema

    def deserialize(self, data: bytes | None) -> Any:
        if data is None:
            return None
        schema_id, payload = unframe(data)
        validator = self._readers[schema_id] if schema_id in self._readers else self._reader(schema_id)
        value = orjson.loads(payload)
        if validator is not None:
            validator.validate(value)
        return value

    def _reader(self, schema_id: int) -> Any:
        schema = self.registry.get_schema(schema_id)
        if schema.schema_type != "JSON":
            raise TypeError(f"Schema id {schema_id} is a {schema.schema_type} schema, not JSON Schema: "
                            "read this topic with the serde of that type")
        validator = None
        if self.validate:
            same = self._schema is not None and schema.schema == self._schema.schema
            validator = self._validator if same else _validator(orjson.loads(schema.schema))
        self._readers[schema_id] = validator
        return validator

    def _settings(self) -> tuple[object, ...]:
        return (*super()._settings(), self._schema, self.validate)

    def __repr__(self) -> str:
        return f"JsonSchemaSerde({self.record_name or 'reader'}, {self._what()})"
