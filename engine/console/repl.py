"""The console's Python REPL, on a Unix socket that only this user can reach.

aiomonitor's own ``console`` command serves aioconsole's REPL on a TCP port
(``monitor.console.port``) and proxies the telnet session to it, so while a session
runs any local user could connect to that port and run code without the token.
Here the REPL listens on a Unix socket in a fresh 0700 directory, for one session:
the server runs on the monitored loop (where the application's objects live), the
proxy on the console's loop, and both are gone when the session ends.
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
from prompt_toolkit import PromptSession
from prompt_toolkit.input.base import Input
from prompt_toolkit.output.base import Output

T = TypeVar("T")

_CTRL_C = b"\x03"


async def run_repl(terminal_in: Input, terminal_out: Output, namespace: dict[str, Any],
                   monitored_loop: asyncio.AbstractEventLoop) -> None:
    """One REPL session between a telnet terminal and ``namespace``, until Ctrl+D or ``exit()``."""
    directory = tempfile.mkdtemp(prefix="streamloop-repl-")  # 0700, this user's
    path = os.path.join(directory, "repl.sock")

    async def serve() -> asyncio.AbstractServer:
        def console(streams: Any = None) -> aioconsole.AsynchronousConsole:
            return aioconsole.AsynchronousConsole(streams=streams, locals=namespace, loop=monitored_loop)

        server: asyncio.AbstractServer = await aioconsole.start_interactive_server(console, path=path)
        return server

    try:
        server = await _on(monitored_loop, serve)
        try:
            reader, writer = await asyncio.open_unix_connection(path)
            try:
                await _pump(terminal_in, terminal_out, reader, writer)
            finally:
                writer.close()
                with contextlib.suppress(ConnectionError):
                    await writer.wait_closed()
        finally:
            async def stop() -> None:
                server.close()
                await server.wait_closed()

            await _on(monitored_loop, stop)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def _on(loop: asyncio.AbstractEventLoop, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``make()`` on ``loop`` (another thread's) and wait for it here."""
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(make(), loop))


async def _pump(terminal_in: Input, terminal_out: Output, reader: asyncio.StreamReader,
                writer: asyncio.StreamWriter) -> None:
    """Lines typed go to the REPL, what it prints goes to the terminal; ends when either side does."""

    async def typed() -> None:
        session: PromptSession[str] = PromptSession(input=terminal_in, output=terminal_out)
        while True:
            try:
                line = await session.prompt_async("")
            except KeyboardInterrupt:
                writer.write(_CTRL_C)
            except EOFError:
                return
            else:
                writer.write(line.encode() + b"\n")
            await writer.drain()

    async def printed() -> None:
        while chunk := await reader.read(4096):
            terminal_out.write_raw(chunk.decode(errors="replace"))
            terminal_out.flush()

    tasks = [asyncio.ensure_future(typed()), asyncio.ensure_future(printed())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
