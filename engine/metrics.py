"""Windowed metrics: rates, averages and maxima over ``metrics.num.samples`` windows of
``metrics.sample.window.ms`` each, computed as Kafka's ``SampledStat``/``Rate`` compute them.

The hot path never touches a window. A task adds the records it processed and
the time they took to its thread's ``ProcessMeter`` once per chunk (plain
attribute adds, no lock, no allocation). Once per poll-loop iteration the stream
thread hands the running totals to its ``ThreadSensors``, which turns their
increase into samples. Readers (the client's ``metrics()``, the console, the
Prometheus exporter) run on other threads and only read: a sample being
advanced while it is read gives a value one record behind, never an error.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

# Samples not yet used start this far back, so they count as expired.
_NEVER = -(2**62)


class SampledStat:
    """``samples`` windows of ``window_ms``; one writer thread, any number of reader threads.

    ``record`` moves to the next window once the current one is ``window_ms`` old;
    windows older than ``samples * window_ms`` are left out of every measurement.
    """

    __slots__ = ("_window", "_n", "_starts", "_sums", "_counts", "_peaks", "_current")

    def __init__(self, window_ms: int, samples: int, now_ms: int) -> None:
        if window_ms < 1 or samples < 1:
            raise ValueError(f"window_ms and samples must be >= 1, got {window_ms}, {samples}")
        self._window = window_ms
        self._n = samples
        self._starts = [_NEVER] * samples
        self._sums = [0.0] * samples
        self._counts = [0] * samples
        self._peaks = [-math.inf] * samples
        self._starts[0] = now_ms
        self._current = 0

    def record(self, value: float, now_ms: int, count: int = 1, peak: float | None = None) -> None:
        """Add ``value`` (the sum of ``count`` events, the largest of them ``peak``) at ``now_ms``."""
        i = self._current
        if now_ms - self._starts[i] >= self._window:
            i = (i + 1) % self._n
            # Reset the sample before it becomes current, so a reader never sees old sums in a new window.
            self._sums[i] = 0.0
            self._counts[i] = 0
            self._peaks[i] = -math.inf
            self._starts[i] = now_ms
            self._current = i
        self._sums[i] += value
        self._counts[i] += count
        top = value if peak is None else peak
        if top > self._peaks[i]:
            self._peaks[i] = top

    def _live(self, now_ms: int) -> list[int]:
        expire = self._n * self._window
        return [i for i in range(self._n) if now_ms - self._starts[i] < expire]

    def rate(self, now_ms: int) -> float:
        """Sum of the values per second over the live windows (Kafka's ``Rate`` in seconds).

        As in Kafka, the elapsed time is at least ``samples - 1`` full windows, so a
        burst right after start-up does not read as a huge rate.
        """
        live = self._live(now_ms)
        total = sum(self._sums[i] for i in live)
        oldest = min((self._starts[i] for i in live), default=now_ms)
        elapsed = now_ms - oldest
        full_windows = elapsed // self._window
        minimum = self._n - 1
        if full_windows < minimum:
            elapsed += (minimum - full_windows) * self._window
        return total * 1000.0 / max(elapsed, 1)

    def avg(self, now_ms: int) -> float:
        """Sum of the values over the number of events in the live windows; NaN without events."""
        live = self._live(now_ms)
        count = sum(self._counts[i] for i in live)
        return sum(self._sums[i] for i in live) / count if count else math.nan

    def max(self, now_ms: int) -> float:
        """The largest event in the live windows; NaN without events."""
        peaks = [self._peaks[i] for i in self._live(now_ms) if self._counts[i]]
        return max(peaks) if peaks else math.nan


class ProcessMeter:
    """Running totals of one stream thread's processing, added to by its tasks once per chunk.

    Only the thread's own loop writes it (all its tasks run there), so plain adds are safe.
    """

    __slots__ = ("records", "nanos", "peak_nanos")

    def __init__(self) -> None:
        self.records = 0
        self.nanos = 0
        # The slowest record's time (a chunk's time over its records) since the last sample.
        self.peak_nanos = 0.0

    def add(self, records: int, nanos: int) -> None:
        if records <= 0:
            return
        self.records += records
        self.nanos += nanos
        per_record = nanos / records
        if per_record > self.peak_nanos:
            self.peak_nanos = per_record


@dataclass(frozen=True)
class SensorSettings:
    window_ms: int = 30_000
    samples: int = 2


class ThreadSensors:
    """A stream thread's windowed metrics (process/poll/commit rate, process latency avg/max).

    Caller: the thread's poll loop (``sample``, once per iteration) and any reader (``values``).
    """

    def __init__(self, settings: SensorSettings, clock_ms: Callable[[], int]) -> None:
        now = clock_ms()
        self._clock_ms = clock_ms
        self._process = SampledStat(settings.window_ms, settings.samples, now)
        self._poll = SampledStat(settings.window_ms, settings.samples, now)
        self._commit = SampledStat(settings.window_ms, settings.samples, now)
        self._latency = SampledStat(settings.window_ms, settings.samples, now)
        self._records = 0
        self._nanos = 0
        self._polls = 0
        self._commits = 0

    def sample(self, meter: ProcessMeter, polls: int, commits: int) -> None:
        """Turn the totals' increase since the last call into samples."""
        now = self._clock_ms()
        records, nanos = meter.records - self._records, meter.nanos - self._nanos
        self._records, self._nanos = meter.records, meter.nanos
        self._process.record(float(records), now)
        if records > 0:
            self._latency.record(nanos / 1e6, now, count=records, peak=meter.peak_nanos / 1e6)
            meter.peak_nanos = 0.0
        self._poll.record(float(polls - self._polls), now)
        self._polls = polls
        self._commit.record(float(commits - self._commits), now)
        self._commits = commits

    def values(self) -> dict[str, float]:
        """Kafka Streams' thread-level names; rates per second, latencies in ms."""
        now = self._clock_ms()
        return {
            "process-rate": self._process.rate(now),
            "process-latency-avg": self._latency.avg(now),
            "process-latency-max": self._latency.max(now),
            "poll-rate": self._poll.rate(now),
            "commit-rate": self._commit.rate(now),
        }
