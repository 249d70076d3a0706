"""A Schema Registry client with Confluent's REST API and a cache in front of it.

Serdes run on a stream thread's loop, record by record, and a serde's ``serialize`` and
``deserialize`` are plain calls: so the client is synchronous, and only its first use of a
schema or id asks the registry (one HTTP round trip, bounded by ``request_timeout_s``, on the
calling thread, as a Kafka Streams serde does on its stream thread); every later use is a dict
look-up with no I/O. Code that runs on an event loop and wants the answer without blocking it
(warming the cache before a topology starts, a service reading schemas) awaits the ``a``
variants, which run the same call on a worker thread under a capacity limiter.

URLs: ``http(s)://host:port`` (several, comma separated: tried in turn when one cannot be
reached) or ``mock://<scope>``, an in-process registry (``streamloop.schema_registry.memory``).
"""

from __future__ import annotations

import base64
import logging
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote

import anyio
import orjson

from streamloop import redaction
from streamloop.schema_registry.errors import (
    IncompatibleSchemaError,
    RegistryUnreachableError,
    SchemaNotRegisteredError,
    SchemaRegistryError,
    UnknownSchemaIdError,
)
from streamloop.schema_registry.memory import MemoryRegistry, RegistryHttpError

log = logging.getLogger(__name__)

_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
_T = TypeVar("_T")


@dataclass(frozen=True)
class SchemaReference:
    """Another subject's schema that a schema imports (a Protobuf import, an Avro named type)."""

    name: str
    subject: str
    version: int


@dataclass(frozen=True)
class RegistrySchema:
    """A schema as the registry holds it: its text, its type (AVRO, PROTOBUF, JSON), its references."""

    schema: str
    schema_type: str = "AVRO"
    references: tuple[SchemaReference, ...] = field(default=())

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"schema": self.schema}
        if self.schema_type != "AVRO":
            body["schemaType"] = self.schema_type
        if self.references:
            body["references"] = [{"name": r.name, "subject": r.subject, "version": r.version}
                                  for r in self.references]
        return body

    @classmethod
    def from_answer(cls, answer: dict[str, Any]) -> RegistrySchema:
        refs = tuple(SchemaReference(r["name"], r["subject"], int(r["version"]))
                     for r in answer.get("references") or ())
        return cls(answer["schema"], answer.get("schemaType") or "AVRO", refs)


@dataclass(frozen=True)
class RegisteredSchema:
    """A schema's place in the registry: its global id and its version under ``subject``."""

    schema_id: int
    subject: str
    version: int
    schema: RegistrySchema


