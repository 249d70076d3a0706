"""The process-kill part of the fault suite (issue #19): SIGKILL an application again and again.

Each round produces a batch of input, starts the application (``tests.support.app_process``,
relaying ``{"n": n}`` from a source to a sink) as a subprocess, and kills it with SIGKILL at a
point drawn from a seeded ``random.Random``: as soon as it has tasks (while they initialise), or
a random time after its first processed record (mid-transaction, or just after a commit, so the
next run seeks back to committed offsets with a backlog ahead). No commit, no leave-group, no abort:
the next start finds the killed instance's open transactions and its stale group membership.
After the last kill the application runs until the group's committed offsets reach the end of
the input, then stops with SIGTERM. An independent reader (``read_committed`` under
exactly-once) then counts what is lost and what is duplicated.

A round whose application does not reach its kill point, or a last run that does not drain, in
``stall_after`` seconds is a *stall*: the application is alive but makes no progress.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import anyio
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from streamloop.records import TopicPartition
from streamloop.serdes import IntegerSerde, JsonSerde, LongSerde
from streamloop.testing import eventually_async
from streamloop.transport import open_transport
from tests.support.cluster import Cluster, committed_offset

INT, JSON, LONG = IntegerSerde(), JsonSerde(), LongSerde()
ROOT = Path(__file__).resolve().parents[2]
GUARANTEES = ("at_least_once", "exactly_once_v2")


@dataclass(frozen=True)
class KillReport:
    """What a campaign of kills did and what the independent reader found."""

    guarantee: str
    kills: int
    records_in: int
    records_out: int
    lost: int
    duplicates: int
    stalls: int
    drain_seconds: float
    """From the last start until the committed offsets reached the end and every input was out."""
    stderr_tail: str = ""
    """The end of the last stalled run's stderr (empty without a stall), for the failure message."""

    def figures(self) -> dict[str, float | int]:
        return {"kills": self.kills, "records_in": self.records_in, "records_out": self.records_out,
                "lost": self.lost, "duplicates": self.duplicates, "stalls": self.stalls,
                "drain_seconds": round(self.drain_seconds, 2)}


class AppProcess:
    """One run of ``tests.support.app_process``; its stdout is read by ``watch`` as it comes (the
    app prints a line per record, and a full pipe would block it), counting its events."""

    def __init__(self, process: Process, stderr: IO[bytes]) -> None:
        self.process = process
        self.stderr = stderr
        self.processed = 0
        self.tasks = 0
        # The app's other events as they came (``restore``, ``state``, ``starting``), for tests that read them.
        self.events: list[dict[str, Any]] = []

    @classmethod
    async def start(cls, args: list[str], stderr: IO[bytes]) -> AppProcess:
        process = await anyio.open_process([sys.executable, "-m", "tests.support.app_process", *args],
                                           cwd=ROOT, stdin=subprocess.DEVNULL, stderr=stderr)
        return cls(process, stderr)

    async def watch(self) -> None:
        """Count the app's events until its stdout closes. Caller: the campaign's task group."""
        assert self.process.stdout is not None
        lines = BufferedByteReceiveStream(self.process.stdout)
        while True:
            try:
                line = await lines.receive_until(b"\n", 1 << 16)
            except (anyio.IncompleteRead, anyio.EndOfStream, anyio.ClosedResourceError):
                return
            event = json.loads(line)
            if event["event"] == "processed":
                self.processed += 1
            elif event["event"] == "tasks":
                self.tasks = event["count"]
            else:
                self.events.append(event)

    def stderr_tail(self, chars: int = 3000) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-chars:]


