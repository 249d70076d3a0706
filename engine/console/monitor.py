# click and aiomonitor ship no type hints: their command decorators are untyped.
# mypy: disallow-untyped-decorators=False
"""The aiomonitor console of a running client: aiomonitor's commands plus ours.

``streamloop run --monitor`` opens it on ``monitor.host:monitor.port`` (telnet,
loopback by default); aiomonitor watches the runner's event loop (the one that
supervises the client: signals, close) and serves its terminal UI from a thread
of its own. Our commands run there too:

    threads                    name, state, tasks and cache share of each stream thread
    tasks                      each task: thread, partitions, running/paused/retrying, committed, lag
    paused                     the paused tasks and the record each one stopped at
    resume TASK [--skip]       resume a paused task (from the failed record, or after it)
    add-thread                 start one more stream thread
    remove-thread              stop one stream thread (it commits and leaves the group)
    metrics [FILTER]           metrics() in Kafka's shape: group, name, tags, value
    config [FILTER]            the client's config, secrets shown as [hidden]
    topology                   the topology description
    console                    the Python REPL (replaces aiomonitor's: no TCP port, see repl.py)

Reading commands only take snapshots. Changing commands call the client's own
loop-safe methods on a worker thread (``anyio.to_thread.run_sync``), bounded by
``_COMMAND_TIMEOUT_S``, so neither the console nor any stream thread waits on the other.

The console runs arbitrary code, so it is guarded (``streamloop.console.access``): loopback
unless ``monitor.host`` says otherwise and ``monitor.token`` is set, the token asked for
before the first command and required by the web UI, and the Python REPL on a private
Unix socket, whatever ``monitor.host``.

aiomonitor is built on asyncio's own objects (the loop it watches, its task sets, its
futures), so the code that stands in for aiomonitor's UI thread uses them too; our own
waits (command timeouts, the log-in prompt, worker threads) are anyio's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread

from streamloop import config as cfg
from streamloop.client import KafkaStreams
from streamloop.console import views
from streamloop.errors import ConfigError, MissingExtraError

try:
    import click
    import janus
    from aiohttp import web
    from aiomonitor import Monitor
    from aiomonitor.context import command_done
    from aiomonitor.termui.commands import (
        auto_async_command_done,
        auto_command_done,
        custom_help_option,
        interact,
        monitor_cli,
    )
    from aiomonitor.webui.app import init_webui
    from prompt_toolkit import PromptSession
    from prompt_toolkit.application.current import get_app_session
    from prompt_toolkit.contrib.telnet.server import TelnetConnection, TelnetServer

    from streamloop.console.access import check_bind, token_matches, web_guard
    from streamloop.console.repl import run_repl
except ImportError as exc:  # the 'monitor' extra is optional
    raise MissingExtraError("The console (--monitor)", "monitor", "aiomonitor") from exc

log = logging.getLogger(__name__)

_COMMAND_TIMEOUT_S = 30.0
_LOG_IN_TIMEOUT_S = 60.0
LOOPBACK = "127.0.0.1"


class StreamsMonitor(Monitor):  # type: ignore[misc]  # aiomonitor is untyped
    """An aiomonitor ``Monitor`` that knows the client its commands act on, guarded by ``token``.

    The telnet console and the web UI listen on ``host``. The Python REPL of the ``console``
    command listens on no port at all (``streamloop.console.repl``: a private Unix socket);
    aiomonitor's own host stays loopback in case any of its code still opens one.
    """

    # aiomonitor's Monitor watches an asyncio loop object.
    def __init__(self, streams: KafkaStreams, loop: asyncio.AbstractEventLoop, *, host: str = LOOPBACK,
                 token: str | None = None, **kwargs: Any) -> None:
        super().__init__(loop, host=LOOPBACK, **kwargs)
        self.streams = streams
        self.bind_host = host
        self.token = token
        self.prompt = "streamloop >>> "
        self.ui_error: BaseException | None = None
        self.webui_address: tuple[str, int] | None = None
        """Where the web UI listens, once started."""

    def _ui_main(self) -> None:
        try:
            with asyncio.Runner(loop_factory=_ConsoleLoop) as runner:  # aiomonitor's UI thread needs this loop class
                runner.run(self._ui_main_async())
        except BaseException as exc:  # handed to open_monitor
            # aiomonitor's start() waits for its UI thread to say it started; a UI that fails
            # to start (a port in use) would leave it waiting forever.
            self.ui_error = exc
            self._ui_started.set()

    async def _ui_main_async(self) -> None:
        """The UI thread's main: aiomonitor's telnet console and web UI, each behind the guard.

        aiomonitor 0.7 creates both servers inside its own ``_ui_main_async`` and offers no hook
        for either, so this one replaces it: the same servers and task bookkeeping, plus the
        token prompt (``_interact``) and the web guard. The web UI's socket is not shared
        (no ``reuse_port``, which would let another process of this user bind the same port).
        """
        loop = asyncio.get_running_loop()  # aiomonitor keeps the UI loop and creates tasks on it
        self._ui_loop = loop
        self._ui_forever_future = loop.create_future()
        self._termination_info_queue: janus.Queue[Any] = janus.Queue()
        self._cancellation_chain_queue: janus.Queue[Any] = janus.Queue()
        self._ui_termination_handler_task = loop.create_task(self._ui_handle_termination_updates())
        self._ui_cancellation_handler_task = loop.create_task(self._ui_handle_cancellation_updates())
        background = [self._ui_termination_handler_task, self._ui_cancellation_handler_task]
        app = await init_webui(self)
        app.middlewares.append(web_guard(self.bind_host, self.token))
        runner = web.AppRunner(app)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.bind_host, self._webui_port).start()
            self.webui_address = tuple(runner.addresses[0][:2])
            telnet = TelnetServer(host=self.bind_host, port=self._termui_port, interact=self._interact)
            listening = asyncio.Event()  # set by prompt_toolkit's ready_cb, raced with the server's task below
            background.append(loop.create_task(telnet.run(ready_cb=listening.set)))
            ready = loop.create_task(listening.wait())
            # aiomonitor's tasks are asyncio tasks (its bookkeeping cancels them), so they are raced as such.
            await asyncio.wait([background[-1], ready], return_when=asyncio.FIRST_COMPLETED)
            ready.cancel()
            if background[-1].done():
                background[-1].result()  # the telnet server could not listen: raise why
            self._ui_started.set()
            with contextlib.suppress(asyncio.CancelledError):  # aiomonitor cancels its forever-future to stop
                await self._ui_forever_future
        finally:
            sessions = list(self._termui_tasks)
            for task in sessions + background:
                task.cancel()
            await asyncio.gather(*sessions, *background, return_exceptions=True)  # aiomonitor's asyncio tasks
            await runner.cleanup()

    async def _interact(self, connection: TelnetConnection) -> None:
        """One telnet session: the token first when one is set, then aiomonitor's prompt."""
        if self.token is not None and not await self._log_in(connection, self.token):
            return
        await interact(self, connection)

    async def _log_in(self, connection: TelnetConnection, token: str) -> bool:
        """Ask for the token (not echoed); False, after saying so, for anything else or none in time."""
        session: PromptSession[str] = PromptSession()
        typed: str | None = None
        with anyio.move_on_after(_LOG_IN_TIMEOUT_S), contextlib.suppress(EOFError, KeyboardInterrupt):
            typed = await session.prompt_async("token: ", is_password=True)
        if token_matches(None if typed is None else typed.strip(), token):
            return True
        log.warning("Refused a console session from %s: wrong or no monitor.token", connection.addr[0])
        print("wrong token: closing the connection", file=connection.stdout)
        return False


