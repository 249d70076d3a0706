"""A loopback TCP proxy that can stall or drop traffic on demand, for fault-injection tests.

The proxy runs its own event loop in its own OS thread, so it keeps forwarding
(or keeps holding bytes back) no matter how busy the test's loop or the
engine's loops are. Modes can be switched at any time from any thread::

    with FaultProxy("127.0.0.1", server_port) as proxy:
        connect_to(proxy.address)        # "127.0.0.1:<port>"
        proxy.stall()                    # connections stay open, no bytes move
        proxy.pass_through()             # held bytes flow again, in order, none lost
        proxy.drop()                     # every connection is reset; new ones are reset at once
        proxy.pass_through()
        proxy.stall_for(2.0)             # stall now, pass through again in 2 s

Modes
    ``pass_through``
        Bytes are forwarded both ways as they arrive.
    ``stall``
        Connections stay open (new ones are accepted and connected to the
        target too) but nothing is forwarded in either direction. Each direction
        of each connection buffers a little (one 64 KiB chunk plus asyncio's
        stream buffer, about 128 KiB); beyond that the proxy stops reading, so
        the kernel's socket buffers fill and TCP flow control pushes back on the
        sender. On ``pass_through()`` everything held is forwarded in order,
        including an end-of-stream that arrived during the stall. Like packets
        delayed by a network, a request a client sent before giving up on it
        (and closing its connection) still reaches the server after the stall.
        Only a peer that *resets* its connection during a stall loses what the
        proxy held for it.
    ``drop``
        Every open connection is reset (RST on both sides, held bytes are
        discarded) and connections accepted while dropping are reset at once.
        The listening socket stays open, so a client sees its connect succeed
        and then a reset/EOF (or, if the reset is quick, the connect fail with
        ECONNRESET), never "connection refused".

When a mode method returns, the mode is in effect: no byte is forwarded after
``stall()`` returns (bytes already handed to an outgoing socket may still
arrive), and every connection has been reset when ``drop()`` returns. Any
explicit mode change cancels a pending automatic resume of ``stall_for`` /
``drop_for``.

Kafka
    A Kafka client only uses the bootstrap address for its first metadata
    request; after that it connects to the address the broker *advertises*.
    :func:`proxied_kafka` starts a dedicated broker that advertises the proxy's
    address, so all client traffic goes through the proxy. Note that this holds
    even for a client bootstrapped from the broker's real port.

    How aiokafka 0.14 reacts (measured in tests/integration/test_kafka_through_proxy.py):

    * stall: a produce fails after ``request_timeout_ms`` with
      ``RequestTimedOutError`` (``KafkaTimeoutError`` when the batch expires
      before it is sent); the held request still reaches the broker after the
      stall, so the "failed" record usually *is* in the log. ``getmany`` just
      returns nothing. ``consumer.commit()`` never fails by itself: aiokafka
      retries it without a deadline, so only the caller's ``wait_for`` ends it
      (builtin ``TimeoutError``).
    * drop: aiokafka reconnects in a tight loop (every attempt is reset) and a
      produce fails after about ``request_timeout_ms`` with ``NodeNotReadyError``
      (``KafkaConnectionError`` is also possible), i.e. not a timeout class;
      the record is not written.
    * after ``pass_through()`` the clients recover within milliseconds; an
      outage longer than the consumer's session timeout makes the next commit
      fail once with ``CommitFailedError`` (the group rebalanced).

Only loopback addresses are accepted, for listening and for the target.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import errno
import ipaddress
import logging
import random
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from tests.support.kafka_broker import KafkaBroker

__all__ = [
    "FaultProxy",
    "Mode",
    "ProxiedKafka",
    "ProxyStats",
    "proxied_kafka",
]

log = logging.getLogger(__name__)

_CHUNK = 64 * 1024
# How long a mode switch or stop may take to be applied by the proxy's loop.
_CALL_TIMEOUT = 10.0


class Mode(enum.Enum):
    PASS_THROUGH = "pass_through"
    STALLED = "stalled"
    DROPPING = "dropping"


@dataclass(frozen=True)
class ProxyStats:
    """A consistent snapshot of the proxy's counters (see :meth:`FaultProxy.stats`)."""

    mode: Mode
    bytes_to_target: int
    """Bytes forwarded from clients to the target."""
    bytes_to_client: int
    """Bytes forwarded from the target back to clients."""
    connections_accepted: int
    """Every connection accepted on the listening port, including those reset while dropping."""
    connections_refused: int
    """Connections accepted while dropping and reset at once."""
    connections_dropped: int
    """Open connections reset by :meth:`FaultProxy.drop` (or ``drop_for``)."""
    connections_active: int
    """Connections currently open (being forwarded or held)."""
    upstream_failures: int
    """Accepted connections closed because the target could not be reached."""


