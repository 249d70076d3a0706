"""The pause an added instance causes, eager against cooperative rebalancing (KIP-429).

Instance A (one stream thread) owns every task of a ``--partitions`` source topic while this
process produces ``--rate`` records/s over all partitions, each value its produce wall time. After
``--warmup`` s instance B starts; the run waits until each instance runs half of the tasks, keeps
going ``--after`` s, then stops producing and waits until every record was processed. A
Processor-API processor on each instance notes per record: task, instance, processing wall time,
latency (processing − produce time).

Figures per ``rebalance.protocol``, side by side: for the tasks that stayed on A, the longest gap
between two consecutive processed records of one task in the window [B started, settled +
``--after``] (the pause B caused), the same longest gap during the warm-up (baseline), and their
latency percentiles in the window; the time from B's start to the split; and the longest gap of the
tasks that moved to B (their hand-over).

On a real broker (started here unless ``--bootstrap`` is given; ``--bootstrap memory://name`` runs
on the embedded broker).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamloop import ClientState, KafkaStreams, StreamsBuilder
from streamloop.processors.api import BaseProcessor
from streamloop.records import Record
from streamloop.serdes import IntegerSerde, StringSerde
from streamloop.testing import eventually_async
from streamloop.transport import open_transport
from streamloop.transport.base import ProducerSettings, Transport
from tests.support.cluster import Cluster

INT, STR = IntegerSerde(), StringSerde()
PROTOCOLS = ("eager", "cooperative")


class Sample(NamedTuple):
    task: str
    instance: str
    at: float        # processing wall time, s
    latency: float   # processing - produce wall time, s
    key: int


class Note(BaseProcessor):
    """Appends one ``Sample`` per record; nothing more, so it does not slow the thread."""

    def __init__(self, instance: str, samples: list[Sample]) -> None:
        self._instance = instance
        self._samples = samples

    def init(self, context: Any) -> None:
        super().init(context)
        self._task = str(context.task_id)

    def process(self, record: Record) -> None:
        now = time.time()
        self._samples.append(Sample(self._task, self._instance, now, now - float(record.value), record.key))


@dataclass
class Settings:
    partitions: int = 8
    rate: int = 2000
    warmup: float = 5.0
    after: float = 5.0
    # Not Kafka Streams' 30000: commits then fall inside the rebalance, as they do in a long run.
    commit_interval_ms: int = 1000
    timeout: float = 120.0


@dataclass
class Figures:
    settle_s: float
    stayed_gap_warmup_ms: float
    stayed_gap_ms: float
    stayed_p50_ms: float
    stayed_p99_ms: float
    stayed_max_ms: float
    stayed_p99_warmup_ms: float
    moved_gap_ms: float
    produced: int
    processed: int  # duplicates included


def tasks(streams: KafkaStreams) -> set[str]:
    return {str(t.task_id) for m in streams.metadata_for_local_threads() for t in m.active_tasks}


def longest_gap(times: list[float], start: float, end: float) -> float:
    """The longest time in [start, end] without a record: from the last record before ``start``
    (or ``start``) through the records inside to ``end``."""
    before = [t for t in times if t < start]
    points = [before[-1] if before else start, *(t for t in times if start <= t <= end), end]
    return max(b - a for a, b in itertools.pairwise(points))


def gap_ms(samples: list[Sample], of: set[str], start: float, end: float) -> float:
    times: dict[str, list[float]] = {task: [] for task in of}
    for s in samples:
        if s.task in of:
            times[s.task].append(s.at)
    return 1000 * max(longest_gap(sorted(t), start, end) for t in times.values())


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def produce(transport: Transport, topic: str, settings: Settings, stop: anyio.Event, sent: list[int]) -> None:
    """``settings.rate`` records/s, round robin over the partitions, until ``stop``; the key is the
    record's sequence number, the value its produce wall time."""
    producer = transport.producer(ProducerSettings(client_id="bench-pause-producer", linger_ms=1))
    await producer.start()
    started, n = time.monotonic(), 0
    try:
        while not stop.is_set():
            due = int((time.monotonic() - started) * settings.rate)
            while n < due:
                producer.append(topic, n % settings.partitions, INT.serialize(n), repr(time.time()).encode(), None, ())
                n += 1
            await producer.send_buffered()
            await anyio.sleep(0.005)
        await producer.flush()
    finally:
        sent.append(n)
        with anyio.CancelScope(shield=True):  # closed even when a failed run cancels this task
            await producer.close()


