"""SIGKILL an app mid-stream while it counts into a RocksDB store, restart it on the same state
directory, and measure the restore (issue #35): where it started, how many updates it applied, how
many it should have applied, how long until the client was RUNNING again.

The app is ``tests.support.app_process --count`` (one partition, no record cache: every input is one
changelog update). The first ``kill_after`` records are there when it starts; the rest arrive while
it runs, in batches, so that it is mid-stream when the kill comes: once it has processed half of
them and has written a checkpoint. The restart runs until the group's committed offset reaches the
input's end and its restore was told, then stops with SIGTERM. What the restore should have applied
is counted independently: the changelog records from the restore's start to its end whose input
record (their source header) is below the committed offset, read ``read_committed`` under
exactly-once as the restore reads them.
"""

from __future__ import annotations

import signal
import tempfile
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import anyio

from streamloop.records import TopicPartition
from streamloop.serdes import IntegerSerde, JsonSerde, LongSerde
from streamloop.state import checkpoint
from streamloop.state.changelog import changelog_topic, decode_source
from streamloop.testing import eventually_async
from streamloop.transport import open_transport
from tests.support.cluster import Cluster, committed_offset
from tests.support.process_kills import AppProcess

INT, JSON, LONG = IntegerSerde(), JsonSerde(), LongSerde()


@dataclass(frozen=True)
class CrashRestore:
    """One kill and restart, as measured."""

    guarantee: str
    records: int
    processed_at_kill: int
    """Records processed before the kill (by the app's progress lines)."""
    committed_at_kill: int
    """The input's committed offset when the app died: the restart processes again from it."""
    checkpoint_at_kill: int
    changelog_at_kill: int
    """The changelog's end when the app died."""
    restore_start: int
    restore_end: int
    restored: int
    """The restore listener's ``total_restored``."""
    should_restore: int
    """Changelog records from start to end whose input record is below the committed offset."""
    seconds_to_restore: float
    """From the restarted client's start to the start of its restore (the group's join: the killed
    member stays in the group until its session times out)."""
    restore_seconds: float
    """From the restore's start to its end (the store opened, the changelog's tail read)."""
    seconds_to_running: float
    """From the restarted client's start to its RUNNING (restore included)."""
    exact: bool
    """Each key's last count equals its number of inputs (and, exactly-once, each count came once)."""

    def figures(self) -> dict[str, Any]:
        return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


