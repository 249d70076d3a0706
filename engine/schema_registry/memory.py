"""An in-process Schema Registry speaking Confluent's REST API, for ``mock://<scope>`` URLs.

``SchemaRegistryClient("mock://name")`` talks to the registry of that name in this process (as
``memory://`` brokers are), so that tests, the docs' examples and the test driver need no
server. The test suite also serves one over HTTP (``tests/support/schema_registry.py``), for
the client's HTTP path and for confluent-kafka's own client. What it keeps: global schema ids
(the same schema gets the same id under every subject, as Confluent's), versions per subject,
references. What it leaves out: compatibility checks, modes, contexts, deletes; schemas are
compared by their exact text.
"""

from __future__ import annotations

import itertools
import re
import threading
from typing import Any, ClassVar
from urllib.parse import unquote


class RegistryHttpError(Exception):
    """An error answer: HTTP ``status``, Confluent's ``error_code`` and ``message``."""

    def __init__(self, status: int, error_code: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code
        self.message = message

    def body(self) -> dict[str, Any]:
        return {"error_code": self.error_code, "message": self.message}


_SchemaKey = tuple[str, str, tuple[tuple[str, str, int], ...]]


def _key(body: dict[str, Any]) -> _SchemaKey:
    schema = body.get("schema")
    if not isinstance(schema, str) or not schema:
        raise RegistryHttpError(422, 42201, "Invalid schema: 'schema' must be a non-empty string")
    refs = tuple((str(r["name"]), str(r["subject"]), int(r["version"])) for r in body.get("references") or ())
    return str(body.get("schemaType") or "AVRO"), schema, refs


def _schema_fields(key: _SchemaKey) -> dict[str, Any]:
    fields: dict[str, Any] = {"schema": key[1]}
    if key[0] != "AVRO":
        fields["schemaType"] = key[0]  # as Confluent's: AVRO, the default, is left out
    if key[2]:
        fields["references"] = [{"name": n, "subject": s, "version": v} for n, s, v in key[2]]
    return fields


class MemoryRegistry:
    """One registry; ``handle`` answers a REST request as Confluent's server does."""

    _registries: ClassVar[dict[str, MemoryRegistry]] = {}
    _registries_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: dict[_SchemaKey, int] = {}
        self._by_id: dict[int, _SchemaKey] = {}
        self._subjects: dict[str, list[int]] = {}  # subject -> schema id of version 1, 2, ...
        self._next_id = itertools.count(1)

    @classmethod
    def named(cls, scope: str) -> MemoryRegistry:
        """The registry of ``mock://<scope>``, made on first use."""
        with cls._registries_lock:
            registry = cls._registries.get(scope)
            if registry is None:
                registry = cls._registries[scope] = cls()
            return registry

    @classmethod
    def reset(cls, scope: str) -> None:
        """Forget the registry of ``mock://<scope>`` (a test's clean-up)."""
        with cls._registries_lock:
            cls._registries.pop(scope, None)

    def handle(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        """The JSON answer to ``method path`` (the query string dropped); errors raise RegistryHttpError."""
        path = path.split("?", 1)[0].strip("/")
        with self._lock:
            for pattern, verb, handler in _ROUTES:
                match = pattern.fullmatch(path)
                if match and verb == method:
                    return getattr(self, handler)(*(unquote(g) for g in match.groups()), body or {})
        raise RegistryHttpError(404, 404, f"No such endpoint: {method} /{path}")

    def _register(self, subject: str, body: dict[str, Any]) -> dict[str, Any]:
        key = _key(body)
        self._check_references(key)
        schema_id = self._ids.get(key)
        if schema_id is None:
            schema_id = self._ids[key] = next(self._next_id)
            self._by_id[schema_id] = key
        versions = self._subjects.setdefault(subject, [])
        if schema_id not in versions:
            versions.append(schema_id)
        return {"id": schema_id}

    def _check_references(self, key: _SchemaKey) -> None:
        for name, subject, version in key[2]:
            versions = self._subjects.get(subject, [])
            if not 1 <= version <= len(versions):
                raise RegistryHttpError(422, 42201, f"Invalid schema: reference '{name}' names {subject} "
                                                    f"version {version}, which is not registered")

    def _lookup(self, subject: str, body: dict[str, Any]) -> dict[str, Any]:
        versions = self._subjects.get(subject)
        if versions is None:
            raise RegistryHttpError(404, 40401, f"Subject '{subject}' not found.")
        schema_id = self._ids.get(_key(body))
        if schema_id not in versions:
            raise RegistryHttpError(404, 40403, "Schema not found")
        return self._version_answer(subject, versions.index(schema_id) + 1, schema_id)

    def _version_answer(self, subject: str, version: int, schema_id: int) -> dict[str, Any]:
        return {"subject": subject, "version": version, "id": schema_id, **_schema_fields(self._by_id[schema_id])}

    def _by_schema_id(self, schema_id: str, body: dict[str, Any]) -> dict[str, Any]:
        key = self._by_id.get(int(schema_id))
        if key is None:
            raise RegistryHttpError(404, 40403, "Schema not found")
        return _schema_fields(key)

    def _version(self, subject: str, version: str, body: dict[str, Any]) -> dict[str, Any]:
        versions = self._subjects.get(subject)
        if versions is None:
            raise RegistryHttpError(404, 40401, f"Subject '{subject}' not found.")
        number = len(versions) if version in ("latest", "-1") else int(version)
        if not 1 <= number <= len(versions):
            raise RegistryHttpError(404, 40402, f"Version {version} not found.")
        return self._version_answer(subject, number, versions[number - 1])

    def _versions(self, subject: str, body: dict[str, Any]) -> list[int]:
        versions = self._subjects.get(subject)
        if versions is None:
            raise RegistryHttpError(404, 40401, f"Subject '{subject}' not found.")
        return list(range(1, len(versions) + 1))

    def _subject_list(self, body: dict[str, Any]) -> list[str]:
        return sorted(self._subjects)


# Path, verb, and the name of the method that answers (looked up on the instance).
_ROUTES: list[tuple[re.Pattern[str], str, str]] = [
    (re.compile(r"subjects/([^/]+)/versions"), "POST", "_register"),
    (re.compile(r"subjects/([^/]+)/versions"), "GET", "_versions"),
    (re.compile(r"subjects/([^/]+)/versions/([^/]+)"), "GET", "_version"),
    (re.compile(r"subjects/([^/]+)"), "POST", "_lookup"),
    (re.compile(r"subjects"), "GET", "_subject_list"),
    (re.compile(r"schemas/ids/(\d+)"), "GET", "_by_schema_id"),
]