def _require_loopback(host: str, what: str) -> None:
    if host == "localhost":
        return
    try:
        ok = ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{what} must be a loopback address, got {host!r}")


def _reset(writer: asyncio.StreamWriter | None) -> None:
    """Close ``writer``'s connection with an RST (SO_LINGER 0), dropping unsent bytes."""
    if writer is None:
        return
    transport = writer.transport
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


class _Connection:
    """One client connection and its connection to the target (loop thread only)."""

    def __init__(self, client_writer: asyncio.StreamWriter) -> None:
        self.client_writer = client_writer
        self.target_writer: asyncio.StreamWriter | None = None
        self.pumps: set[asyncio.Task[None]] = set()
        self.reset = False

    def abort(self) -> None:
        """Reset both sides at once and stop forwarding."""
        if self.reset:
            return
        self.reset = True
        _reset(self.client_writer)
        _reset(self.target_writer)
        current = asyncio.current_task()
        for task in self.pumps:
            if task is not current:
                task.cancel()

    async def close(self) -> None:
        """Close both sides normally (after both directions ended)."""
        for writer in (self.client_writer, self.target_writer):
            if writer is None:
                continue
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()


class FaultProxy:
    """Forwards TCP connections from a loopback port to ``target_host:target_port``.

    ``target_port`` may be a callable, asked on every new connection; that lets
    the proxy exist before its target does (e.g. a broker that must advertise
    the proxy's port). If it returns ``None`` the connection is closed.

    ``listen_port`` 0 listens on an ephemeral port; a ``range`` listens on a random free port
    in it (pass one below the ephemeral range when clients must be able to reconnect to the
    proxy's port after it stopped: a client's own reconnecting socket can take a free
    ephemeral port, a TCP self-connect).
    """

    def __init__(
        self,
        target_host: str,
        target_port: int | Callable[[], int | None],
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int | range = 0,
        name: str = "fault-proxy",
    ) -> None:
        _require_loopback(target_host, "target_host")
        _require_loopback(listen_host, "listen_host")
        self.target_host = target_host
        self._target_port = target_port
        self.listen_host = listen_host
        self._listen_port = listen_port
        self.name = name

        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = concurrent.futures.Future[int]()
        self._stop_requested: asyncio.Event | None = None
        self._port: int | None = None

        # State below is only changed on the proxy's loop thread.
        self._mode = Mode.PASS_THROUGH
        self._gate: asyncio.Event | None = None  # set while passing through
        self._connections: set[_Connection] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._revert: asyncio.TimerHandle | None = None

        self._bytes_to_target = 0
        self._bytes_to_client = 0
        self._accepted = 0
        self._refused = 0
        self._dropped = 0
        self._upstream_failures = 0
        self._changed = threading.Condition()
        self._generation = 0

    # -- info -----------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the proxy is not started")
        return self._port

    @property
    def address(self) -> str:
        """``"127.0.0.1:<port>"``: what clients connect to."""
        return f"{self.listen_host}:{self.port}"

    @property
    def target_port(self) -> int | None:
        port = self._target_port
        return port() if callable(port) else port

    @property
    def mode(self) -> Mode:
        return self._mode

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def bytes_to_target(self) -> int:
        return self._bytes_to_target

    @property
    def bytes_to_client(self) -> int:
        return self._bytes_to_client

    @property
    def connections_accepted(self) -> int:
        return self._accepted

    @property
    def connections_refused(self) -> int:
        return self._refused

    @property
    def connections_dropped(self) -> int:
        return self._dropped

    @property
    def connections_active(self) -> int:
        return len(self._connections)

    @property
    def upstream_failures(self) -> int:
        return self._upstream_failures

    def stats(self) -> ProxyStats:
        """All counters at one instant (taken on the proxy's loop)."""
        if not self.running:
            return self._snapshot()
        return self._call(self._snapshot)

    def _snapshot(self) -> ProxyStats:
        return ProxyStats(
            mode=self._mode,
            bytes_to_target=self._bytes_to_target,
            bytes_to_client=self._bytes_to_client,
            connections_accepted=self._accepted,
            connections_refused=self._refused,
            connections_dropped=self._dropped,
            connections_active=len(self._connections),
            upstream_failures=self._upstream_failures,
        )

    # -- waiting ----------------------------------------------------------------------------

    def wait_until(
        self, condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition"
    ) -> None:
        """Block this thread until ``condition()`` holds; re-checked whenever a counter
        or the mode changes. Raises :class:`TimeoutError` after ``timeout`` s.

        Do not call it on a loop whose progress the condition depends on; use
        :meth:`wait_until_async` there.
        """
        deadline = time.monotonic() + timeout
        while True:
            with self._changed:
                seen = self._generation
            # Evaluated without the lock: the condition may itself call into the proxy.
            if condition():
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{self.name}: timed out after {timeout} s waiting for {what}")
            with self._changed:
                if self._generation == seen:
                    # Bounded, for conditions on things the proxy does not notify about.
                    self._changed.wait(min(remaining, 0.05))

    async def wait_until_async(
        self, condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition"
    ) -> None:
        """Like :meth:`wait_until` but polls without blocking the caller's event loop."""
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self.name}: timed out after {timeout} s waiting for {what}")
            await asyncio.sleep(0.01)

    def _notify(self) -> None:
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    # -- modes ------------------------------------------------------------------------------

    def pass_through(self) -> None:
        """Forward bytes both ways; releases everything held by a stall, in order."""
        self._call(self._apply_mode, Mode.PASS_THROUGH, None)

    def stall(self) -> None:
        """Keep connections open but forward nothing, until :meth:`pass_through`."""
        self._call(self._apply_mode, Mode.STALLED, None)

    def drop(self) -> None:
        """Reset every connection, and each new one at once, until :meth:`pass_through`."""
        self._call(self._apply_mode, Mode.DROPPING, None)

    def stall_for(self, seconds: float) -> None:
        """Stall now and pass through again after ``seconds`` (returns at once)."""
        self._call(self._apply_mode, Mode.STALLED, seconds)

    def drop_for(self, seconds: float) -> None:
        """Drop now and pass through again after ``seconds`` (returns at once)."""
        self._call(self._apply_mode, Mode.DROPPING, seconds)

    def _apply_mode(self, mode: Mode, revert_after: float | None) -> None:
        assert self._gate is not None and self._loop is not None
        if self._revert is not None:
            self._revert.cancel()
            self._revert = None
        self._mode = mode
        if mode is Mode.PASS_THROUGH:
            self._gate.set()
        else:
            self._gate.clear()
        if mode is Mode.DROPPING:
            for conn in list(self._connections):
                self._connections.discard(conn)  # gone now, though its task ends later
                if not conn.reset:
                    self._dropped += 1
                    conn.abort()
        if revert_after is not None:
            self._revert = self._loop.call_later(
                max(0.0, revert_after), self._apply_mode, Mode.PASS_THROUGH, None
            )
        self._notify()

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the proxy's loop and return its result."""
        loop = self._loop
        if loop is None or not self.running:
            raise RuntimeError(f"{self.name} is not running")
        if threading.current_thread() is self._thread:
            return fn(*args)
        result: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            try:
                result.set_result(fn(*args))
            except BaseException as exc:  # handed to the calling thread
                result.set_exception(exc)

        loop.call_soon_threadsafe(run)
        return result.result(_CALL_TIMEOUT)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the proxy's thread; returns once it listens (see :attr:`port`)."""
        if self._thread is not None:
            raise RuntimeError(f"{self.name} was already started")
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        try:
            self._port = self._started.result(_CALL_TIMEOUT)
        except BaseException:
            self._thread.join(_CALL_TIMEOUT)
            raise
        return self

    def stop(self, timeout: float = _CALL_TIMEOUT) -> None:
        """Reset all connections, close the listening socket and end the thread. Idempotent."""
        thread, loop, stop = self._thread, self._loop, self._stop_requested
        if thread is None or not thread.is_alive():
            return
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(stop.set)
        thread.join(timeout)
        if thread.is_alive():
            raise RuntimeError(f"{self.name} did not stop within {timeout} s")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = "not started"
        if self._port is not None:
            where = f"{self.address} -> {self.target_host}:{self.target_port}"
        return f"<FaultProxy {self.name} {where} {self._mode.value}>"

    # -- the proxy's thread -----------------------------------------------------------------

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported to start() or logged
            if not self._started.done():
                self._started.set_exception(exc)
            else:
                log.exception("%s: the proxy's loop failed", self.name)
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()
                self._notify()

    async def _serve(self) -> None:
        self._stop_requested = asyncio.Event()
        self._gate = asyncio.Event()
        if self._mode is Mode.PASS_THROUGH:
            self._gate.set()
        server = await self._listen()
        try:
            port = int(server.sockets[0].getsockname()[1])
            self._started.set_result(port)
            await self._stop_requested.wait()
        finally:
            server.close()
            if self._revert is not None:
                self._revert.cancel()
                self._revert = None
            for conn in list(self._connections):
                conn.abort()
            for task in list(self._handlers):
                task.cancel()
            if self._handlers:
                await asyncio.gather(*self._handlers, return_exceptions=True)
            await server.wait_closed()

    async def _listen(self) -> asyncio.Server:
        ports = self._listen_port
        if isinstance(ports, int):
            return await asyncio.start_server(self._handle, self.listen_host, ports, reuse_address=True)
        for port in random.sample(ports, min(len(ports), 100)):
            try:
                return await asyncio.start_server(self._handle, self.listen_host, port, reuse_address=True)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
        raise OSError(errno.EADDRINUSE, f"{self.name}: no free port in {ports.start}-{ports.stop - 1}")

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        self._accepted += 1
        conn = _Connection(writer)
        try:
            stopping = self._stop_requested is None or self._stop_requested.is_set()
            if self._mode is Mode.DROPPING or stopping:
                self._refused += 1
                conn.abort()
                return
            self._connections.add(conn)
            self._notify()
            await self._forward(conn, reader)
        except asyncio.CancelledError:
            conn.abort()
            raise
        finally:
            self._connections.discard(conn)
            self._handlers.discard(handler)
            if not conn.reset:
                with contextlib.suppress(asyncio.CancelledError):
                    await conn.close()
            self._notify()

    async def _forward(self, conn: _Connection, client_reader: asyncio.StreamReader) -> None:
        try:
            port = self.target_port
        except Exception:
            log.exception("%s: could not resolve the target port", self.name)
            port = None
        if port is None:
            self._upstream_failures += 1
            return
        try:
            target_reader, target_writer = await asyncio.open_connection(self.target_host, port)
        except OSError:
            self._upstream_failures += 1
            return
        conn.target_writer = target_writer
        if conn.reset:  # dropped while connecting
            _reset(target_writer)
            return
        client_writer = conn.client_writer
        conn.pumps = {
            asyncio.create_task(self._pump(conn, client_reader, target_writer, to_target=True)),
            asyncio.create_task(self._pump(conn, target_reader, client_writer, to_target=False)),
        }
        try:
            await asyncio.wait(conn.pumps)
        finally:
            for task in conn.pumps:
                task.cancel()
            await asyncio.gather(*conn.pumps, return_exceptions=True)

    async def _pump(
        self,
        conn: _Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        to_target: bool,
    ) -> None:
        gate = self._gate
        assert gate is not None
        try:
            while True:
                data = await reader.read(_CHUNK)
                # Stalled: hold this chunk (or the end of stream) and read no more. The write
                # below follows the last is_set() check without a yield in between, so a stall
                # applied on this loop is never overtaken (the gate may close again between
                # being set and this task waking up, hence the loop).
                while not gate.is_set():
                    await gate.wait()
                if conn.reset:
                    return
                if not data:
                    if writer.can_write_eof() and not writer.transport.is_closing():
                        writer.write_eof()
                    return
                writer.write(data)
                if to_target:
                    self._bytes_to_target += len(data)
                else:
                    self._bytes_to_client += len(data)
                self._notify()
                await writer.drain()
        except OSError:  # reset by peer, broken pipe: pass the failure on to the other side
            conn.abort()
        except Exception:
            log.exception("%s: forwarding failed", self.name)
            conn.abort()


