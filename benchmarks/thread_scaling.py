"""KIP-663 figures: how fast threads come and go, and what more threads buy.

1. ``add_stream_thread()``: time until it returns, and until the new thread
   processes its first record (group join, rebalance, task creation included).
2. ``remove_stream_thread()``: time until it returns (the thread finished its
   records, committed, closed its tasks and left the group).
3. Throughput with 1, 2 and 4 stream threads over a backlog, when the processor
   awaits 2 ms of I/O per record (``asyncio.sleep(0.002)``). Measured on the
   processing side, from the first record processed to the last, so group-join
   time does not count.

A task processes its records one by one, but the tasks of one thread run as
concurrent coroutines: one thread already overlaps the I/O waits of all its
tasks. More threads add loops (and consumers), not CPU: they share the GIL.

Run: ``python benchmarks/thread_scaling.py`` (starts the test broker),
``--bootstrap host:port`` for an existing broker, ``--memory`` for the
in-process broker.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamloop import ClientState, KafkaStreams, StreamsBuilder
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.transport import open_transport
from streamloop.transport.base import ProducerSettings
from tests.support.cluster import Cluster

INT, JSON = IntegerSerde(), JsonSerde()
IO_WAIT_S = 0.002


class Probe:
    """Counts processed records; remembers when each thread processed its first one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.first_by_thread: dict[str, float] = {}

    def forget_threads(self) -> None:
        with self._lock:
            self.first_by_thread.clear()

    async def __call__(self, value: dict) -> dict:
        await asyncio.sleep(IO_WAIT_S)  # the I/O a real processor would wait for
        now = time.monotonic()
        name = threading.current_thread().name
        with self._lock:
            self.count += 1
            if self.first_at is None:
                self.first_at = now
            self.last_at = now
            self.first_by_thread.setdefault(name, now)
        return value


def streams_for(bootstrap: str, app: str, source: str, sink: str, probe: Probe, threads: int,
                heartbeat_ms: int = 300) -> KafkaStreams:
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .map_values(probe)
            .to(sink, key_serde=INT, value_serde=JSON))
    return KafkaStreams(builder.build(), {
        "application.id": app, "bootstrap.servers": bootstrap, "num.stream.threads": threads,
        "commit.interval.ms": 500, "linger.ms": 5, "poll.ms": 50,
        "session.timeout.ms": 10_000, "heartbeat.interval.ms": heartbeat_ms,
    })


async def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout} s for {what}")
        await asyncio.sleep(0.005)


def settled(streams: KafkaStreams, threads: int, partitions: int) -> bool:
    meta = streams.metadata_for_local_threads()
    return (streams.state is ClientState.RUNNING and len(meta) == threads
            and sum(len(t.active_tasks) for t in meta) == partitions
            and all(t.active_tasks for t in meta))


async def backlog(cluster: Cluster, topic: str, count: int, partitions: int) -> None:
    await cluster.produce(topic, [(i, {"i": i}) for i in range(count)], INT, JSON, partitions=partitions)


