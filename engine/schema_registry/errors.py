"""The errors of the Schema Registry serdes, each saying what to set or do.

Raised inside a serde they reach the user as the ``__cause__`` of the engine's
``DeserializationError`` (a source, with the record's topic, partition and offset) or
``SerializationError`` (a sink); the exception handlers see them there.
"""

from __future__ import annotations

from streamloop.errors import StreamsError


class SchemaRegistryError(StreamsError):
    """The registry answered with an error, or could not be asked.

    ``status`` is the HTTP status (0 when no answer came) and ``error_code`` Confluent's
    finer code (40401 subject not found, 40403 schema not found, 409 incompatible, ...).
    """

    def __init__(self, message: str, status: int = 0, error_code: int = 0) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code


class RegistryUnreachableError(SchemaRegistryError):
    """No registry answered at any of the configured URLs."""

    def __init__(self, urls: tuple[str, ...], cause: str) -> None:
        super().__init__(f"Schema Registry unreachable at {', '.join(urls)}: {cause}. Set the client's url "
                         "(schema.registry.url) to a running registry, or raise request_timeout_s if it is slow.")
        self.urls = urls


class UnknownSchemaIdError(SchemaRegistryError):
    """A record names a schema id the registry does not know (Confluent's 40403)."""

    def __init__(self, schema_id: int, url: str) -> None:
        super().__init__(f"Schema id {schema_id} is not known to the Schema Registry at {url}: the record was "
                         "written against another registry (check schema.registry.url), or its schema was "
                         "deleted permanently", 404, 40403)
        self.schema_id = schema_id


class SchemaNotRegisteredError(SchemaRegistryError):
    """``auto_register_schemas=False`` and the serde's schema is not registered under its subject."""

    def __init__(self, subject: str, status: int, error_code: int) -> None:
        super().__init__(f"The schema is not registered under subject '{subject}' and auto_register_schemas is "
                         "False: register it first (as a deployment step), or pass auto_register_schemas=True "
                         "(auto.register.schemas)", status, error_code)
        self.subject = subject


class IncompatibleSchemaError(SchemaRegistryError):
    """The registry refused to register a schema under a subject's compatibility rule (HTTP 409)."""

    def __init__(self, subject: str, message: str) -> None:
        super().__init__(f"The Schema Registry refused the schema for subject '{subject}' as incompatible with "
                         f"the versions registered before: {message}", 409, 409)
        self.subject = subject


class WireFormatError(StreamsError, ValueError):
    """Bytes that are not in Confluent's wire format (magic byte 0, 4-byte schema id, payload)."""


class UnknownMagicByteError(WireFormatError):
    """The first byte is not Confluent's magic byte 0: another serializer wrote the record."""

    def __init__(self, first: int | None) -> None:
        what = "the record is empty" if first is None else f"its first byte is {first}"
        super().__init__(f"Unknown magic byte: {what}, where a Schema Registry serializer writes 0 before the "
                         "schema id. The topic holds records of another format: read it with the serde that "
                         "wrote them (or set default.deserialization.exception.handler to skip them)")
        self.first = first
