"""The loopback fault proxy (tests/support/fault_proxy.py) against a plain asyncio echo server."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import pytest_asyncio

from streamloop.testing import eventually_async
from tests.support.fault_proxy import FaultProxy, Mode

pytestmark = pytest.mark.asyncio

DEADLINE = 5.0
# How long a negative check ("nothing arrives while stalled") watches. Not a wait for
# something to happen: those all poll a condition under DEADLINE.
QUIET = 0.2


class EchoServer:
    """Echoes every byte back; records what it received; closes on end of stream."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.open_connections = 0
        self.connections = 0
        self.replying = asyncio.Event()  # clear it to hold the replies back
        self.replying.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        self.connections += 1
        self.open_connections += 1
        try:
            while data := await reader.read(65536):
                self.received += data
                await self.replying.wait()
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            self.open_connections -= 1
            self._tasks.discard(task)
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()


@pytest_asyncio.fixture
async def echo() -> AsyncIterator[EchoServer]:
    server = EchoServer()
    await server.start()
    try:
        yield server
    finally:
        await server.close()


@pytest.fixture
def proxy(echo: EchoServer) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", echo.port) as p:
        yield p


@contextlib.asynccontextmanager
async def connect(
    proxy: FaultProxy,
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", proxy.port), DEADLINE
    )
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def wait_until(condition: Callable[[], bool], what: str) -> None:
    await eventually_async(condition, timeout=DEADLINE, what=what)


async def read_exactly(reader: asyncio.StreamReader, n: int) -> bytes:
    return await asyncio.wait_for(reader.readexactly(n), DEADLINE)