def summary(values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return (f"median {statistics.median(ms):7.1f} ms   p99 {p99:7.1f} ms   min {ms[0]:7.1f} ms   "
            f"max {ms[-1]:7.1f} ms")


async def add_remove_latency(cluster: Cluster, partitions: int, rounds: int, base: int = 1,
                             heartbeat_ms: int = 300) -> dict[str, list[float]]:
    """``base`` threads; each round adds one (timed to its first record) and removes one."""
    run = uuid.uuid4().hex[:6]
    source, sink = f"threads-in-{run}", f"threads-out-{run}"
    await cluster.create_topics({source: partitions, sink: partitions})
    probe = Probe()

    async def feed() -> None:
        # A steady trickle on every partition, so a new thread has records whenever it gets its tasks.
        producer = cluster.transport.producer(ProducerSettings(client_id=f"feed-{run}", linger_ms=0))
        await producer.start()
        try:
            i = 0
            while True:
                for p in range(partitions):
                    producer.append(source, p, INT.serialize(i), JSON.serialize({"i": i}), None, ())
                    i += 1
                await producer.send_buffered()
                await asyncio.sleep(0.02)
        finally:
            await producer.close()

    streams = streams_for(cluster.bootstrap, f"threads-latency-{run}", source, sink, probe, base, heartbeat_ms)
    returned: list[float] = []
    first_record: list[float] = []
    removed: list[float] = []
    feeder = asyncio.ensure_future(feed())
    try:
        await _add_remove_rounds(streams, probe, partitions, rounds, base, returned, first_record, removed)
    finally:
        feeder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await feeder
    print(f"  add_stream_thread() returns       {summary(returned)}")
    print(f"  ... new thread's first record     {summary(first_record)}")
    print(f"  remove_stream_thread() returns    {summary(removed)}")
    return {"returned": returned, "first_record": first_record, "removed": removed}


async def _add_remove_rounds(streams: KafkaStreams, probe: Probe, partitions: int, rounds: int, base: int,
                             returned: list[float], first_record: list[float], removed: list[float]) -> None:
    async with streams:
        await wait_for(lambda: settled(streams, base, partitions), 60, f"{base} threads running")
        for _ in range(rounds):
            probe.forget_threads()  # a new thread may reuse a removed one's name
            started = time.monotonic()
            name = await streams.add_stream_thread_async()
            returned.append(time.monotonic() - started)
            assert name is not None
            await wait_for(lambda name=name: name in probe.first_by_thread, 60, f"{name}'s first record")
            first_record.append(probe.first_by_thread[name] - started)
            await wait_for(lambda: settled(streams, base + 1, partitions), 60, f"{base + 1} threads running")
            started = time.monotonic()
            assert await streams.remove_stream_thread_async(timeout=60) is not None
            removed.append(time.monotonic() - started)
            await wait_for(lambda: settled(streams, base, partitions), 60, f"{base} threads running")


async def throughput(cluster: Cluster, threads: int, records: int, partitions: int, source: str) -> float:
    run = uuid.uuid4().hex[:6]
    sink = f"threads-out-{run}"
    await cluster.create_topics({sink: partitions})
    probe = Probe()
    streams = streams_for(cluster.bootstrap, f"threads-tput-{run}", source, sink, probe, threads)
    async with streams:
        await wait_for(lambda: probe.count >= records, 300, f"{records} records processed")
    seconds = (probe.last_at or 0) - (probe.first_at or 0)
    rate = records / seconds if seconds else float("inf")
    ideal = partitions / IO_WAIT_S
    print(f"  {threads} thread{'s' if threads > 1 else ' '}  {records:>7} records in {seconds:6.2f} s = "
          f"{rate:>8,.0f} records/s   ({rate / ideal:5.1%} of {ideal:,.0f}/s, "
          f"{partitions} tasks x 1 record per {IO_WAIT_S * 1000:.0f} ms)")
    return rate


async def main_async(bootstrap: str, partitions: int, records: int, rounds: int, base: int,
                     heartbeat_ms: int, latency_only: bool) -> None:
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    print(f"broker {bootstrap}; {partitions} partitions; the processor awaits {IO_WAIT_S * 1000:.0f} ms per record\n")
    print(f"Adding and removing a thread ({rounds} rounds, {base} <-> {base + 1} threads, heartbeat.interval.ms "
          f"{heartbeat_ms}, a backlog on every partition):")
    await add_remove_latency(cluster, partitions, rounds, base, heartbeat_ms)
    if latency_only:
        return

    source = f"threads-backlog-{uuid.uuid4().hex[:6]}"
    await cluster.create_topics({source: partitions})
    await backlog(cluster, source, records, partitions)
    print(f"\nThroughput over a backlog of {records} records:")
    rates = {n: await throughput(cluster, n, records, partitions, source) for n in (1, 2, 4)}
    print(f"\n  4 threads / 1 thread: {rates[4] / rates[1]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--bootstrap", help="an existing broker; default: start the test broker")
    where.add_argument("--memory", action="store_true", help="use the in-process memory broker")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--records", type=int, default=16_000)
    parser.add_argument("--rounds", type=int, default=5, help="add/remove rounds")
    parser.add_argument("--threads", type=int, default=1, help="threads before each add")
    parser.add_argument("--heartbeat-ms", type=int, default=300, help="heartbeat.interval.ms (Kafka's default: 3000)")
    parser.add_argument("--latency-only", action="store_true", help="only the add/remove figures")
    parser.add_argument("--verbose", action="store_true", help="show the clients' warnings")
    args = parser.parse_args()
    if not args.verbose:
        # Rebalances make aiokafka warn ("Heartbeat failed … rebalancing"): expected here.
        logging.basicConfig(level=logging.ERROR)
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    run = lambda bootstrap: asyncio.run(main_async(  # noqa: E731
        bootstrap, args.partitions, args.records, args.rounds, args.threads, args.heartbeat_ms, args.latency_only))
    if args.memory:
        run(f"memory://thread-scaling-{uuid.uuid4().hex[:6]}")
    elif args.bootstrap:
        run(args.bootstrap)
    else:
        from tests.support.kafka_broker import KafkaBroker

        with KafkaBroker() as broker:
            run(broker.bootstrap)


if __name__ == "__main__":
    main()
