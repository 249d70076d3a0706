"""Where a Spark stage's job spends its time: a record of ``perf_counter`` stamps per job.

Off by default, and then it costs a job one ``None`` check per phase: ``start`` hands out no
clock and every ``mark`` is skipped. A benchmark (``benchmarks/spark_bulk.py``) turns it on in
the process that runs the client with ``record_jobs(callback)``; each job's clock is handed to
the callback (on the worker thread that ran the job) once the job's output is made.

The phases, in the order a job of the bulk path passes them:

- ``decode``: the fetched records' keys and values deserialized with the source's serdes;
- ``frame``: the decoded records as a ``pyarrow.Table`` (schema alignment included);
- ``create``: ``createDataFrame`` of those tables (py4j, the Arrow batches handed to the JVM);
- ``analyze``: the user's function applied (Spark Classic analyzes each DataFrame as it is made);
- ``plan``: optimization and physical planning of the job's one action;
- ``execute``: the action run and its Arrow batches collected back to Python;
- ``rows``: those batches as Python rows, split back by part;
- ``records``: the rows as output records;
- ``serialize``: the output serialized for a direct sink.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

PHASES = ("decode", "frame", "create", "analyze", "plan", "execute", "rows", "records", "serialize")


class JobClock:
    """The stamps of one job: each ``mark`` closes the phase that ran since the previous stamp."""

    __slots__ = ("parts", "phases", "records", "_last")

    def __init__(self, records: int, parts: int) -> None:
        self.records = records
        self.parts = parts
        self.phases: dict[str, float] = {}
        self._last = time.perf_counter()

    def mark(self, phase: str) -> None:
        now = time.perf_counter()
        # Added, not set: a phase met twice (a part framed after another) sums.
        self.phases[phase] = self.phases.get(phase, 0.0) + (now - self._last)
        self._last = now

    def skip(self) -> None:
        """Start the next phase from now: the time since the last stamp belongs to no phase."""
        self._last = time.perf_counter()


_lock = threading.Lock()
_callback: Callable[[JobClock], None] | None = None


def record_jobs(callback: Callable[[JobClock], None] | None) -> None:
    """Hand each job's clock to ``callback`` from now on (None: stop timing jobs)."""
    global _callback
    with _lock:
        _callback = callback


def start(records: int, parts: int = 1) -> JobClock | None:
    """A clock for a job of ``records`` records, or None when jobs are not being timed."""
    return None if _callback is None else JobClock(records, parts)


def finish(clock: JobClock | None) -> None:
    callback = _callback
    if clock is not None and callback is not None:
        callback(clock)


__all__ = ["PHASES", "JobClock", "finish", "record_jobs", "start"]
