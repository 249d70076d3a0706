"""The client over HTTP (extra ``http``): health probes, Prometheus metrics and interactive queries.

``streamloop run app:streams --http HOST:PORT`` serves it next to the client; a service on aiohttp
mounts :func:`make_app` itself (``app.add_subapp("/streams", make_app(streams))``), and one on
another framework calls ``streams.health`` and ``streams.store()`` the same way. Every answer is
JSON (``/metrics`` excepted):

- ``GET /health/live``, ``GET /health/ready[?max_lag=N]``: 200 when ``ok``, else 503; the body is
  the ``HealthResult``'s reason (see ``streamloop.health``).
- ``GET /metrics``: ``KafkaStreams.metrics()`` in Prometheus' text format, when the ``prometheus``
  extra is installed.
- ``GET /stores/{store}``: the store's metadata: its type, and each instance (its
  ``application.server``) with the partitions it holds active and standby.
- ``GET /stores/{store}/keys/{key}``: a key's value (404 when the store has none).
- ``GET /stores/{store}/keys[?from=K&to=K&limit=N]``: a range (both ends inclusive, open when
  left out), from every instance that holds a part of the store, at most ``limit`` entries
  (default 1000; ``"truncated": true`` when there were more).
- ``GET /stores/{store}/windows/{key}?from=MS&to=MS``: the key's windows of a window store
  starting within ``[from, to]``.

Keys in a path or query are text: a store whose key serde is a ``StringSerde`` takes it as is;
any other reads it as JSON (``/keys/42`` is the int 42) and, if it is not JSON or its serde
cannot write that, as the text. Values are the store's values, as JSON; a value JSON cannot
hold is written with the store's value serde, and sent as that JSON if the bytes are JSON, else
as ``{"base64": ...}``.

A key another instance owns is **forwarded**, not redirected: this instance asks the instance
whose ``application.server`` the key's metadata names (one HTTP hop, marked with the header
``X-Streamloop-Forwarded``, answered where it lands) and returns its answer, with
``X-Streamloop-Served-By`` naming the instance whose store answered. So a client needs to reach
one instance only (a Kubernetes Service), and ``application.server`` need only be reachable by
the other instances. A range asks every instance the same way and merges their answers. While
the owner is not known (before the first assignment, or when ``application.server`` is unset
on the owner) or cannot be reached, the answer is 503 with the reason: ask again.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Any, TypeVar

import anyio.to_thread

from streamloop.config import APPLICATION_SERVER, DEFAULT_KEY_SERDE, DEFAULT_VALUE_SERDE, is_loopback
from streamloop.errors import IllegalStateError, InvalidStateStoreError, MissingExtraError
from streamloop.serdes import Serde, StringSerde
from streamloop.state.metadata import HostInfo, KeyQueryMetadata, StreamsMetadata
from streamloop.state.query import ReadOnlyKeyValueStore, ReadOnlyWindowStore
from streamloop.state.session_windows import ReadOnlySessionStore
from streamloop.state.store import StateStore
from streamloop.state.windows import Windowed
from streamloop.tasks.wiring import default_serde

try:
    import aiohttp
    from aiohttp import web
except ImportError as exc:  # the 'http' extra is optional
    raise MissingExtraError("The HTTP endpoint (streamloop run --http)", "http", "aiohttp") from exc

if TYPE_CHECKING:
    from streamloop.client import KafkaStreams

__all__ = ["FORWARDED", "SERVED_BY", "StreamsHttpServer", "make_app"]

log = logging.getLogger(__name__)
V = TypeVar("V")  # a store view: ReadOnlyKeyValueStore or ReadOnlyWindowStore

FORWARDED = "X-Streamloop-Forwarded"
SERVED_BY = "X-Streamloop-Served-By"
DEFAULT_LIMIT = 1000
# A peer that does not answer within this long makes the query a 503, not a hung request.
FORWARD_TIMEOUT_S = 10.0

_PEERS = web.AppKey("peers", aiohttp.ClientSession)


class QueryError(Exception):
    """A query that cannot be answered: the HTTP status and the reason, sent as ``{"error": ...}``."""

    def __init__(self, status: int, error: str, **extra: Any) -> None:
        super().__init__(error)
        self.status = status
        self.body = {"error": error, **extra}


def make_app(streams: KafkaStreams, *, max_lag: int | None = None) -> web.Application:
    """The routes above for ``streams`` (``max_lag``: the readiness bound when a probe names none)."""
    app = web.Application()
    handler = _Handlers(streams, max_lag)

    async def peers(app: web.Application) -> AsyncIterator[None]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_S)) as session:
            app[_PEERS] = session
            yield

    app.cleanup_ctx.append(peers)
    app.router.add_get("/health/live", handler.live)
    app.router.add_get("/health/ready", handler.ready)
    metrics = _metrics_handler(streams)
    if metrics is not None:
        app.router.add_get("/metrics", metrics)
    app.router.add_get("/stores/{store}", handler.store_metadata)
    app.router.add_get("/stores/{store}/keys", handler.key_range)
    app.router.add_get("/stores/{store}/keys/{key}", handler.key)
    app.router.add_get("/stores/{store}/windows/{key}", handler.windows)
    return app


def _metrics_handler(streams: KafkaStreams) -> Callable[[web.Request], Awaitable[web.Response]] | None:
    try:
        from streamloop.prometheus import exposition
    except MissingExtraError:
        log.info("No /metrics: the Prometheus extra is not installed (pip install 'streamloop[prometheus]')")
        return None
    render = exposition(streams.metrics)

    async def metrics(_request: web.Request) -> web.Response:
        # Snapshots only (metrics() never waits for a stream thread), but formatting is CPU work.
        body, content_type = await anyio.to_thread.run_sync(render)
        response = web.Response(body=body)
        response.headers["Content-Type"] = content_type
        return response

    return metrics


class _Handlers:
    def __init__(self, streams: KafkaStreams, max_lag: int | None) -> None:
        self.streams = streams
        self.max_lag = max_lag
        self.me = HostInfo.build_from_endpoint(streams.config[APPLICATION_SERVER])

    # -- health ------------------------------------------------------------------------
    async def live(self, _request: web.Request) -> web.Response:
        result = self.streams.health.live()
        return web.json_response(result.reason, status=200 if result.ok else 503)

    async def ready(self, request: web.Request) -> web.Response:
        max_lag = self.max_lag
        if "max_lag" in request.query:
            try:
                max_lag = int(request.query["max_lag"])
            except ValueError:
                return _error(QueryError(400, f"max_lag must be a number of records, got {request.query['max_lag']!r}"))
        try:
            result = self.streams.health.ready(max_lag)
        except ValueError as exc:
            return _error(QueryError(400, str(exc)))
        return web.json_response(result.reason, status=200 if result.ok else 503)

    # -- queries -------------------------------------------------------------------------
    async def store_metadata(self, request: web.Request) -> web.Response:
        name = request.match_info["store"]
        try:
            kind = self._kind(name)
            instances = [_instance(m) for m in self.streams.metadata_for_store(name)]
        except QueryError as exc:
            return _error(exc)
        except IllegalStateError as exc:
            return _error(QueryError(503, str(exc)))
        return web.json_response({"store": name, "type": kind, "this_instance": self._me_text(),
                                  "instances": instances})

    async def key(self, request: web.Request) -> web.Response:
        name = request.match_info["store"]
        try:
            if self._kind(name) != "key_value":
                raise QueryError(400, f"store {name!r} is a {self._kind(name)} store: ask /stores/{name}/windows/"
                                 "{key}?from=MS&to=MS for a window store")
            owned = await self._owned_store(request, name, ReadOnlyKeyValueStore, "a key-value")
            if isinstance(owned, web.Response):
                return owned
            key, key_serde, value_serde, store = owned
            value = await anyio.to_thread.run_sync(store.get, key)
        except QueryError as exc:
            return _error(exc)
        if value is None:
            return _error(QueryError(404, f"store {name!r} has no value for this key", key=to_json(key, key_serde)),
                          self._served_by())
        return web.json_response({"store": name, "key": to_json(key, key_serde), "value": to_json(value, value_serde)},
                                 headers=self._served_by())

    async def _owned_store(self, request: web.Request, name: str, view: type[V],
                           what: str) -> tuple[Any, Serde, Serde, V] | web.Response:
        """The request's key, the store's serdes and this instance's ``view`` of store ``name``; or,
        when another instance owns the key, that instance's answer."""
        key_serde, value_serde = self._serdes(name)
        key = parse_key(request.match_info["key"], key_serde)
        forwarded = await self._forward_to_owner(request, name, key, key_serde)
        if forwarded is not None:
            return forwarded
        store = self._store(name)
        if not isinstance(store, view):
            raise QueryError(400, f"store {name!r} is not {what} store")
        return key, key_serde, value_serde, store

    async def windows(self, request: web.Request) -> web.Response:
        name = request.match_info["store"]
        try:
            if self._kind(name) != "window":
                raise QueryError(400, f"store {name!r} is a {self._kind(name)} store, not a window store: ask "
                                 f"/stores/{name}/keys/{{key}}")
            time_from = _int_param(request, "from", 0)
            time_to = _int_param(request, "to", 2**63 - 1)
            owned = await self._owned_store(request, name, ReadOnlyWindowStore, "a window")
            if isinstance(owned, web.Response):
                return owned
            key, key_serde, value_serde, store = owned
            found = await anyio.to_thread.run_sync(store.fetch_range, key, time_from, time_to)
        except QueryError as exc:
            return _error(exc)
        size = self._window_size(name)
        windows = [{"start": start, "end": None if size is None else start + size, "value": to_json(v, value_serde)}
                   for start, v in found]
        return web.json_response({"store": name, "key": to_json(key, key_serde), "windows": windows},
                                 headers=self._served_by())

    async def key_range(self, request: web.Request) -> web.Response:
        name = request.match_info["store"]
        try:
            if self._kind(name) not in ("key_value", "global"):
                raise QueryError(400, f"store {name!r} is a {self._kind(name)} store: ranges are read from "
                                 "key-value stores")
            key_serde, value_serde = self._serdes(name)
            low = parse_key(request.query["from"], key_serde) if "from" in request.query else None
            high = parse_key(request.query["to"], key_serde) if "to" in request.query else None
            limit = _int_param(request, "limit", DEFAULT_LIMIT)
            if limit < 1:
                raise QueryError(400, f"limit must be at least 1, got {limit}")
            entries = await self._local_range(name, low, high, limit + 1, key_serde, value_serde)
            truncated = len(entries) > limit
            if FORWARDED not in request.headers and self._kind(name) != "global":
                peer_entries, peer_truncated = await self._peer_ranges(request, name)
                entries += peer_entries
                truncated = truncated or peer_truncated
        except QueryError as exc:
            return _error(exc)
        # Each part holds its first ``limit`` entries, so the first ``limit`` of the union are among them.
        entries.sort(key=lambda entry: _sort_key(entry["key"], key_serde))
        return web.json_response({"store": name, "entries": entries[:limit],
                                  "truncated": truncated or len(entries) > limit}, headers=self._served_by())

    async def _local_range(self, name: str, low: Any, high: Any, limit: int, key_serde: Serde,
                           value_serde: Serde) -> list[dict[str, Any]]:
        store = self._store(name)
        if not isinstance(store, ReadOnlyKeyValueStore):
            raise QueryError(400, f"store {name!r} is not a key-value store")

        def read() -> list[dict[str, Any]]:
            entries = []
            for key, value in store.range(low, high):
                entries.append({"key": to_json(key, key_serde), "value": to_json(value, value_serde)})
                if len(entries) >= limit:
                    break
            return entries

        return await anyio.to_thread.run_sync(read)

    async def _peer_ranges(self, request: web.Request, name: str) -> tuple[list[dict[str, Any]], bool]:
        """The same range from every other instance that holds a part of the store; whether any
        of them had more than ``limit`` entries."""
        try:
            peers = [m.host_info for m in self.streams.metadata_for_store(name) if m.host_info != self.me]
        except IllegalStateError as exc:
            raise QueryError(503, str(exc)) from None
        entries: list[dict[str, Any]] = []
        truncated = False
        for peer in peers:
            status, body, _ = await self._ask(request, peer)
            if status != 200:
                raise QueryError(503, f"instance {peer.endpoint} answered {status} for its part of the range",
                                 peer=body)
            entries += body["entries"]
            truncated = truncated or bool(body.get("truncated"))
        return entries, truncated

    async def _forward_to_owner(self, request: web.Request, name: str, key: Any,
                                key_serde: Serde) -> web.Response | None:
        """The owner's answer when another instance owns ``key``; None to answer here."""
        if self.me is None or self._kind(name) == "global":
            return None  # alone (no application.server), or a full copy on every instance
        try:
            metadata = self.streams.query_metadata_for_key(name, key, key_serde)
        except IllegalStateError as exc:
            raise QueryError(503, str(exc)) from None
        if metadata is None or metadata == KeyQueryMetadata.NOT_AVAILABLE:
            raise QueryError(503, "the instance that owns this key is not known yet (no assignment has named it); "
                             "ask again")
        if metadata.active_host == self.me:
            return None
        if metadata.active_host == HostInfo.unavailable():
            raise QueryError(503, "the key's partition is owned by an instance that sets no application.server, "
                             "so no other instance can ask it; set application.server on every instance")
        if FORWARDED in request.headers:
            # One hop only: the instance that sent it here took this one for the owner; the group
            # moved the key meanwhile, and the next request goes to the right one.
            raise QueryError(503, f"this instance no longer owns the key (now {metadata.active_host.endpoint}); "
                             "ask again")
        status, body, served_by = await self._ask(request, metadata.active_host)
        return web.json_response(body, status=status, headers={SERVED_BY: served_by} if served_by else None)

    async def _ask(self, request: web.Request, peer: HostInfo) -> tuple[int, Any, str]:
        url = f"http://{peer.endpoint}{request.rel_url.path}"
        try:
            async with request.app[_PEERS].get(url, params=request.rel_url.query,
                                               headers={FORWARDED: self._me_text() or "?"}) as answer:
                body = await answer.json()
                return answer.status, body, answer.headers.get(SERVED_BY, "")
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise QueryError(503, f"instance {peer.endpoint} (its application.server) did not answer: {exc!r}",
                             peer=peer.endpoint) from None

    # -- the store's parts ------------------------------------------------------------------
    def _kind(self, name: str) -> str:
        topology = self.streams.topology
        if name in topology.global_stores:
            return "global"
        if name not in topology.store_names:
            stores = sorted([*topology.store_names, *topology.global_stores])
            raise QueryError(404, f"no store {name!r} in the topology (stores: {stores})")
        kind = topology.store_builder(name).type.name.lower()
        return "key_value" if kind not in ("window", "session") else kind

    def _store(self, name: str) -> ReadOnlyKeyValueStore | ReadOnlyWindowStore | ReadOnlySessionStore:
        try:
            return self.streams.store(name)
        except InvalidStateStoreError as exc:
            raise QueryError(503, str(exc)) from None

    def _instances(self, name: str) -> list[StateStore]:
        return self.streams.store_instances(name)

    def _serdes(self, name: str) -> tuple[Serde, Serde]:
        """The store's serdes: a local instance's (what the topology gave it), else its builder's,
        else the defaults of the config."""
        for store in self._instances(name):
            return store.key_serde, store.value_serde
        topology, config = self.streams.topology, self.streams.config
        builder = (topology.global_stores[name].builder if name in topology.global_stores
                   else topology.store_builder(name))
        return (builder.key_serde or default_serde(config, DEFAULT_KEY_SERDE),
                builder.value_serde or default_serde(config, DEFAULT_VALUE_SERDE))

    def _window_size(self, name: str) -> int | None:
        for store in self._instances(name):
            size = getattr(store, "window_size_ms", None)
            if isinstance(size, int):
                return size
        return None

    def _me_text(self) -> str:
        return self.me.endpoint if self.me is not None else ""

    def _served_by(self) -> dict[str, str]:
        return {SERVED_BY: self._me_text()} if self.me is not None else {}