async def kill_mid_stream_and_restart(bootstrap: str, guarantee: str, *, records: int = 3000, keys: int | None = 50,
                                      kill_after: int = 1000, commit_interval_ms: int = 200, io_ms: float = 0.0,
                                      progress_every: int = 1, timeout: float = 120.0, session_timeout_ms: int = 6000,
                                      static: bool = False,
                                      stderr: IO[bytes] | None = None) -> CrashRestore:
    """See the module docstring. ``keys``: distinct keys (None: one per record, a store of ``records``
    entries). ``io_ms`` paces the app (up to that much I/O a record). ``static``: the app has a
    ``group.instance.id``, so its restart takes the killed member's place in the group at once
    instead of waiting for its session to time out."""
    exactly_once = guarantee == "exactly_once_v2"
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    run = uuid.uuid4().hex[:8]
    source, sink, app = f"crash-in-{run}", f"crash-out-{run}", f"crash-{run}"
    await cluster.create_topics({source: 1, sink: 1})

    def batch(start: int, stop: int) -> list[tuple[int, dict[str, int]]]:
        return [(i if keys is None else i % keys, {"n": i}) for i in range(start, stop)]

    await cluster.produce(source, batch(0, kill_after), INT, JSON, partitions=1)
    kill_at = kill_after + (records - kill_after) // 2

    async def produce_the_rest() -> None:
        step = max(1, (records - kill_after) // 40)
        for start in range(kill_after, records, step):
            await cluster.produce(source, batch(start, min(records, start + step)), INT, JSON, partitions=1)
            await anyio.sleep(0.05)  # a stream that goes on arriving (pacing, not waiting for anything)
    state_dir = tempfile.mkdtemp(prefix="crash-state-")
    args = ["--bootstrap", bootstrap, "--application-id", app, "--source", source, "--sink", sink, "--count",
            "--state-dir", state_dir, "--commit-interval-ms", str(commit_interval_ms),
            "--progress-every", str(progress_every), "--session-timeout-ms", str(session_timeout_ms)]
    args += ["--exactly-once"] if exactly_once else []
    args += ["--io-ms", str(io_ms)] if io_ms else []
    args += ["--group-instance-id", f"{app}-instance"] if static else []
    changelog = TopicPartition(changelog_topic(app, "counts"), 0)
    task_dir = str(Path(state_dir) / app / "0_0")
    input_tp = TopicPartition(source, 0)

    def checkpointed() -> int:
        return checkpoint.read(task_dir).get(changelog, 0)

    with tempfile.TemporaryFile() if stderr is None else _kept(stderr) as err:
        first = await AppProcess.start(args, err)
        async with anyio.create_task_group() as group:
            group.start_soon(first.watch)
            try:
                await eventually_async(lambda: first.processed * progress_every >= kill_after // 2, timeout,
                                       "the app processing", interval=0.01)
                group.start_soon(produce_the_rest)
                await eventually_async(lambda: first.processed * progress_every >= kill_at and checkpointed() > 0,
                                       timeout, "records processed and a checkpoint written", interval=0.01)
            finally:
                first.process.send_signal(signal.SIGKILL)  # no commit, no flush, no close
                await first.process.wait()
        processed_at_kill = first.processed * progress_every
        checkpoint_at_kill = checkpointed()
        committed_at_kill = await committed_offset(cluster, app, input_tp) or 0
        changelog_at_kill = (await cluster.end_offsets([changelog]))[changelog]

        second = await AppProcess.start(args, err)
        async with anyio.create_task_group() as group:
            group.start_soon(second.watch)
            try:
                async def drained() -> bool:
                    return (any(e["event"] == "restore" for e in second.events)
                            and await committed_offset(cluster, app, input_tp) == records)
                await eventually_async(drained, timeout, "the restarted app at the input's end", interval=0.1)
            finally:
                second.process.send_signal(signal.SIGTERM)
                with anyio.move_on_after(60):
                    await second.process.wait()
                if second.process.returncode is None:
                    second.process.kill()
                    await second.process.wait()
    restores = [e for e in second.events if e["event"] == "restore"]
    if len(restores) != 1:
        raise AssertionError(f"expected one restore after the restart, got {restores}")
    restore = restores[0]
    started = next(e["at"] for e in second.events if e["event"] == "starting")
    # The first RUNNING once the restore ended (a client RUNNING before that waited for it too).
    running = max(restore["at"], next(e["at"] for e in second.events
                                      if e["event"] == "state" and e["state"] == "RUNNING"))
    counted = await cluster.read_all(changelog.topic, exactly_once)
    should = sum(1 for r in counted if restore["start"] <= r.offset < restore["end"]
                 and _below(decode_source(r.headers), committed_at_kill))
    outputs = await cluster.read_all(sink, exactly_once)
    expected = Counter(i if keys is None else i % keys for i in range(records))
    last = {INT.deserialize(r.key): LONG.deserialize(r.value) for r in outputs}
    exact = last == dict(expected)
    if exactly_once:
        per_key: dict[int, list[int]] = {}
        for r in outputs:
            per_key.setdefault(INT.deserialize(r.key), []).append(LONG.deserialize(r.value))
        exact = exact and per_key == {k: list(range(1, n + 1)) for k, n in expected.items()}
    return CrashRestore(guarantee, records, processed_at_kill, committed_at_kill, checkpoint_at_kill,
                        changelog_at_kill, restore["start"], restore["end"], restore["total"], should,
                        restore["began"] - started, restore["at"] - restore["began"], running - started, exact)


def _below(source: tuple[str, int] | None, committed: int) -> bool:
    return source is None or source[1] < committed


class _kept:
    """A caller's stderr file, left open (``with`` closes only the temporary one)."""

    def __init__(self, file: IO[bytes]) -> None:
        self.file = file

    def __enter__(self) -> IO[bytes]:
        return self.file

    def __exit__(self, *_: object) -> None:
        pass
