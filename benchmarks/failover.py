"""Failover time with and without a standby replica (``num.standby.replicas``).

Two instances of one application, one task counting per key into a persistent (RocksDB) store of
``--entries`` distinct keys. The first instance owns the task; with a standby the second keeps a
warm copy (the run waits until its checkpoint reaches the changelog's end). Then the active
instance is closed and the clock runs until the second has restored the store and processed a new
record (its count is queryable). Figures, side by side: failover seconds, changelog records the
survivor restored, and how long the close itself took.

On a real broker (started here unless ``--bootstrap`` is given; ``--bootstrap memory://`` runs on
the embedded broker).

``--crash`` measures the other failover, issue #35's: the app counting into a RocksDB store of
``--entries`` distinct keys dies with SIGKILL mid-stream (``--tail`` records past the full store; the app commits every
``--commit-interval-ms``) and the same instance restarts on its state directory
(``tests.support.crash_restore``), under at-least-once and exactly-once. Figures: the changelog
records restored (and how many should be: committed records' updates past the restore's start),
where the restore started beside the changelog's end, and the seconds from the restarted client's
start to its restore (the group's join), of the restore itself, and from the start to RUNNING.
Real Kafka only (the app is another process).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamloop import ClientState, KafkaStreams, StreamsBuilder
from streamloop.ids import TaskId
from streamloop.records import TopicPartition
from streamloop.serdes import LongSerde, StringSerde
from streamloop.state import Materialized, checkpoint
from streamloop.state.changelog import changelog_topic
from streamloop.testing import eventually_async
from streamloop.transport import open_transport
from tests.support.cluster import Cluster

STR, LONG = StringSerde(), LongSerde()
TASK = TaskId(0, 0)


def topology(source: str, sink: str):
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=STR, value_serde=STR)
            .group_by_key()
            .count(materialized=Materialized("counts", persistent=True))
            .to_stream()
            .to(sink, key_serde=STR, value_serde=LONG))
    return builder.build()


class Restored:
    def __init__(self) -> None:
        self.total = 0

    def on_restore_start(self, partition: TopicPartition, store: str, start: int, end: int) -> None:
        pass

    def on_batch_restored(self, partition: TopicPartition, store: str, end: int, n: int) -> None:
        pass

    def on_restore_end(self, partition: TopicPartition, store: str, total: int) -> None:
        self.total += total


def count_of(streams: KafkaStreams, key: str) -> int | None:
    if streams.state is not ClientState.RUNNING:
        return None
    try:
        return streams.store("counts").get(key)  # type: ignore[union-attr]
    except Exception:  # not queryable while it rebalances or restores
        return None


def has(streams: KafkaStreams, kind: str) -> bool:
    return any(t.task_id == TASK for m in streams.metadata_for_local_threads() for t in getattr(m, kind))


async def failover(bootstrap: str, cluster: Cluster, source: str, entries: int, replicas: int,
                   timeout: float) -> tuple[float, int, float]:
    app = f"bench-failover-{uuid.uuid4().hex[:6]}"
    sink = f"{app}-out"
    await cluster.create_topics({sink: 1})
    tmp = tempfile.mkdtemp(prefix="failover-")
    restored = {"a": Restored(), "b": Restored()}

    def instance(name: str) -> KafkaStreams:
        streams = KafkaStreams(topology(source, sink), {
            "application.id": app, "bootstrap.servers": bootstrap, "state.dir": f"{tmp}/{name}",
            # The member ids sort in client id order: the first instance keeps the task on a rebalance.
            "client.id": f"{name}-node", "num.standby.replicas": replicas, "commit.interval.ms": 200,
        })
        streams.set_global_state_restore_listener(restored[name])
        return streams

    a, b = instance("a"), instance("b")
    await a.start_async()
    try:
        await eventually_async(lambda: count_of(a, f"k{entries - 1}") == 1, timeout, "the first instance's counts")
        await b.start_async()
        try:
            await eventually_async(lambda: a.state is ClientState.RUNNING and b.state is ClientState.RUNNING
                        and (has(a, "active_tasks") or has(b, "active_tasks")), timeout, "a settled group")
            active, survivor, survivor_name = (a, b, "b") if has(a, "active_tasks") else (b, a, "a")
            if replicas:
                changelog = TopicPartition(changelog_topic(app, "counts"), 0)
                task_dir = f"{tmp}/{survivor_name}/{app}/{TASK}"
                await eventually_async(lambda: checkpoint.read(task_dir).get(changelog, 0) >= entries, timeout,
                            "the standby's checkpoint at the changelog's end")
            restored[survivor_name].total = 0
            started = time.monotonic()
            await active.close_async()
            closed = time.monotonic()
            await cluster.produce(source, [("probe", "v")], STR, STR, partitions=1)
            await eventually_async(lambda: count_of(survivor, "probe") == 1, timeout, "the survivor processing again")
            return time.monotonic() - started, restored[survivor_name].total, closed - started
        finally:
            await b.close_async()
    finally:
        await a.close_async()


async def crash_async(bootstrap: str, entries: int, tail: int, commit_interval_ms: int, timeout: float,
                      static: bool) -> None:
    from tests.support.crash_restore import kill_mid_stream_and_restart

    rows = []
    for guarantee in ("at_least_once", "exactly_once_v2"):
        started = time.monotonic()
        report = await kill_mid_stream_and_restart(
            bootstrap, guarantee, records=entries + 2 * tail, keys=None, kill_after=entries,
            commit_interval_ms=commit_interval_ms, progress_every=max(1, tail // 10), timeout=timeout,
            session_timeout_ms=2000, static=static)
        rows.append((report, time.monotonic() - started))
    print(f"crash and restart (kafka, RocksDB store of ~{entries + tail} entries when killed, "
          f"commit.interval.ms={commit_interval_ms}, session.timeout.ms=2000"
          f"{', static membership' if static else ''})")
    print(f"{'guarantee':>16} {'restore from':>12} {'changelog end':>13} {'committed':>10} {'restored':>9} "
          f"{'should':>7} {'to restore s':>12} {'restore s':>9} {'to RUNNING s':>12} {'exact':>6}")
    for r, _seconds in rows:
        print(f"{r.guarantee:>16} {r.restore_start:>12} {r.changelog_at_kill:>13} {r.committed_at_kill:>10} "
              f"{r.restored:>9} {r.should_restore:>7} {r.seconds_to_restore:>12.2f} {r.restore_seconds:>9.2f} "
              f"{r.seconds_to_running:>12.2f} "
              f"{r.exact!s:>6}")


async def main_async(bootstrap: str, entries: int, timeout: float) -> None:
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    rows = []
    for replicas in (0, 1):
        source = f"bench-failover-in-{uuid.uuid4().hex[:6]}"
        await cluster.create_topics({source: 1})
        await cluster.produce(source, [(f"k{i}", "v") for i in range(entries)], STR, STR, partitions=1)
        seconds, restored, close = await failover(bootstrap, cluster, source, entries, replicas, timeout)
        rows.append((replicas, seconds, restored, close))
    transport = "memory" if bootstrap.startswith("memory://") else "kafka"
    print(f"failover ({transport}, store of {entries} entries, RocksDB)")
    print(f"{'num.standby.replicas':>20} {'failover s':>11} {'restored records':>17} {'close s':>8}")
    for replicas, seconds, restored, close in rows:
        print(f"{replicas:>20} {seconds:>11.2f} {restored:>17} {close:>8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", help="an existing broker (or memory://); default: start the test broker")
    parser.add_argument("--entries", type=int, default=20_000, help="store size (e.g. 1000000)")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--crash", action="store_true", help="SIGKILL mid-stream and restart on the same state dir")
    parser.add_argument("--tail", type=int, default=20_000, help="--crash: records processed past the full store")
    parser.add_argument("--commit-interval-ms", type=int, default=1000, help="--crash: the app's commit interval")
    parser.add_argument("--static", action="store_true", help="--crash: the app has a group.instance.id")
    args = parser.parse_args()

    def run(bootstrap: str) -> None:
        if args.crash:
            asyncio.run(crash_async(bootstrap, args.entries, args.tail, args.commit_interval_ms, args.timeout,
                                    args.static))
        else:
            asyncio.run(main_async(bootstrap, args.entries, args.timeout))

    if args.bootstrap:
        run(args.bootstrap)
        return
    from tests.support.kafka_broker import KafkaBroker

    with KafkaBroker() as broker:
        run(broker.bootstrap)


if __name__ == "__main__":
    main()