class _ConsoleLoop(asyncio.SelectorEventLoop):  # a loop class: what prompt_toolkit's handler swap needs fixing on
    """The console's event loop, which keeps asyncio's own exception handler (it logs).

    prompt_toolkit swaps in a handler that prints the error into the telnet session and
    waits for Enter. When a client resets its connection, the reset is such an error, the
    wait fails at once on the closed input, and that failure is one again: the loop
    would spin printing to nobody, and the runner could not close the console.
    """

    def set_exception_handler(self, handler: Any) -> None:
        if handler is None:
            super().set_exception_handler(None)


def open_monitor(streams: KafkaStreams, loop: asyncio.AbstractEventLoop) -> StreamsMonitor:  # aiomonitor's loop
    """Start the console for ``streams``, watching ``loop``; ports, host and token from the client's config.

    Close it with ``close()``. The Python REPL (aiomonitor's ``console``) sees ``streams`` and
    ``config`` (secrets hidden). Raises ``ConfigError`` for ``monitor.token`` when ``monitor.host``
    is off loopback and no token is set, and for a port that cannot be listened on.
    """
    config = streams.config
    check_bind(config)
    host = config[cfg.MONITOR_HOST]
    _check_free(host, config[cfg.MONITOR_PORT], cfg.MONITOR_PORT)
    monitor = StreamsMonitor(
        streams, loop,
        host=host,
        token=config[cfg.MONITOR_TOKEN],
        termui_port=config[cfg.MONITOR_PORT],
        webui_port=config[cfg.MONITOR_WEBUI_PORT],
        # The REPL gets the config with secrets hidden; streams.config still reads them (the REPL
        # runs arbitrary code, which is why the console wants the token).
        locals={"__name__": "__console__", "__doc__": None, "streams": streams,
                "config": config.shown_values()},
    )
    monitor.start()
    if monitor.ui_error is not None:
        raise ConfigError(cfg.MONITOR_WEBUI_PORT, f"aiomonitor's web UI could not start on "
                          f"{host}:{config[cfg.MONITOR_WEBUI_PORT]}: {monitor.ui_error}") from monitor.ui_error
    log.info("Console at telnet://%s:%d%s and http://%s:%d (commands: threads, tasks, paused, resume, add-thread, "
             "remove-thread, metrics, config, topology)", host, config[cfg.MONITOR_PORT],
             " (token required)" if monitor.token is not None else "", host,
             monitor.webui_address[1] if monitor.webui_address else config[cfg.MONITOR_WEBUI_PORT])
    return monitor