async def measure(protocol: str, bootstrap: str, cluster: Cluster, settings: Settings) -> Figures:
    app = f"bench-pause-{protocol}-{uuid.uuid4().hex[:6]}"
    source = f"{app}-in"
    await cluster.create_topics({source: settings.partitions})
    all_tasks = {f"0_{p}" for p in range(settings.partitions)}
    samples: list[Sample] = []

    def instance(name: str) -> KafkaStreams:
        builder = StreamsBuilder()
        builder.stream(source, key_serde=INT, value_serde=STR).process(lambda: Note(name, samples))
        return KafkaStreams(builder.build(), {
            "application.id": app, "bootstrap.servers": bootstrap, "rebalance.protocol": protocol,
            # Member ids sort in client id order: A is the leader and keeps its tasks' half.
            "client.id": f"{name}-node", "commit.interval.ms": settings.commit_interval_ms,
        })

    def split(a: KafkaStreams, b: KafkaStreams) -> bool:
        for name, streams in (("A", a), ("B", b)):
            if streams.state in (ClientState.PENDING_ERROR, ClientState.ERROR):
                raise RuntimeError(f"{protocol}: instance {name} failed during the rebalance (see its log)")
        if not (a.state is ClientState.RUNNING and b.state is ClientState.RUNNING):
            return False
        on_a, on_b = tasks(a), tasks(b)
        return len(on_a) == len(on_b) == settings.partitions // 2 and on_a | on_b == all_tasks

    a, b = instance("a"), instance("b")
    stop, sent = anyio.Event(), list[int]()
    await a.start_async()
    try:
        await eventually_async(lambda: a.state is ClientState.RUNNING and tasks(a) == all_tasks,
                               settings.timeout, "A owning every task")
        async with anyio.create_task_group() as group:
            group.start_soon(produce, cluster.transport, source, settings, stop, sent)
            # The first second is start-up, not the steady state (half of a shorter warm-up).
            warm_start = time.time() + min(1.0, settings.warmup / 2)
            await anyio.sleep(settings.warmup)
            b_start = time.time()
            await b.start_async()
            await eventually_async(lambda: split(a, b), settings.timeout, "the tasks split between A and B")
            settled = time.time()
            stayed, moved = tasks(a), tasks(b)
            await anyio.sleep(settings.after)
            stop.set()
        await eventually_async(lambda: len({s.key for s in samples}) >= sent[0], settings.timeout,
                               "every produced record processed", interval=0.2)
    finally:
        stop.set()
        await b.close_async()
        await a.close_async()
    end = settled + settings.after
    window = [s.latency for s in samples if s.task in stayed and b_start <= s.at <= end]
    warm = [s.latency for s in samples if s.task in stayed and warm_start <= s.at < b_start]
    return Figures(
        settle_s=settled - b_start,
        stayed_gap_warmup_ms=gap_ms(samples, stayed, warm_start, b_start),
        stayed_gap_ms=gap_ms(samples, stayed, b_start, end),
        stayed_p50_ms=percentile(window, 0.50), stayed_p99_ms=percentile(window, 0.99),
        stayed_max_ms=percentile(window, 1.0), stayed_p99_warmup_ms=percentile(warm, 0.99),
        moved_gap_ms=gap_ms(samples, moved, b_start, end),
        produced=sent[0], processed=len(samples))


ROWS = [
    ("B start -> tasks split, s", "settle_s", ".2f"),
    ("stayed: longest gap, warm-up (baseline) ms", "stayed_gap_warmup_ms", ".0f"),
    ("stayed: longest gap, rebalance window ms", "stayed_gap_ms", ".0f"),
    ("stayed: latency p50 in window ms", "stayed_p50_ms", ".1f"),
    ("stayed: latency p99 in window ms", "stayed_p99_ms", ".1f"),
    ("stayed: latency max in window ms", "stayed_max_ms", ".1f"),
    ("stayed: latency p99, warm-up ms", "stayed_p99_warmup_ms", ".1f"),
    ("moved: longest gap (hand-over) ms", "moved_gap_ms", ".0f"),
    ("records produced", "produced", "d"),
    ("records processed (with duplicates)", "processed", "d"),
]


async def main_async(bootstrap: str, settings: Settings) -> dict[str, Figures | None]:
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    results: dict[str, Figures | None] = {}
    for protocol in PROTOCOLS:
        try:
            results[protocol] = await measure(protocol, bootstrap, cluster, settings)
        except* RuntimeError as failed:  # an instance failed: the other protocol's figures still count
            print(*failed.exceptions, file=sys.stderr)
            results[protocol] = None
    transport = "memory" if bootstrap.startswith("memory://") else "kafka"
    print(f"rebalance pause ({transport}; {settings.partitions} partitions, {settings.rate} records/s, "
          f"warm-up {settings.warmup} s, after {settings.after} s; 1 stream thread per instance, "
          f"commit.interval.ms={settings.commit_interval_ms}, other settings the engine's defaults)")
    print(f"{'':<44}" + "".join(f"{p:>13}" for p in PROTOCOLS))
    for label, attr, fmt in ROWS:
        print(f"{label:<44}" + "".join(f"{'failed':>13}" if (r := results[p]) is None
                                        else f"{getattr(r, attr):>13{fmt}}" for p in PROTOCOLS))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", help="an existing broker (or memory://name); default: start the test broker")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--rate", type=int, default=2000, help="records/s over all partitions")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds before B starts")
    parser.add_argument("--after", type=float, default=5.0, help="seconds to run on once the tasks are split")
    parser.add_argument("--commit-interval-ms", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    settings = Settings(args.partitions, args.rate, args.warmup, args.after, args.commit_interval_ms, args.timeout)
    if args.bootstrap:
        asyncio.run(main_async(args.bootstrap, settings))
        return
    from tests.support.kafka_broker import KafkaBroker

    with KafkaBroker() as broker:
        asyncio.run(main_async(broker.bootstrap, settings))


if __name__ == "__main__":
    main()