# -- Kafka ------------------------------------------------------------------------------------


@dataclass
class ProxiedKafka:
    """A dedicated broker whose every client connection goes through ``proxy``."""

    proxy: FaultProxy
    broker: KafkaBroker

    @property
    def bootstrap(self) -> str:
        """The proxy's address: use it as ``bootstrap.servers``."""
        return self.proxy.address


@contextlib.contextmanager
def proxied_kafka(
    properties: Mapping[str, object] | None = None,
    *,
    make_proxy: Callable[[Callable[[], int | None]], FaultProxy] | None = None,
    **broker_kwargs: Any,
) -> Iterator[ProxiedKafka]:
    """Start a proxy, then a broker advertising the proxy's address; yield both.

    The broker listens on its own free port (``broker.port``) and its KRaft
    controller listener is left as :class:`~tests.support.kafka_broker.KafkaBroker`
    configures it; only ``advertised.listeners`` (the PLAINTEXT listener clients
    are told to use) names the proxy. The proxy asks the broker for its real port
    on each connection, so it follows the broker through start-up retries.

    ``properties`` and ``broker_kwargs`` go to ``KafkaBroker``. ``make_proxy(broker_port)``,
    if given, builds the (unstarted) proxy from the callable that names the broker's port, for
    a proxy of another kind (e.g. :class:`tests.support.late_broker.LateProxy`).
    """
    from tests.support.kafka_broker import KafkaBroker

    props = dict(properties or {})
    if "advertised.listeners" in props:
        raise ValueError("proxied_kafka sets advertised.listeners itself")
    broker: KafkaBroker | None = None

    def broker_port() -> int | None:
        return None if broker is None else broker.port

    if make_proxy is None:
        proxy = FaultProxy("127.0.0.1", broker_port, name="kafka-fault-proxy")
    else:
        proxy = make_proxy(broker_port)
    with proxy:
        props["advertised.listeners"] = f"PLAINTEXT://{proxy.address}"
        broker = KafkaBroker(properties=props, **broker_kwargs)
        with broker:
            yield ProxiedKafka(proxy=proxy, broker=broker)