async def read_until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything until EOF; a reset counts as the end too."""
    data = bytearray()
    with contextlib.suppress(ConnectionError):
        async with asyncio.timeout(DEADLINE):
            while chunk := await reader.read(65536):
                data += chunk
    return bytes(data)


async def assert_reset_on_connect(proxy: FaultProxy) -> None:
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", proxy.port), DEADLINE
        )
    except ConnectionResetError:
        return
    try:
        with contextlib.suppress(ConnectionError):
            writer.write(b"anyone?")
            await writer.drain()
        assert await read_until_closed(reader) == b""
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def assert_nothing_arrives(reader: asyncio.StreamReader) -> None:
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.read(1), QUIET)


# -- pass through -----------------------------------------------------------------------


async def test_bytes_pass_through_and_are_counted(proxy: FaultProxy, echo: EchoServer) -> None:
    assert proxy.address == f"127.0.0.1:{proxy.port}"
    assert proxy.mode is Mode.PASS_THROUGH
    async with connect(proxy) as (reader, writer):
        writer.write(b"hello")
        assert await read_exactly(reader, 5) == b"hello"
        await wait_until(lambda: proxy.bytes_to_client == 5, "the echo to be counted")
        stats = proxy.stats()
        assert stats.bytes_to_target == 5
        assert stats.bytes_to_client == 5
        assert stats.connections_accepted == 1
        assert stats.connections_active == 1
        assert stats.connections_refused == stats.connections_dropped == 0
    await wait_until(lambda: proxy.connections_active == 0, "the connection to close")
    await wait_until(lambda: echo.open_connections == 0, "the server side to close")


async def test_a_megabyte_each_way_arrives_intact(proxy: FaultProxy) -> None:
    payload = os.urandom(1 << 20)
    async with connect(proxy) as (reader, writer):
        writer.write(payload)
        drain = asyncio.ensure_future(writer.drain())
        assert await read_exactly(reader, len(payload)) == payload
        await drain
    assert proxy.bytes_to_target == proxy.bytes_to_client == len(payload)


async def test_concurrent_connections_stay_apart(proxy: FaultProxy) -> None:
    async def roundtrip(i: int) -> bytes:
        async with connect(proxy) as (reader, writer):
            payload = f"connection-{i};".encode() * 1000
            writer.write(payload)
            return await read_exactly(reader, len(payload))

    replies = await asyncio.gather(*(roundtrip(i) for i in range(20)))
    assert replies == [f"connection-{i};".encode() * 1000 for i in range(20)]
    assert proxy.connections_accepted == 20


async def test_end_of_stream_is_forwarded(proxy: FaultProxy, echo: EchoServer) -> None:
    async with connect(proxy) as (reader, writer):
        writer.write(b"last words")
        writer.write_eof()
        # The echo server closes on end of stream; that end comes back through the proxy.
        assert await read_until_closed(reader) == b"last words"
    await wait_until(lambda: proxy.connections_active == 0, "the proxy to close the connection")


# -- stall ------------------------------------------------------------------------------


async def test_stall_holds_bytes_and_releases_them_in_order(
    proxy: FaultProxy, echo: EchoServer
) -> None:
    async with connect(proxy) as (reader, writer):
        writer.write(b"before;")
        assert await read_exactly(reader, 7) == b"before;"
        proxy.stall()
        assert proxy.mode is Mode.STALLED
        parts = [b"one;", b"two;", b"three;"]
        for part in parts:
            writer.write(part)
            await writer.drain()
        await assert_nothing_arrives(reader)
        assert bytes(echo.received) == b"before;"
        assert proxy.bytes_to_target == 7
        assert proxy.connections_active == 1  # still open

        proxy.pass_through()
        expected = b"".join(parts)
        assert await read_exactly(reader, len(expected)) == expected
        assert bytes(echo.received) == b"before;" + expected


async def test_stall_holds_both_directions_and_applies_backpressure(
    proxy: FaultProxy, echo: EchoServer
) -> None:
    chunk = os.urandom(1 << 20)
    sent = bytearray()
    async with connect(proxy) as (reader, writer):
        proxy.stall()
        # Write until the writer is pushed back on. How much the kernel's socket buffers
        # absorb first depends on the machine (loopback buffers grow to several MiB).
        drain: asyncio.Future[None] | None = None
        while len(sent) < (64 << 20):
            writer.write(chunk)
            sent += chunk
            drain = asyncio.ensure_future(writer.drain())
            done, _ = await asyncio.wait({drain}, timeout=0.05)
            if not done:
                break
        assert drain is not None and not drain.done(), "the stall never pushed back"
        await assert_nothing_arrives(reader)
        assert len(echo.received) == 0

        proxy.pass_through()
        assert await read_exactly(reader, len(sent)) == sent
        await asyncio.wait_for(drain, DEADLINE)
        assert bytes(echo.received) == sent


async def test_server_replies_are_held_too(proxy: FaultProxy, echo: EchoServer) -> None:
    async with connect(proxy) as (reader, writer):
        echo.replying.clear()
        writer.write(b"ping")
        await wait_until(lambda: echo.received == b"ping", "the request to reach the server")
        proxy.stall()
        echo.replying.set()
        await assert_nothing_arrives(reader)
        assert proxy.bytes_to_client == 0
        proxy.pass_through()
        assert await read_exactly(reader, 4) == b"ping"


async def test_connections_opened_during_a_stall_are_held(
    proxy: FaultProxy, echo: EchoServer
) -> None:
    proxy.stall()
    async with connect(proxy) as (reader, writer):
        writer.write(b"new")
        await wait_until(lambda: proxy.connections_active == 1, "the connection to be accepted")
        await assert_nothing_arrives(reader)
        assert echo.received == b""
        proxy.pass_through()
        assert await read_exactly(reader, 3) == b"new"
    assert proxy.connections_accepted == 1


async def test_end_of_stream_is_held_by_a_stall(proxy: FaultProxy, echo: EchoServer) -> None:
    async with connect(proxy) as (reader, writer):
        await wait_until(lambda: echo.open_connections == 1, "the server side to open")
        proxy.stall()
        writer.write(b"bye")
        writer.write_eof()
        await assert_nothing_arrives(reader)
        assert echo.open_connections == 1
        proxy.pass_through()
        assert await read_until_closed(reader) == b"bye"
    await wait_until(lambda: echo.open_connections == 0, "the server side to close")


async def test_stall_for_resumes_by_itself(proxy: FaultProxy) -> None:
    async with connect(proxy) as (reader, writer):
        proxy.stall_for(0.3)
        started = time.monotonic()
        writer.write(b"later")
        assert await read_exactly(reader, 5) == b"later"
        assert time.monotonic() - started >= 0.25
        assert proxy.mode is Mode.PASS_THROUGH


async def test_an_explicit_mode_change_cancels_the_pending_resume(proxy: FaultProxy) -> None:
    async with connect(proxy) as (reader, writer):
        proxy.stall_for(0.05)
        proxy.stall()  # stays stalled until told otherwise
        writer.write(b"x")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.read(1), 0.05 + QUIET)
        assert proxy.mode is Mode.STALLED
        proxy.pass_through()
        assert await read_exactly(reader, 1) == b"x"


# -- drop -------------------------------------------------------------------------------


async def test_drop_resets_connections_and_new_ones_until_pass_through(
    proxy: FaultProxy, echo: EchoServer
) -> None:
    async with connect(proxy) as (reader, writer):
        writer.write(b"hi")
        assert await read_exactly(reader, 2) == b"hi"
        proxy.drop()
        assert proxy.mode is Mode.DROPPING
        assert await read_until_closed(reader) == b""
    assert proxy.connections_dropped == 1
    assert proxy.connections_active == 0
    await wait_until(lambda: echo.open_connections == 0, "the server side to be reset")

    # While dropping, the port accepts and resets at once: depending on how quickly the reset
    # comes, the client's connect fails with ECONNRESET or the connection yields nothing.
    await assert_reset_on_connect(proxy)
    await wait_until(lambda: proxy.connections_refused == 1, "the refusal to be counted")
    assert echo.connections == 1  # the server never saw it

    proxy.pass_through()
    async with connect(proxy) as (reader, writer):
        writer.write(b"back")
        assert await read_exactly(reader, 4) == b"back"
    stats = proxy.stats()
    assert stats.connections_accepted == 3
    assert stats.connections_refused == 1
    assert stats.connections_dropped == 1
    assert echo.connections == 2


async def test_drop_discards_what_a_stall_held(proxy: FaultProxy, echo: EchoServer) -> None:
    async with connect(proxy) as (reader, writer):
        writer.write(b"kept;")
        assert await read_exactly(reader, 5) == b"kept;"
        proxy.stall()
        writer.write(b"lost;")
        await writer.drain()
        proxy.drop()
        assert await read_until_closed(reader) == b""
    proxy.pass_through()
    async with connect(proxy) as (reader, writer):
        writer.write(b"new;")
        assert await read_exactly(reader, 4) == b"new;"
    assert bytes(echo.received) == b"kept;new;"


async def test_drop_for_resumes_by_itself(proxy: FaultProxy) -> None:
    proxy.drop_for(0.2)
    await wait_until(lambda: proxy.mode is Mode.PASS_THROUGH, "the drop to end")
    async with connect(proxy) as (reader, writer):
        writer.write(b"ok")
        assert await read_exactly(reader, 2) == b"ok"


# -- threads, lifecycle, target -----------------------------------------------------------


async def test_modes_switch_from_other_threads_while_the_callers_loop_is_blocked(
    proxy: FaultProxy,
) -> None:
    async with connect(proxy) as (reader, writer):
        proxy.stall()
        writer.write(b"abc")
        await writer.drain()
        switcher = threading.Thread(target=proxy.pass_through)
        switcher.start()
        # Block this loop (the echo server's too): the proxy runs on its own thread and
        # forwards meanwhile.
        proxy.wait_until(lambda: proxy.bytes_to_target == 3, DEADLINE, "the bytes to pass")
        switcher.join(DEADLINE)
        assert await read_exactly(reader, 3) == b"abc"
        await asyncio.to_thread(proxy.drop)
        assert await read_until_closed(reader) == b""


async def test_wait_until_raises_on_timeout(proxy: FaultProxy) -> None:
    with pytest.raises(TimeoutError, match="nothing"):
        proxy.wait_until(lambda: False, 0.05, "nothing")
    with pytest.raises(TimeoutError, match="nothing"):
        await proxy.wait_until_async(lambda: False, 0.05, "nothing")


async def test_stop_closes_every_connection(echo: EchoServer) -> None:
    proxy = FaultProxy("127.0.0.1", echo.port).start()
    async with connect(proxy) as (reader, writer):
        writer.write(b"x")
        assert await read_exactly(reader, 1) == b"x"
        proxy.stall()
        await asyncio.to_thread(proxy.stop)
        assert not proxy.running
        assert await read_until_closed(reader) == b""
        proxy.stop()  # idempotent
    await wait_until(lambda: echo.open_connections == 0, "the server side to close")
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", proxy.port)
    with pytest.raises(RuntimeError, match="not running"):
        proxy.stall()


async def test_unreachable_target_closes_the_client() -> None:
    async with await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0) as server:
        port = int(server.sockets[0].getsockname()[1])
    # Nothing listens on `port` now.
    with FaultProxy("127.0.0.1", port) as proxy:
        async with connect(proxy) as (reader, _writer):
            assert await read_until_closed(reader) == b""
        await wait_until(lambda: proxy.upstream_failures == 1, "the failure to be counted")


async def test_target_port_may_be_resolved_per_connection(echo: EchoServer) -> None:
    target: list[int | None] = [None]
    with FaultProxy("127.0.0.1", lambda: target[0]) as proxy:
        async with connect(proxy) as (reader, _writer):
            assert await read_until_closed(reader) == b""  # no target yet
        target[0] = echo.port
        async with connect(proxy) as (reader, writer):
            writer.write(b"found")
            assert await read_exactly(reader, 5) == b"found"
        assert proxy.upstream_failures == 1


async def test_start_fails_when_the_port_is_taken(proxy: FaultProxy, echo: EchoServer) -> None:
    other = FaultProxy("127.0.0.1", echo.port, listen_port=proxy.port)
    with pytest.raises(OSError):
        other.start()
    assert not other.running


async def test_only_loopback_addresses_are_accepted() -> None:
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy("10.1.2.3", 9092)
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy("127.0.0.1", 9092, listen_host="0.0.0.0")
    FaultProxy("localhost", 9092, listen_host="::1")  # not started: nothing to clean up
