"""The progress line ``streamloop run`` prints on a terminal every few seconds.

::

    RUNNING  in 1,250/s  processed 1,248/s  lag 37  threads 2  tasks 4

``in`` is records fetched from the source topics, ``processed`` records that went through the
topology, both per second since the previous line; ``lag`` is the records of the tasks'
partitions not processed yet. Each line is made from ``KafkaStreams.metrics()``, a snapshot
any thread may take, so printing it never waits for a stream thread. The runner prints it
only when stdout is a terminal (``--progress``/``--no-progress`` decide otherwise): in a log
file or a pipe it would be noise between the log lines.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

import anyio

from streamloop.client import KafkaStreams


@dataclass(frozen=True)
class ProgressSample:
    """What one line is made from: the client's state and its threads' running totals at ``at`` (s)."""

    at: float
    state: str
    polled: float
    processed: float
    lag: float | None
    threads: int
    tasks: int


def sample(streams: KafkaStreams, now: float) -> ProgressSample:
    """The client's totals now, from ``metrics()``."""
    polled = processed = 0.0
    lags: dict[tuple[str, str], float] = {}
    threads = 0
    for metric in streams.metrics():
        if metric.group == "stream-thread-metrics" and metric.name == "records-polled-total":
            polled += metric.value
        elif metric.group == "stream-thread-metrics" and metric.name == "process-total":
            processed += metric.value
        elif metric.group == "stream-task-metrics" and metric.name == "records-lag":
            lags[(metric.tags["thread-id"], metric.tags["task-id"])] = metric.value
        elif metric.group == "stream-metrics" and metric.name == "alive-stream-threads":
            threads = int(metric.value)
    tasks = len(streams.local_task_details())
    return ProgressSample(now, streams.state.name, polled, processed, sum(lags.values()) if lags else None,
                          threads, tasks)


def _rate(before: float, after: float, seconds: float) -> str:
    # A total falls when a thread dies or leaves (its count goes with it): no negative rates.
    per_second = max(after - before, 0.0) / seconds if seconds > 0 else 0.0
    return f"{per_second:,.0f}/s"


def format_progress(previous: ProgressSample, current: ProgressSample) -> str:
    """One line: the state, the rates since ``previous``, the lag (``-`` before it is measured), threads, tasks."""
    seconds = current.at - previous.at
    lag = "-" if current.lag is None else f"{current.lag:,.0f}"
    return (f"{current.state}  in {_rate(previous.polled, current.polled, seconds)}  "
            f"processed {_rate(previous.processed, current.processed, seconds)}  "
            f"lag {lag}  threads {current.threads}  tasks {current.tasks}")


def progress_enabled(stream: TextIO, requested: bool | None) -> bool:
    """``requested`` when given (``--progress``/``--no-progress``), else whether ``stream`` is a terminal."""
    if requested is not None:
        return requested
    isatty = getattr(stream, "isatty", None)
    return bool(isatty()) if callable(isatty) else False


async def print_progress(streams: KafkaStreams, stream: TextIO, interval_s: float,
                         clock: Callable[[], float] = time.monotonic) -> None:
    """Print a line every ``interval_s`` until cancelled (the runner's task group owns it)."""
    previous = sample(streams, clock())
    while True:
        await anyio.sleep(interval_s)
        current = sample(streams, clock())
        print(format_progress(previous, current), file=stream, flush=True)
        previous = current