def _instance(metadata: StreamsMetadata) -> dict[str, Any]:
    def partitions(tps: Any) -> list[dict[str, Any]]:
        return [{"topic": tp.topic, "partition": tp.partition} for tp in sorted(tps)]

    return {"endpoint": metadata.host_info.endpoint, "partitions": partitions(metadata.topic_partitions),
            "standby_partitions": partitions(metadata.standby_topic_partitions)}


def _int_param(request: web.Request, name: str, default: int) -> int:
    text = request.query.get(name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise QueryError(400, f"{name} must be an integer, got {text!r}") from None


def _error(error: QueryError, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(error.body, status=error.status, headers=headers)


def parse_key(text: str, serde: Serde) -> Any:
    """The store's key written as ``text`` (see the module docstring); ``QueryError`` 400 when the
    key serde can write neither reading."""
    if isinstance(serde, StringSerde):
        return text
    candidates: list[Any] = []
    with suppress(ValueError):
        candidates.append(json.loads(text))
    candidates.append(text)
    for candidate in candidates:
        try:
            serde.serialize(candidate)
        except Exception:  # any serde failure means: not this reading
            continue
        return candidate
    raise QueryError(400, f"the key {text!r} is neither JSON nor text that the store's key serde "
                     f"{type(serde).__name__} can write")


def to_json(value: Any, serde: Serde | None = None) -> Any:
    """``value`` as JSON data: as it is when JSON holds it, else through ``serde``'s bytes."""
    if isinstance(value, Windowed):
        return {"key": to_json(value.key, serde), "start": value.start, "end": value.end}
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        pass
    data = value if isinstance(value, bytes) else None
    if data is None and serde is not None:
        try:
            data = serde.serialize(value)
        except Exception:  # a value its own serde cannot write: say what it is
            return {"repr": repr(value)}
    if data is None:
        return {"repr": repr(value)}
    try:
        return json.loads(data)
    except ValueError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def _sort_key(key: Any, serde: Serde) -> tuple[int, bytes]:
    """The key-bytes order the stores keep, across the instances' parts."""
    try:
        return 0, serde.serialize(key) or b""
    except Exception:  # a key sent as base64 or repr: after the others
        return 1, json.dumps(key, sort_keys=True).encode()


class StreamsHttpServer:
    """:func:`make_app` served on ``host:port`` (port 0: any free one; ``port`` tells which).

    ``async with StreamsHttpServer(streams, "127.0.0.1", 8080):`` or ``await start()`` /
    ``await close()``, on an asyncio event loop (aiohttp's).
    """

    def __init__(self, streams: KafkaStreams, host: str = "127.0.0.1", port: int = 8080, *,
                 max_lag: int | None = None) -> None:
        self.host = host
        self.port = port
        self._runner = web.AppRunner(make_app(streams, max_lag=max_lag), access_log=None)
        me = HostInfo.build_from_endpoint(streams.config[APPLICATION_SERVER])
        self._me = me

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        if self.port == 0:
            self.port = int(self._runner.addresses[0][1])  # the free port the system chose
        log.info("Serving health, metrics and queries at http://%s:%d/", self.host, self.port)
        if not is_loopback(self.host):
            log.warning("The HTTP endpoint listens on %s, off loopback: anyone who reaches port %d reads the "
                        "stores and metrics, without a token (--http)", self.host, self.port)
        if self._me is not None and self._me.port != self.port:
            log.warning("application.server is %s but the HTTP endpoint listens on port %d: other instances "
                        "forward queries to application.server, so it must name this endpoint",
                        self._me.endpoint, self.port)

    async def close(self) -> None:
        await self._runner.cleanup()

    async def __aenter__(self) -> StreamsHttpServer:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()
