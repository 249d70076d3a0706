"""Protobuf in Confluent's wire format (the ``schema-registry`` extra's ``protobuf``).

The serde is made for one generated message class. It registers the class's .proto file as
Confluent does (the serialized ``FileDescriptorProto``, base64), each imported file first as a
reference under a subject named after the file (Google's well-known types excepted, which
every registry knows), and frames a record with the message's index path inside its file.
"""

from __future__ import annotations

import base64
from typing import Any

from streamloop.errors import MissingExtraError
from streamloop.schema_registry.client import RegistrySchema, SchemaReference, SchemaRegistryClient
from streamloop.schema_registry.errors import WireFormatError
from streamloop.schema_registry.serde import RegistrySerde
from streamloop.schema_registry.strategies import SubjectNameStrategy, TopicNameStrategy
from streamloop.schema_registry.wire import decode_message_indexes, encode_message_indexes, unframe

try:
    from google.protobuf.message import DecodeError, Message
except ImportError as exc:
    raise MissingExtraError("The Protobuf serde (ProtobufSerde)", "schema-registry", "protobuf") from exc

# Files every Confluent registry resolves itself: not registered as references (skip.known.types).
_KNOWN = ("google/protobuf/", "google/type/", "confluent/")


def message_indexes(descriptor: Any) -> list[int]:
    """The path of a message type in its file: top-level index, then nested indexes."""
    path = []
    while descriptor.containing_type is not None:
        parent = descriptor.containing_type
        path.append(list(parent.nested_types).index(descriptor))
        descriptor = parent
    path.append(list(descriptor.file.message_types_by_name).index(descriptor.name))
    return path[::-1]


def _file_schema(file: Any, references: tuple[SchemaReference, ...] = ()) -> RegistrySchema:
    return RegistrySchema(base64.standard_b64encode(file.serialized_pb).decode("ascii"), "PROTOBUF", references)


class ProtobufSerde(RegistrySerde):
    """Writes and reads instances of ``message_type`` (a generated Protobuf class)."""

    def __init__(self, registry: SchemaRegistryClient | str, message_type: type[Message], *,
                 topic: str | None = None, is_key: bool = False,
                 subject_name_strategy: SubjectNameStrategy | type = TopicNameStrategy,
                 auto_register_schemas: bool = True) -> None:
        super().__init__(registry, topic=topic, is_key=is_key, subject_name_strategy=subject_name_strategy,
                         auto_register_schemas=auto_register_schemas)
        if not (isinstance(message_type, type) and issubclass(message_type, Message)):
            raise TypeError(f"message_type must be a generated Protobuf message class, got {message_type!r}")
        self.message_type = message_type
        self.record_name = message_type.DESCRIPTOR.full_name
        self.indexes = message_indexes(message_type.DESCRIPTOR)
        self._index_bytes = encode_message_indexes(self.indexes)
        self._schema: RegistrySchema | None = None  # with its references, known at the first write
        self._known_ids: set[int] = set()

    def serialize(self, value: Message | None) -> bytes | None:
        if value is None:
            return None
        if not isinstance(value, self.message_type):
            raise TypeError(f"ProtobufSerde({self.record_name}) expects {self.message_type.__name__}, "
                            f"got {type(value).__name__}")
        body: bytes = value.SerializeToString()
        return self._writer_header() + self._index_bytes + body

    def _registry_schema(self) -> RegistrySchema:
        if self._schema is None:
            file = self.message_type.DESCRIPTOR.file
            self._schema = _file_schema(file, self._references(file))
        return self._schema

    def _references(self, file: Any) -> tuple[SchemaReference, ...]:
        """Register (or look up) the files ``file`` imports, depth first, as Confluent's serializer does."""
        references = []
        for dependency in file.dependencies:
            if dependency.name.startswith(_KNOWN):
                continue
            schema = _file_schema(dependency, self._references(dependency))
            if self.auto_register_schemas:
                self.registry.register(dependency.name, schema)
            found = self.registry.lookup(dependency.name, schema)
            references.append(SchemaReference(dependency.name, dependency.name, found.version))
        return tuple(references)

    def deserialize(self, data: bytes | None) -> Message | None:
        if data is None:
            return None
        schema_id, payload = unframe(data)
        if schema_id not in self._known_ids:
            # The message class decodes the bytes; the look-up only proves the id is the
            # registry's (a clear error for a record from another registry), once per id.
            schema = self.registry.get_schema(schema_id)
            if schema.schema_type != "PROTOBUF":
                raise TypeError(f"Schema id {schema_id} is a {schema.schema_type} schema, not Protobuf: "
                                "read this topic with the serde of that type")
            self._known_ids.add(schema_id)
        indexes, message = decode_message_indexes(payload)
        if indexes != self.indexes:
            raise WireFormatError(f"The record's message indexes {indexes} name another message type than "
                                  f"{self.record_name} (indexes {self.indexes}) in schema id {schema_id}")
        try:
            return self.message_type.FromString(bytes(message))
        except DecodeError as exc:
            raise WireFormatError(f"The record is not a valid {self.record_name}: {exc}") from exc

    def _settings(self) -> tuple[object, ...]:
        return (*super()._settings(), self.message_type)

    def __repr__(self) -> str:
        return f"ProtobufSerde({self.record_name}, {self._what()})"