class SchemaRegistryClient:
    """Registers and looks up schemas; caches ids by (subject, schema) and schemas by id.

    ``basic_auth_user_info`` is ``"user:password"`` (basic.auth.user.info). One client is meant
    to be shared by every serde of an application, so each schema is asked for once.
    """

    def __init__(self, url: str, *, basic_auth_user_info: str | None = None,
                 request_timeout_s: float = 10.0, unreachable_backoff_s: float = 5.0) -> None:
        self.urls = tuple(u.strip().rstrip("/") for u in url.split(",") if u.strip())
        if not self.urls:
            raise ValueError("SchemaRegistryClient needs a url (schema.registry.url), e.g. http://localhost:8081")
        self._memory: MemoryRegistry | None = None
        if self.urls[0].startswith("mock://"):
            self._memory = MemoryRegistry.named(self.urls[0].removeprefix("mock://"))
        elif not all(u.startswith(("http://", "https://")) for u in self.urls):
            raise ValueError(f"Schema Registry urls must be http://, https:// or mock://, got {url!r}")
        self.request_timeout_s = request_timeout_s
        # After no URL answered, calls fail at once for this long instead of each waiting up to
        # ``request_timeout_s`` per URL: during an outage a stream thread whose handler skips
        # failed records would otherwise block its loop (and heartbeats) on every record.
        self.unreachable_backoff_s = unreachable_backoff_s
        self._unreachable: tuple[float, RegistryUnreachableError] | None = None
        self._headers = {"Accept": _CONTENT_TYPE, "Content-Type": _CONTENT_TYPE}
        if basic_auth_user_info:
            token = base64.b64encode(basic_auth_user_info.encode()).decode("ascii")
            self._headers["Authorization"] = f"Basic {token}"
            # Hidden in every log line (an HTTP library's debug log prints headers) while this
            # client exists; it has no close, so it lets go when it is collected.
            redaction.register(self, redaction.basic_auth_secrets(basic_auth_user_info))
            weakref.finalize(self, redaction.unregister_id, id(self))
        # Written by whichever thread misses first; a race only asks the registry twice for
        # the same answer, so no lock is held (and none across the HTTP call).
        self._ids: dict[tuple[str, RegistrySchema], int] = {}
        self._lookups: dict[tuple[str, RegistrySchema], RegisteredSchema] = {}
        self._schemas: dict[int, RegistrySchema] = {}
        self.requests = 0  # how often the registry was asked: the cache's effect, for tests and logs

    def __repr__(self) -> str:
        return f"SchemaRegistryClient({','.join(self.urls)!r})"

    # -- the cached calls -------------------------------------------------------------------

    def register(self, subject: str, schema: RegistrySchema) -> int:
        """The id of ``schema`` under ``subject``, registering it (a new version) if it is not yet."""
        cached = self._ids.get((subject, schema))
        if cached is not None:
            return cached
        try:
            answer = self._call("POST", f"subjects/{quote(subject, safe='')}/versions", schema.body())
        except SchemaRegistryError as exc:
            if exc.status == 409:
                raise IncompatibleSchemaError(subject, str(exc)) from exc
            raise
        schema_id = int(answer["id"])
        self._ids[(subject, schema)] = schema_id
        self._schemas.setdefault(schema_id, schema)
        return schema_id

    def lookup(self, subject: str, schema: RegistrySchema) -> RegisteredSchema:
        """Where ``schema`` is registered under ``subject``; ``SchemaNotRegisteredError`` if it is not."""
        cached = self._lookups.get((subject, schema))
        if cached is not None:
            return cached
        try:
            answer = self._call("POST", f"subjects/{quote(subject, safe='')}", schema.body())
        except SchemaRegistryError as exc:
            if exc.error_code in (40401, 40403):
                raise SchemaNotRegisteredError(subject, exc.status, exc.error_code) from exc
            raise
        found = RegisteredSchema(int(answer["id"]), subject, int(answer["version"]), schema)
        self._lookups[(subject, schema)] = found
        self._ids[(subject, schema)] = found.schema_id
        self._schemas.setdefault(found.schema_id, schema)
        return found

    def get_schema(self, schema_id: int) -> RegistrySchema:
        """The schema of a (global) id, as a record's header names it."""
        cached = self._schemas.get(schema_id)
        if cached is not None:
            return cached
        try:
            answer = self._call("GET", f"schemas/ids/{schema_id}", None)
        except SchemaRegistryError as exc:
            if exc.status == 404:
                raise UnknownSchemaIdError(schema_id, ",".join(self.urls)) from exc
            raise
        schema = self._schemas[schema_id] = RegistrySchema.from_answer(answer)
        return schema

    def get_version(self, subject: str, version: int | str = "latest") -> RegisteredSchema:
        """A subject's version (``"latest"`` by default). Not cached: the latest one changes."""
        answer = self._call("GET", f"subjects/{quote(subject, safe='')}/versions/{version}", None)
        schema = RegistrySchema.from_answer(answer)
        self._schemas.setdefault(int(answer["id"]), schema)
        return RegisteredSchema(int(answer["id"]), subject, int(answer["version"]), schema)

    # -- the same, awaited off the loop ------------------------------------------------------

    async def aregister(self, subject: str, schema: RegistrySchema,
                        limiter: anyio.CapacityLimiter | None = None) -> int:
        return await self._off_loop(lambda: self.register(subject, schema), limiter)

    async def alookup(self, subject: str, schema: RegistrySchema,
                      limiter: anyio.CapacityLimiter | None = None) -> RegisteredSchema:
        return await self._off_loop(lambda: self.lookup(subject, schema), limiter)

    async def aget_schema(self, schema_id: int, limiter: anyio.CapacityLimiter | None = None) -> RegistrySchema:
        return await self._off_loop(lambda: self.get_schema(schema_id), limiter)

    @staticmethod
    async def _off_loop(call: Callable[[], _T], limiter: anyio.CapacityLimiter | None) -> _T:
        # The blocking HTTP call runs on a worker thread; anyio's default limiter bounds them
        # unless the caller passes its own.
        return await anyio.to_thread.run_sync(call, limiter=limiter)

    # -- transport ---------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        self.requests += 1
        if self._memory is not None:
            try:
                return self._memory.handle(method, path, body)
            except RegistryHttpError as exc:
                raise SchemaRegistryError(f"Schema Registry {method} /{path}: {exc.message}",
                                          exc.status, exc.error_code) from exc
        unreachable = self._unreachable
        if unreachable is not None:
            until, error = unreachable
            if time.monotonic() < until:
                raise error
            self._unreachable = None
        data = None if body is None else orjson.dumps(body)
        failures = []
        for url in self.urls:
            request = urllib.request.Request(f"{url}/{path}", data=data, method=method, headers=self._headers)
            try:
                with urllib.request.urlopen(request, timeout=self.request_timeout_s) as response:
                    return orjson.loads(response.read())
            except urllib.error.HTTPError as exc:
                raise _answer_error(method, url, path, exc) from exc
            except (urllib.error.URLError, OSError) as exc:
                reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
                log.warning("Schema Registry at %s cannot be reached: %s", url, reason)
                failures.append(f"{url}: {reason}")
        error = RegistryUnreachableError(self.urls, "; ".join(failures))
        self._unreachable = (time.monotonic() + self.unreachable_backoff_s, error)
        raise error


def _answer_error(method: str, url: str, path: str, exc: urllib.error.HTTPError) -> SchemaRegistryError:
    error_code, message = exc.code, exc.reason
    try:
        answer = orjson.loads(exc.read())
        error_code, message = int(answer.get("error_code", exc.code)), answer.get("message", message)
    except (orjson.JSONDecodeError, ValueError, AttributeError):
        pass
    hint = " (check basic_auth_user_info)" if exc.code in (401, 403) else ""
    return SchemaRegistryError(f"Schema Registry {method} {url}/{path} answered {exc.code}: {message}{hint}",
                               exc.code, error_code)
