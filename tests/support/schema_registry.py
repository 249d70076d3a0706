"""A Schema Registry over HTTP for the tests: Confluent's REST API on a loopback port.

Apicurio Registry (whose Confluent-compatible API was the first choice) cannot be fetched
here: its Maven artifacts depend on Confluent's own Maven repository, which is not reachable.
So this serves ``streamloop.schema_registry.memory.MemoryRegistry`` (what ``mock://`` URLs use)
through ``http.server`` on a thread, enough for our client's HTTP path and for confluent-kafka's
client, which the byte-compatibility tests point at the same server.

Usage::

    with HttpSchemaRegistry() as registry:
        SchemaRegistryClient(registry.url)
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

import orjson

from streamloop.schema_registry.memory import MemoryRegistry, RegistryHttpError


class HttpSchemaRegistry:
    """Serves one ``MemoryRegistry`` at ``url`` until closed; ``requests`` counts what it answered."""

    def __init__(self, *, credentials: str | None = None) -> None:
        """``credentials``: ``"user:password"`` that every request must carry as basic auth."""
        self.registry = MemoryRegistry()
        self.credentials = credentials
        self.paths: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="schema-registry", daemon=True)
        self._thread.start()

    @property
    def requests(self) -> int:
        return len(self.paths)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> HttpSchemaRegistry:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


def _handler(owner: HttpSchemaRegistry) -> type[BaseHTTPRequestHandler]:
    import base64

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self, method: str) -> None:
            owner.paths.append(f"{method} {self.path}")
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if owner.credentials is not None:
                expected = "Basic " + base64.b64encode(owner.credentials.encode()).decode()
                if self.headers.get("Authorization") != expected:
                    self._send(401, {"error_code": 401, "message": "Unauthorized"})
                    return
            try:
                body: Any = orjson.loads(raw) if raw else None
                self._send(200, owner.registry.handle(method, self.path, body))
            except RegistryHttpError as exc:
                self._send(exc.status, exc.body())

        def _send(self, status: int, answer: Any) -> None:
            data = orjson.dumps(answer)
            self.send_response(status)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._answer("GET")

        def do_POST(self) -> None:
            self._answer("POST")

        def log_message(self, format: str, *args: Any) -> None:  # quiet: the tests read `paths`
            return

    return Handler