async def kill_and_restart(bootstrap: str, kills: int, guarantee: str, *, seed: int = 0, batch: int = 300,
                           partitions: int = 2, buffered: int = 10, session_timeout_ms: int = 2_000,
                           stall_after: float = 40.0, initialising: float = 0.25,
                           max_kill_delay: float = 1.0, in_flight: int = 1, ordering: str = "partition",
                           count: bool = False) -> KillReport:
    """Run a campaign of ``kills`` SIGKILLs under ``guarantee`` (see the module docstring).

    ``buffered`` is the app's ``buffered.records.per.partition``: small, so back-pressure pauses
    its partitions while a restarted task initialises (the stall of issue #19). A kill lands
    with probability ``initialising`` as soon as the app has tasks, else up to ``max_kill_delay``
    seconds after its first processed record. ``in_flight`` > 1 runs that many records of a task at
    once (each with up to 5 ms of I/O, so they finish out of order) in ``ordering``; ``count``
    counts per key into a store instead of relaying the records.
    """
    if guarantee not in GUARANTEES:
        raise ValueError(f"guarantee must be one of {GUARANTEES}, not {guarantee!r}")
    exactly_once = guarantee == "exactly_once_v2"
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    run = uuid.uuid4().hex[:8]
    source, sink, app = f"kills-in-{run}", f"kills-out-{run}", f"kills-{run}"
    await cluster.create_topics({source: partitions, sink: partitions})
    args = ["--bootstrap", bootstrap, "--application-id", app, "--source", source, "--sink", sink,
            "--response", "REPLACE_THREAD", "--buffered-records-per-partition", str(buffered),
            "--session-timeout-ms", str(session_timeout_ms)] + (["--exactly-once"] if exactly_once else [])
    if in_flight > 1:
        args += ["--threads-per-task", str(in_flight), "--ordering", ordering, "--io-ms", "5"]
    if count:
        args += ["--count", "--state-dir", tempfile.mkdtemp(prefix="kills-state-")]
    rng = random.Random(seed)
    sent = stalls = 0
    drain_seconds = 0.0
    stalled_stderr = ""
    inputs = [TopicPartition(source, p) for p in range(partitions)]

    async def drained() -> bool:
        ends = await cluster.end_offsets(inputs)
        for tp in inputs:
            if await committed_offset(cluster, app, tp) != ends[tp]:
                return False
        out = {n for n, _count in _outputs(await cluster.read_all(sink, exactly_once), count)}
        return out >= set(range(sent))

    for round_ in range(kills + 1):
        await cluster.produce(source, [(n, {"n": n}) for n in range(sent, sent + batch)], INT, JSON,
                              partitions=partitions)
        sent += batch
        last = round_ == kills
        with tempfile.TemporaryFile() as stderr:
            proc = await AppProcess.start(args, stderr)
            started = time.monotonic()
            async with anyio.create_task_group() as group:
                group.start_soon(proc.watch)
                try:
                    if last:
                        await eventually_async(drained, stall_after, "committed offsets at the end", interval=0.25)
                        drain_seconds = time.monotonic() - started
                    elif rng.random() < initialising:
                        await eventually_async(lambda proc=proc: proc.tasks > 0, stall_after, "tasks assigned")
                    else:
                        # The round's batch waits: a run that processes nothing has stalled.
                        await eventually_async(lambda proc=proc: proc.processed > 0, stall_after, "a record processed")
                        # The kill point itself: a random time into processing (mid-transaction, or
                        # after a commit), not a wait for something to happen.
                        await anyio.sleep(rng.uniform(0.0, max_kill_delay))
                except TimeoutError:
                    stalls += 1
                    stalled_stderr = proc.stderr_tail()
                    if last:
                        drain_seconds = time.monotonic() - started
                finally:
                    if last and proc.process.returncode is None:
                        proc.process.terminate()  # a clean close: commit, leave the group
                        with anyio.move_on_after(60):
                            await proc.process.wait()
                    if proc.process.returncode is None:
                        proc.process.kill()  # no commit, no leave-group, no flush
                    await proc.process.wait()
    outputs = _outputs(await cluster.read_all(sink, exactly_once), count)
    out = Counter(n for n, _count in outputs)
    # Counting: every input has a key of its own, so each output count is 1; a 2 is an input counted twice.
    recounted = sum(1 for _n, c in outputs if c != 1)
    expected = set(range(sent))
    return KillReport(
        guarantee=guarantee, kills=kills, records_in=sent, records_out=sum(out.values()),
        lost=len(expected - set(out)),
        duplicates=sum(c - 1 for n, c in out.items() if n in expected) + recounted,
        stalls=stalls, drain_seconds=drain_seconds, stderr_tail=stalled_stderr)


def _outputs(records: list[Any], count: bool) -> list[tuple[int, int]]:
    """``(input number, count)`` of each output record: relayed values carry their number (count 1),
    counts are keyed by it."""
    if count:
        return [(INT.deserialize(r.key), LONG.deserialize(r.value)) for r in records]
    return [(JSON.deserialize(r.value)["n"], 1) for r in records]
