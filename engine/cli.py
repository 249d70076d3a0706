"""``streamloop`` (also ``python -m streamloop``): run an application, or the demo.

    streamloop run package.module:streams [--monitor] [--progress] [--http HOST:PORT]
        # a KafkaStreams, or a function returning one
    streamloop demo [--orders N]

``run`` imports the module from the current directory (or ``--app-dir``), as uvicorn
does, so no ``PYTHONPATH=.`` is needed. It starts the client, waits until SIGINT/SIGTERM
or until the client stops by itself, closes it gracefully (finish in-flight records,
commit, leave the group), and exits 0 after a clean stop, 1 when the client ended in
ERROR. On a terminal it prints a progress line every few seconds (``--progress``). With
``--monitor`` it opens the aiomonitor console (``monitor.port``, see docs/console.md)
on the runner's event loop, the one that supervises the client. With ``--http`` it serves, on
that loop, the health probes ``/health/live`` and ``/health/ready``, the Prometheus metrics at
``/metrics`` (extra ``prometheus``) and interactive queries under ``/stores/`` (extra ``http``;
see ``streamloop.web``), from before the client starts until after it has closed, so the probes
answer (ready: 503) while it joins its group and while it shuts down.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence

import anyio

from streamloop import demo
from streamloop.client import ClientState, KafkaStreams
from streamloop.config import split_endpoint
from streamloop.console.progress import print_progress, progress_enabled
from streamloop.errors import ConfigError, MissingExtraError

log = logging.getLogger("streamloop")

# What ``run`` logs each line as. No thread name: the stream threads' lines start with theirs.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class AppLoadError(Exception):
    """The ``module:attribute`` given to ``run`` does not name a KafkaStreams (or a factory)."""


def add_app_dir(app_dir: str) -> None:
    """Put ``app_dir`` first on ``sys.path``, so that ``run mod:app`` finds ``mod`` there.

    ``python -m streamloop`` has the current directory on the path already; the ``streamloop``
    console script has its own directory there instead.
    """
    path = os.path.abspath(app_dir)
    if path not in (os.path.abspath(entry or os.curdir) for entry in sys.path):
        sys.path.insert(0, path)


def load_app(target: str) -> KafkaStreams:
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise AppLoadError(f"Expected 'package.module:attribute', got {target!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AppLoadError(f"Cannot import module {module_name!r}: {exc}") from exc
    try:
        app = getattr(module, attribute)
    except AttributeError as exc:
        raise AppLoadError(f"Module {module_name!r} has no attribute {attribute!r}") from exc
    if callable(app) and not isinstance(app, KafkaStreams):
        app = app()
    if not isinstance(app, KafkaStreams):
        raise AppLoadError(f"{target} is a {type(app).__name__}, not a KafkaStreams (or a function returning one)")
    return app


def run(target: str, close_timeout: float, monitor: bool = False, progress_interval: float | None = None,
        http: tuple[str, int] | None = None, ready_max_lag: int | None = None) -> int:
    """``progress_interval``: seconds between progress lines on stdout; None prints none.
    ``http``: where to serve health, metrics and queries; None serves nothing."""
    if http is not None:
        # Fail before loading the application (which may connect) when the extra is missing.
        importlib.import_module("streamloop.web")
    streams = load_app(target)
    if monitor:
        # Fail before starting anything when the extra is missing.
        importlib.import_module("streamloop.console.monitor")
    return anyio.run(_supervise, streams, target, close_timeout, monitor, progress_interval, http, ready_max_lag,
                     backend="asyncio")


async def _supervise(streams: KafkaStreams, target: str, close_timeout: float, monitor: bool,
                     progress_interval: float | None = None, http: tuple[str, int] | None = None,
                     ready_max_lag: int | None = None) -> int:
    """The runner's loop: start, wait for a signal or a terminal state, close; the console watches it.

    It waits on the client's state itself rather than through ``set_state_listener``: that is the
    user's one listener (Kafka Streams has one), and the application may have set it already.
    """
    stop = anyio.Event()

    async def until_signalled(signals: AsyncIterator[signal.Signals]) -> None:
        async for signum in signals:
            log.info("Received %s: closing", signum.name)
            stop.set()

    async def until_stopped_by_itself() -> None:
        await streams.wait_for_state_async(ClientState.ERROR, ClientState.NOT_RUNNING, ClientState.PENDING_ERROR)
        stop.set()

    console = None
    server = None
    # Watched from before start(): a signal while starting is queued and closes the client once started.
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        try:
            if http is not None:
                from streamloop.web import StreamsHttpServer

                # Before start(): the probes answer while the client joins its group (not ready yet),
                # and a port that is taken stops the run before it joins.
                server = StreamsHttpServer(streams, http[0], http[1], max_lag=ready_max_lag)
                await server.start()
            if monitor:
                from streamloop.console.monitor import open_monitor

                # Before start(): a console that cannot listen stops the run before it joins the group.
                console = open_monitor(streams, asyncio.get_running_loop())  # aiomonitor needs the loop object
            await streams.start_async()
            log.info("Started %s (%s)", target, streams.client_id)
            async with anyio.create_task_group() as group:
                group.start_soon(until_signalled, signals)
                group.start_soon(until_stopped_by_itself)
                if progress_interval is not None:
                    group.start_soon(print_progress, streams, sys.stdout, progress_interval)
                await stop.wait()
                group.cancel_scope.cancel()
        finally:
            if console is not None:
                console.close()
            try:
                await streams.close_async(timeout=close_timeout)
            finally:
                # After the close: the probes say "not ready" while it finishes its records and commits.
                if server is not None:
                    await server.close()
    final = streams.state
    log.info("Stopped in state %s", final.name)
    return 1 if final is ClientState.ERROR else 0


def configure_logging(level: str) -> None:
    """Log at ``level`` in ``LOG_FORMAT``; aiokafka's INFO lines only at DEBUG.

    aiokafka logs some seven INFO lines per consumer and rebalance (joining, syncing, the
    partitions); the stream threads' one "Assigned tasks" line says what matters. Its
    warnings and errors still show.
    """
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)
    if logging.getLevelName(level.upper()) != logging.DEBUG:
        logging.getLogger("aiokafka").setLevel(logging.WARNING)


def _positive_seconds(text: str) -> float:
    seconds = float(text)
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return seconds


def http_endpoint(text: str) -> tuple[str, int]:
    """``--http``'s ``HOST:PORT``, or ``PORT`` alone for loopback (127.0.0.1)."""
    if text.isdigit():
        text = f"127.0.0.1:{text}"
    try:
        return split_endpoint(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("where other instances reach this one for interactive "
                                                          "queries, ", "")) from None


