"""What every peer process shares: its command line and how it stops.

The harness starts a peer with the workload, the broker, an application id (the
consumer group), the source and sink topics and a scratch directory, and ends it
with SIGTERM once the output is complete.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class PeerRun:
    workload: str
    bootstrap: str
    app_id: str
    source: str
    sink: str
    workdir: str

    def arguments(self) -> list[str]:
        return [self.workload, self.bootstrap, self.app_id, self.source, self.sink, self.workdir]


def python_command(module: str, run: PeerRun) -> list[str]:
    return [sys.executable, "-m", module, *run.arguments()]


def parse_run(argv: list[str] | None = None) -> PeerRun:
    parser = argparse.ArgumentParser(description="one benchmark peer process (started by benchmarks/compare.py)")
    for name in ("workload", "bootstrap", "app_id", "source", "sink", "workdir"):
        parser.add_argument(name)
    return PeerRun(**vars(parser.parse_args(argv)))


def installed_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def run_until_terminated(serve: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run ``serve(stop)`` on a new event loop; SIGTERM or SIGINT sets ``stop``."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(stop)

    asyncio.run(main())