def _check_free(host: str, port: int, key: str) -> None:
    """aiomonitor binds the console's port on a task of its own and only logs a failure: check first."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
    except OSError as exc:
        raise ConfigError(key, f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    finally:
        probe.close()


def _streams(ctx: click.Context) -> KafkaStreams:
    streams: KafkaStreams = ctx.obj.streams
    return streams


def _echo(text: str) -> None:
    click.echo(text)


def _in_background(ctx: click.Context, action: Callable[[], Awaitable[str]]) -> None:
    """Run a command that waits (for a stream thread) as a task of the console's own loop."""
    monitor: StreamsMonitor = ctx.obj

    @auto_async_command_done
    async def run(_ctx: click.Context) -> None:
        try:
            with anyio.fail_after(_COMMAND_TIMEOUT_S):
                answer = await action()
            _echo(answer)
        except TimeoutError:
            _echo(f"no answer within {_COMMAND_TIMEOUT_S:.0f} s")
        except Exception as exc:  # a failed command is shown, the console goes on
            _echo(f"failed: {exc!r}")

    task = monitor._ui_loop.create_task(run(ctx))
    monitor._termui_tasks.add(task)


def _waiting_help_option(command: Callable[..., None]) -> Callable[..., None]:
    """``--help`` for a command that answers from a task: aiomonitor's own help option marks
    the command done even when ``--help`` is absent, which would show the next prompt before
    the answer."""

    def show_help(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
        if value:
            click.echo(ctx.get_help())
            command_done.get().set()
            ctx.exit()

    return click.option("--help", is_flag=True, expose_value=False, is_eager=True, callback=show_help,
                        help="Show the help message")(command)


@monitor_cli.command(name="threads")
@custom_help_option
@auto_command_done
def do_threads(ctx: click.Context) -> None:
    """Stream threads: name, state, tasks, cache size"""
    _echo(views.threads_view(_streams(ctx)))


@monitor_cli.command(name="tasks")
@custom_help_option
@auto_command_done
def do_tasks(ctx: click.Context) -> None:
    """Tasks: thread, partitions, state, committed offsets, lag"""
    _echo(views.tasks_view(_streams(ctx)))


@monitor_cli.command(name="paused")
@custom_help_option
@auto_command_done
def do_paused(ctx: click.Context) -> None:
    """Tasks paused by an error handler"""
    _echo(views.paused_view(_streams(ctx)))


@monitor_cli.command(name="resume")
@click.argument("task")
@click.option("--skip", is_flag=True, help="go on after the failed record instead of retrying it")
@_waiting_help_option
def do_resume(ctx: click.Context, task: str, skip: bool) -> None:
    """Resume a paused task (e.g. resume 0_1 --skip)"""
    streams = _streams(ctx)

    async def resume() -> str:
        if await anyio.to_thread.run_sync(streams.resume, task, skip):
            return f"resumed {task}" + (" after the failed record" if skip else " from the failed record")
        return f"task {task} is not paused here"

    _in_background(ctx, resume)


@monitor_cli.command(name="add-thread")
@_waiting_help_option
def do_add_thread(ctx: click.Context) -> None:
    """Start one more stream thread"""
    streams = _streams(ctx)

    async def add() -> str:
        name = await anyio.to_thread.run_sync(streams.add_stream_thread)
        return f"added {name}" if name else f"no thread added: the client is {streams.state.name}"

    _in_background(ctx, add)


@monitor_cli.command(name="remove-thread")
@_waiting_help_option
def do_remove_thread(ctx: click.Context) -> None:
    """Stop one stream thread (it commits and leaves the group)"""
    streams = _streams(ctx)

    async def remove() -> str:
        name = await anyio.to_thread.run_sync(streams.remove_stream_thread, _COMMAND_TIMEOUT_S)
        return f"removed {name}" if name else "no stream thread to remove"

    _in_background(ctx, remove)


@monitor_cli.command(name="metrics")
@click.argument("name_filter", required=False, default="")
@custom_help_option
@auto_command_done
def do_metrics(ctx: click.Context, name_filter: str) -> None:
    """Metrics: group, name, tags, value (optionally only names or groups containing FILTER)"""
    _echo(views.metrics_view(_streams(ctx), name_filter))


@monitor_cli.command(name="config")
@click.argument("name_filter", required=False, default="")
@custom_help_option
@auto_command_done
def do_config(ctx: click.Context, name_filter: str) -> None:
    """The client's config (optionally only keys containing FILTER); secrets are shown as [hidden]"""
    _echo(views.config_view(_streams(ctx), name_filter))


@monitor_cli.command(name="console")
@_waiting_help_option
def do_console(ctx: click.Context) -> None:
    """Switch to the Python REPL (streams: the client, config: its config, secrets hidden); Ctrl+D leaves"""
    monitor: StreamsMonitor = ctx.obj
    session = get_app_session()

    @auto_async_command_done
    async def run(_ctx: click.Context) -> None:
        try:
            await run_repl(session.input, session.output, monitor.console_locals, monitor._monitored_loop)
        except Exception as exc:  # a failed REPL is shown, the console goes on
            _echo(f"the REPL failed: {exc!r}")
        else:
            _echo("The Python REPL is closed.")

    task = monitor._ui_loop.create_task(run(ctx))
    monitor._termui_tasks.add(task)


@monitor_cli.command(name="topology")
@custom_help_option
@auto_command_done
def do_topology(ctx: click.Context) -> None:
    """The topology description"""
    _echo(views.topology_view(_streams(ctx)))
