"""What the Avro, Protobuf and JSON Schema serdes share: the subject, the writer's schema id,
the frame.

A serde writes under one subject, fixed by its topic, key-or-value and record name, so its
schema id is found once (registered when ``auto_register_schemas``, else looked up) and its
5-byte header kept: serializing after the first record is the payload's encoding and one
concatenation. Reading takes the id from each record's header; the client caches the schema
of each id.
"""

from __future__ import annotations

import anyio

from streamloop.schema_registry.client import RegistrySchema, SchemaRegistryClient
from streamloop.schema_registry.strategies import SubjectNameStrategy, TopicNameStrategy, as_strategy
from streamloop.schema_registry.wire import frame


class RegistrySerde:
    """The base of the Schema Registry serdes (not used alone)."""

    def __init__(self, registry: SchemaRegistryClient | str, *, topic: str | None, is_key: bool,
                 subject_name_strategy: SubjectNameStrategy | type, auto_register_schemas: bool) -> None:
        if isinstance(registry, str):
            registry = SchemaRegistryClient(registry)
        if not isinstance(registry, SchemaRegistryClient):
            raise TypeError(f"registry must be a SchemaRegistryClient or its url, got {registry!r}")
        self.registry = registry
        self.topic = topic
        self.is_key = is_key
        self.subject_name_strategy = as_strategy(subject_name_strategy or TopicNameStrategy)
        self.auto_register_schemas = auto_register_schemas
        self.record_name: str | None = None  # the subject strategies' record name (set by each serde)
        self._header: bytes | None = None
        self._schema_id: int | None = None

    def subject(self, record_name: str | None) -> str:
        """The subject this serde writes under (per its strategy, topic and key-or-value)."""
        return self.subject_name_strategy(self.topic, self.is_key, record_name)

    def _registry_schema(self) -> RegistrySchema:
        """The schema the serde writes with, as the registry holds it (each serde says)."""
        raise NotImplementedError

    def _writer_header(self) -> bytes:
        """The frame header of the serde's schema: the registry is asked on the first call only."""
        header = self._header
        if header is None:
            schema = self._registry_schema()
            subject = self.subject(self.record_name)
            if self.auto_register_schemas:
                self._schema_id = self.registry.register(subject, schema)
            else:
                self._schema_id = self.registry.lookup(subject, schema).schema_id
            header = self._header = frame(self._schema_id, b"")
        return header

    def prepare(self) -> int:
        """Register (or look up) the serde's schema now and return its id, rather than at the first
        record: then no record waits for the registry, and a registry that cannot be reached or a
        schema that is not registered is found before the application starts."""
        self._writer_header()
        assert self._schema_id is not None
        return self._schema_id

    async def aprepare(self, limiter: anyio.CapacityLimiter | None = None) -> int:
        """``prepare`` on a worker thread, for code on an event loop."""
        return await anyio.to_thread.run_sync(self.prepare, limiter=limiter)

    @property
    def schema_id(self) -> int | None:
        """The id the serde writes with, once it wrote a record (None before)."""
        return self._schema_id

    def _settings(self) -> tuple[object, ...]:
        """What decides the bytes the serde writes and how it reads: equal settings, equal serdes."""
        return (self.registry, self.topic, self.is_key, self.subject_name_strategy, self.auto_register_schemas)

    def __eq__(self, other: object) -> bool:
        # As the core serdes: equal when they write the same bytes, so that a merge of two
        # streams read with equal serdes still knows its serde.
        return type(other) is type(self) and other._settings() == self._settings()

    def __hash__(self) -> int:
        return hash((type(self), *self._settings()))

    def _what(self) -> str:
        return f"topic={self.topic!r}, is_key={self.is_key}, {self.subject_name_strategy!r}, {self.registry!r}"
