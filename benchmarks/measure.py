"""One measured run of one peer: its process, its throughput, its latency, its peak memory.

Throughput: the peer starts on an input topic that already holds the whole input;
records/s = input records / (last output append − the start of the peer's
processing). That start is taken as the last moment its consumer group was seen not
yet Stable (polled every 20 ms), so the time to start the process and join the group
counts for nobody, and a run is never timed shorter than it was. Latency: once the peer's group is
Stable, a producer writes at a fixed rate below every peer's saturation; once the first
warm-up output is seen and ``warmup`` seconds more have passed, records are
stamped with their send time, and each one's latency is its output append time
minus that stamp (same machine, same clock).
Peak RSS: ``VmHWM`` of the peer's process (the Python process or the JVM), read
from ``/proc`` just before it is stopped.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from benchmarks.broker_io import FixedRateProducer, GroupWatch, OutputTail, create_topics
from benchmarks.dsl_workloads import DslExpectation, DslWorkload
from benchmarks.peers.process import PeerRun
from benchmarks.workloads import Expectation, Workload

ROOT = Path(__file__).resolve().parents[1]


class PeerFailed(RuntimeError):
    """The peer's process exited, or its output was not complete in time (with its last log lines)."""


class PeerProcess:
    def __init__(self, peer: ModuleType, run: PeerRun) -> None:
        self.name = peer.NAME
        self.log_path = Path(run.workdir) / "peer.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(peer.command(run), cwd=ROOT, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def tail(self, lines: int = 8) -> str:
        text = self.log_path.read_text(errors="replace").strip().splitlines()
        return " | ".join(line.strip() for line in text[-lines:]) or "(no output)"

    def check(self) -> None:
        code = self.proc.poll()
        if code is not None:
            raise PeerFailed(f"{self.name} exited with code {code}: {self.tail()}")

    def peak_rss_bytes(self) -> int | None:
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return None

    async def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                await asyncio.to_thread(self.proc.wait, 30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                await asyncio.to_thread(self.proc.wait)
        self._log.close()


@dataclass
class ThroughputRun:
    records_per_s: float
    seconds: float
    peak_rss_bytes: int | None
    # Records/s after the first ``warmup`` part of the output (see ``steady_rate``); None: not asked for.
    steady_records_per_s: float | None = None


def steady_rate(append_times_ms: list[int], records_in: int, warmup: float) -> float | None:
    """Records/s over the output after its first ``warmup`` fraction: start-up, the first fetches and
    an interpreter's or a JIT's warm-up do not count. Output is taken as proportional to input (every
    workload here filters uniformly or emits one update per record), so the input records of that part
    are ``records_in * (1 - warmup)``; its time runs from the append of the first output record past the
    warm-up part to the last append. None when too little output is left to time."""
    if not append_times_ms or not 0 < warmup < 1:
        return None
    times = sorted(append_times_ms)
    start = times[min(int(len(times) * warmup), len(times) - 1)]
    if times[-1] <= start:
        return None
    return records_in * (1 - warmup) / ((times[-1] - start) / 1000)


@dataclass
class LatencyRun:
    p50_ms: float
    p99_ms: float
    records: int
    rate: int


def _ids(peer: ModuleType, workload: Workload | DslWorkload, kind: str) -> tuple[str, str]:
    tag = f"{peer.__name__.rsplit('.', 1)[-1]}-{workload.name}-{kind}-{uuid.uuid4().hex[:6]}"
    return f"bench-{tag}", f"out-{tag}"


async def throughput(peer: ModuleType, workload: Workload | DslWorkload, bootstrap: str, source: str,
                     expect: Expectation | DslExpectation, timeout: float, warmup: float = 0.0) -> ThroughputRun:
    """One run; ``source`` is comma-separated when the workload reads several topics. The output
    must be complete (``expect.complete``) within ``timeout`` and then right (``expect.verify``)."""
    app_id, sink = _ids(peer, workload, "tp")
    await create_topics(bootstrap, [], [sink])
    with tempfile.TemporaryDirectory(prefix="bench-peer-") as workdir:
        process = PeerProcess(peer, PeerRun(workload.name, bootstrap, app_id, source, sink, workdir))
        tail = OutputTail(bootstrap, sink, counts=workload.name == "count", append_times=warmup > 0,
                          values=not expect.counts)
        group = GroupWatch(bootstrap, app_id)
        expect.begin()
        await tail.start()
        await group.start()
        started: float | None = None
        # The group turned Stable after the last check that found it not Stable: that check's time
        # is when the peer may have started at the earliest (a run is never timed shorter than it was).
        not_stable_at = time.time()
        try:
            deadline = time.monotonic() + timeout
            seen = previous = 0
            while True:
                process.check()
                if started is None:
                    checked_at = time.time()
                    if await group.stable():
                        started = not_stable_at
                    else:
                        not_stable_at = checked_at
                total = await tail.end_total()
                # Without an exact output count, a settling expectation reads the output only when it
                # has paused for one poll: the harness's reading does not take the peer's CPU meanwhile.
                paused = total == previous or not expect.settle or expect.records_out is not None
                previous = total
                if total != seen and paused and (expect.records_out is None or total >= expect.records_out):
                    await tail.catch_up()
                    seen = tail.records
                    if expect.complete(tail.records, tail.last_values):
                        # Timed up to the output that completed it, whatever else comes after.
                        last_ms, timed = tail.last_ms, len(tail.append_times_ms or ())
                        await _settled(tail)
                        wrong = expect.verify(tail.records, tail.last_values)
                        tail.last_ms = last_ms
                        if tail.append_times_ms is not None:
                            del tail.append_times_ms[timed:]
                        if wrong is not None:
                            raise PeerFailed(f"{peer.NAME}: wrong output: {wrong}")
                        break
                if time.monotonic() > deadline:
                    raise PeerFailed(f"{peer.NAME}: output incomplete after {timeout:.0f} s ({total} records "
                                     f"out); last log lines: {process.tail()}")
                await asyncio.sleep(0.02 if started is None else 0.05)
            rss = process.peak_rss_bytes()
        finally:
            await group.stop()
            await tail.stop()
            await process.stop()
    assert tail.first_ms is not None and tail.last_ms is not None
    # A peer that was done before its group was seen Stable started after the last check that was not.
    first = min(not_stable_at if started is None else started, tail.first_ms / 1000)
    seconds = max(tail.last_ms / 1000 - first, 0.001)
    steady = steady_rate(tail.append_times_ms or [], expect.records_in, warmup)
    return ThroughputRun(expect.records_in / seconds, seconds, rss, steady)


async def _settled(tail: OutputTail, quiet: float = 1.0) -> None:
    """Read on until the output has not grown for ``quiet`` s (a commit interval): records a peer
    writes after the expected ones (duplicates, say) are then seen by the check."""
    total = await tail.end_total()
    while True:
        await asyncio.sleep(quiet)
        now = await tail.end_total()
        if now == total:
            break
        total = now
    await tail.catch_up()


def _percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


async def latency(peer: ModuleType, workload: Workload, bootstrap: str, rate: int, seconds: float,
                  warmup: float, timeout: float) -> LatencyRun:
    app_id, sink = _ids(peer, workload, "lat")
    source = f"in-{app_id.removeprefix('bench-')}"
    await create_topics(bootstrap, [source], [sink])
    with tempfile.TemporaryDirectory(prefix="bench-peer-") as workdir:
        process = PeerProcess(peer, PeerRun(workload.name, bootstrap, app_id, source, sink, workdir))
        tail = OutputTail(bootstrap, sink, latencies=True)
        producer = FixedRateProducer(bootstrap, source, rate)
        group = GroupWatch(bootstrap, app_id)
        await tail.start()
        await producer.start()
        await group.start()
        try:
            deadline = time.monotonic() + timeout
            # Nothing is sent before the peer has its partitions: a backlog built while a JVM or
            # an interpreter starts would be latency of the start, not of the processing.
            while not await group.stable():
                process.check()
                if time.monotonic() > deadline:
                    raise PeerFailed(f"{peer.NAME}: its group was not Stable within {timeout:.0f} s: "
                                     f"{process.tail()}")
                await asyncio.sleep(0.02)
            # Warm-up at the same rate until the peer's first output: it has joined and is processing.
            warm = asyncio.create_task(producer.send_for(timeout, until=lambda: tail.records > 0, warmup=True))
            while tail.records == 0:
                process.check()
                if warm.done():
                    warm.result()
                    raise PeerFailed(f"{peer.NAME}: no output within {timeout:.0f} s: {process.tail()}")
                await tail.catch_up()
                await asyncio.sleep(0.05)
            await warm
            # A little longer at the same rate: past the JIT, the first commits and any follow-up rebalance.
            await producer.send_for(warmup, warmup=True)
            expected = await producer.send_for(seconds, passes=workload.passes)
            while len(tail.latencies_ms) < expected:
                process.check()
                if time.monotonic() > deadline + seconds:
                    raise PeerFailed(f"{peer.NAME}: {len(tail.latencies_ms)} of {expected} latency records out "
                                     f"in time; last log lines: {process.tail()}")
                await tail.catch_up()
                await asyncio.sleep(0.05)
        finally:
            await group.stop()
            await producer.stop()
            await tail.stop()
            await process.stop()
    values = tail.latencies_ms
    return LatencyRun(_percentile(values, 50), _percentile(values, 99), len(values), rate)