def _records(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be a number of records (0 or more), got {text}")
    return int(text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streamloop", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="run an application until SIGINT/SIGTERM")
    run_parser.add_argument("app", help="package.module:attribute naming a KafkaStreams or a factory")
    run_parser.add_argument("--app-dir", default=os.curdir,
                            help="directory to import the module from (default: the current directory)")
    run_parser.add_argument("--close-timeout", type=float, default=60.0, help="seconds for a graceful close")
    run_parser.add_argument("--log-level", default="INFO",
                            help="DEBUG, INFO, WARNING or ERROR (default: INFO; DEBUG adds task, thread and "
                                 "group state transitions)")
    run_parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                            help="print a progress line (state, records in and processed per second, lag) "
                                 "every --progress-interval seconds (default: when stdout is a terminal)")
    run_parser.add_argument("--progress-interval", type=_positive_seconds, default=5.0, metavar="SECONDS",
                            help="seconds between progress lines (default: %(default)s)")
    run_parser.add_argument("--monitor", action="store_true",
                            help="open the aiomonitor console on monitor.host:monitor.port (extra 'monitor')")
    run_parser.add_argument("--http", type=http_endpoint, metavar="HOST:PORT",
                            help="serve /health/live, /health/ready, /metrics and the stores' interactive "
                                 "queries at HOST:PORT (PORT alone: 127.0.0.1; 0.0.0.0 to be reached from "
                                 "other hosts, e.g. by Kubernetes' probes; extra 'http')")
    run_parser.add_argument("--ready-max-lag", type=_records, default=None, metavar="RECORDS",
                            help="/health/ready answers 503 while a task is more records behind than this "
                                 "(default: no bound; a probe may pass ?max_lag=N)")
    demo_parser = commands.add_parser("demo", help="the order pipeline on the embedded broker",
                                      description=demo.__doc__,
                                      formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_arguments(demo_parser)
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo.run(args)
    configure_logging(args.log_level)
    add_app_dir(args.app_dir)
    try:
        progress = args.progress_interval if progress_enabled(sys.stdout, args.progress) else None
        return run(args.app, args.close_timeout, args.monitor, progress, args.http, args.ready_max_lag)
    except (AppLoadError, MissingExtraError, ConfigError) as exc:
        print(f"streamloop: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
