"""The console's Python REPL, on a Unix socket that only this user can reach.

aiomonitor's own ``console`` command serves aioconsole's REPL on a TCP port
(``monitor.console.port``) and proxies the telnet session to it, so while a session
runs any local user could connect to that port and run code without the token.
Here the REPL listens on a Unix socket in a fresh 0700 directory, for one session:
the server runs on the monitored loop (where the application's objects live), the
proxy on the console's loop, and both are gone when the session ends.

The monitored loop is aiomonitor's asyncio loop object and aioconsole serves on it with
asyncio's server API, so reaching it uses asyncio's; the proxy itself is anyio's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import aioconsole
import anyio
import anyio.abc
from prompt_toolkit import PromptSession
from prompt_toolkit.input.base import Input
from prompt_toolkit.output.base import Output

T = TypeVar("T")

_CTRL_C = b"\x03"


async def run_repl(terminal_in: Input, terminal_out: Output, namespace: dict[str, Any],
                   monitored_loop: asyncio.AbstractEventLoop) -> None:  # aiomonitor's loop object
    """One REPL session between a telnet terminal and ``namespace``, until Ctrl+D or ``exit()``."""
    directory = tempfile.mkdtemp(prefix="streamloop-repl-")  # 0700, this user's
    path = os.path.join(directory, "repl.sock")

    async def serve() -> asyncio.AbstractServer:  # aioconsole's server type
        def console(streams: Any = None) -> aioconsole.AsynchronousConsole:
            return aioconsole.AsynchronousConsole(streams=streams, locals=namespace, loop=monitored_loop)

        server: asyncio.AbstractServer = await aioconsole.start_interactive_server(console, path=path)  # aioconsole
        return server

    try:
        server = await _on(monitored_loop, serve)
        try:
            async with await anyio.connect_unix(path) as stream:
                await _pump(terminal_in, terminal_out, stream)
        finally:
            async def stop() -> None:
                server.close()
                await server.wait_closed()

            await _on(monitored_loop, stop)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def _on(loop: asyncio.AbstractEventLoop, make: Callable[[], Coroutine[Any, Any, T]]) -> T:  # aiomonitor's
    """Run ``make()`` on ``loop`` (another thread's) and wait for it here, without blocking this loop.

    anyio's way in (``from_thread.run``) needs a token taken on that loop and blocks a thread while it
    waits; aiomonitor hands over only the asyncio loop object, whose thread-safe future is awaitable.
    """
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(make(), loop))  # see above


async def _pump(terminal_in: Input, terminal_out: Output, stream: anyio.abc.ByteStream) -> None:
    """Lines typed go to the REPL, what it prints goes to the terminal; ends when either side does."""
    # A side that ends by a closed or broken connection ends the session quietly, as at EOF.
    gone = (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)

    async def typed() -> None:
        session: PromptSession[str] = PromptSession(input=terminal_in, output=terminal_out)
        while True:
            try:
                line = await session.prompt_async("")
            except KeyboardInterrupt:
                await stream.send(_CTRL_C)
            except EOFError:
                return
            else:
                await stream.send(line.encode() + b"\n")

    async def printed() -> None:
        while True:
            chunk = await stream.receive(4096)
            terminal_out.write_raw(chunk.decode(errors="replace"))
            terminal_out.flush()

    async with anyio.create_task_group() as group:
        async def until_done(side: Callable[[], Coroutine[Any, Any, None]]) -> None:
            with contextlib.suppress(*gone):
                await side()
            group.cancel_scope.cancel()

        group.start_soon(until_done, typed)
        group.start_soon(until_done, printed)
