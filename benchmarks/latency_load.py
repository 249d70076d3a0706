"""End-to-end latency under load: p50/p99/max at fractions of each contender's own peak (issue #34).

For each workload (``stateless``, ``count``) and each contender (streamloop, the raw aiokafka
loop, Kafka Streams: ``benchmarks/peers/``), in one run on one broker:

1. **Peak.** ``measure.throughput`` on a pre-filled input (``--records``): records/s from the start
   of processing to the last output append, as ``compare.py``'s records/s (``--steady-peak``: the
   rate after the first ``--steady`` of the output instead; with output appended in bursts that
   rate runs high). On two cores that is not what a contender keeps up with while the generator
   runs beside it (the generator and the broker's produce path take CPU the pre-filled run left to
   it), so by default the peak is then *loaded*: ``--overload`` (1.5) times that rate is offered as
   in step 2, and the peak is the rate of the measured output (records over the span of their
   appends), at most the rate the generator reached. ``--filled-peak`` takes the fractions of the
   pre-filled rate instead.
2. **Load.** For each ``--loads`` fraction (default 50% and 80%) of *that contender's* peak, a fresh
   input topic and a fresh process of the peer; once its group is Stable, a generator offers that
   rate (record batches per partition every 5 ms, Kafka's murmur2 partitioning), first as warm-up
   (until the first output, then ``--warmup`` s), then ``--seconds`` measured. Nothing reads the
   output while the peer runs: the output is read once the peer has written all of it, so the
   harness's only work during the run is the generator's.
3. **Latency** = the output record's append time (output topics are ``LogAppendTime``, the
   broker's clock on this machine) − the wall-clock time the generator made the input record.
   Stateless: that time travels in the order's ``ts``. Count: the output is a count, so the
   latency of an update is taken from the input it counts: the update ``n`` of key ``k`` is the
   ``n``-th input record of ``k`` (one key stays on one partition, the input topic is fresh),
   and the generator keeps every record's time per key. No peer needs to carry a timestamp or a
   header through its aggregation, so the three are measured the same way without changing any.

Printed per run: the offered and the reached rate, p50/p99/max, records measured, and the
1-minute load average when the run ended. The goal of issue #34: p99 ≤ 20 ms stateless and
≤ 50 ms count at 50% load, on a quiet machine.

Run: ``python benchmarks/latency_load.py`` (starts the test broker), ``--bootstrap host:port``,
``--peers streamloop,aiokafka,kafka-streams``, ``--workloads stateless,count``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import murmur2

from benchmarks import measure
from benchmarks.broker_io import GroupWatch, create_topics, produce, warm_up
from benchmarks.peers import PEERS
from benchmarks.peers.process import PeerRun
from benchmarks.workloads import PARTITIONS, WORKLOADS, Workload, keep, make_inputs, order

CONTENDERS = ("streamloop", "aiokafka", "kafka-streams")
GOALS_MS = {"stateless": 20.0, "count": 50.0}
TICK = 0.005


def load_average() -> float:
    return os.getloadavg()[0]


@dataclass
class LoadRun:
    offered: float
    reached: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    records: int
    load: float
    # Measured records out per second (their count over the span of their appends): what the
    # contender kept up with while the generator ran beside it.
    output_rate: float = 0.0


@dataclass
class Contender:
    key: str
    name: str
    peak: float | None = None
    peak_load: float = 0.0
    filled_peak: float | None = None  # the pre-filled input's rate, when ``peak`` is the loaded one
    runs: dict[float, LoadRun] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


class LoadGenerator:
    """Orders at a fixed rate, in one record batch per partition every ``TICK``; keeps each one's time.

    ``per_key[k][n]`` is the creation time of the ``n``-th record of key ``k`` (from 0), negative for
    a warm-up record: the count workload's update ``n + 1`` of ``k`` counts that record. An array of
    floats, not a list of tuples: a tuple per record is an object the cyclic GC tracks, and with
    hundreds of thousands of them its full collections stopped this generator for 100-340 ms, between
    stamping records and sending them (seen with ``gc.callbacks``), which every contender's p99 carried."""

    def __init__(self, bootstrap: str, topic: str, rate: float, seed: int = 11) -> None:
        self.topic = topic
        self.rate = rate
        self._rng = random.Random(seed)
        self._producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0, max_batch_size=256 * 1024)
        self._partition: dict[bytes, int] = {}
        self.sent = 0
        self.passing = 0  # records the stateless filter keeps
        self.per_key: dict[bytes, array[float]] = {}

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    def _partition_of(self, key: bytes) -> int:
        p = self._partition.get(key)
        if p is None:
            p = self._partition[key] = (murmur2(key) & 0x7FFFFFFF) % PARTITIONS
        return p

    async def send_for(self, seconds: float, *, measured: bool, until: asyncio.Event | None = None) -> float:
        """Offer the rate for ``seconds`` (or until ``until`` is set); return the rate reached."""
        start = time.monotonic()
        sent = 0
        while until is None or not until.is_set():
            elapsed = time.monotonic() - start
            if elapsed >= seconds:
                break
            due = int(elapsed * self.rate) + 1 - sent
            batches: dict[int, Any] = {}  # aiokafka's BatchBuilder (untyped)
            for _ in range(max(due, 0)):
                now = time.time()
                extra = {} if measured else {"warmup": True}
                key, value = order(self.sent, self._rng, now, **extra)
                times = self.per_key.get(key)
                if times is None:
                    times = self.per_key[key] = array("d")
                times.append(now if measured else -now)
                self.passing += keep(orjson.loads(value))
                partition = self._partition_of(key)
                batch = batches.get(partition)
                if batch is None:
                    batch = batches[partition] = self._producer.create_batch()
                if batch.append(timestamp=None, key=key, value=value) is None:
                    await self._send(batch, partition)
                    batch = batches[partition] = self._producer.create_batch()
                    batch.append(timestamp=None, key=key, value=value)
                self.sent += 1
                sent += 1
            for partition, batch in batches.items():
                await self._send(batch, partition)
            await asyncio.sleep(TICK)
        spent = time.monotonic() - start
        await self._producer.flush()
        return sent / spent if spent > 0 else 0.0

    async def _send(self, batch: Any, partition: int) -> None:
        batch.close()
        await self._producer.send_batch(batch, self.topic, partition=partition)


async def output_total(consumer: AIOKafkaConsumer, topic: str) -> int:
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    return sum((await consumer.end_offsets(tps)).values())


async def read_output(bootstrap: str, topic: str) -> list[tuple[bytes, bytes, int]]:
    """Every record of ``topic`` (key, value, append time in ms), read once the run is over."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                max_partition_fetch_bytes=8 * 1024 * 1024)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out: list[tuple[bytes, bytes, int]] = []
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            for records in (await consumer.getmany(timeout_ms=500, max_records=50_000)).values():
                out.extend((r.key, r.value, r.timestamp) for r in records)
        return out
    finally:
        await consumer.stop()


def latencies(workload: str, output: list[tuple[bytes, bytes, int]], gen: LoadGenerator) -> list[tuple[float, int]]:
    """(latency ms, append time ms) of every measured output record."""
    values: list[tuple[float, int]] = []
    if workload == "stateless":
        for _key, value, append_ms in output:
            o = orjson.loads(value)
            if not o.get("warmup"):
                values.append((append_ms - o["ts"] * 1000, append_ms))
        return values
    for key, value, append_ms in output:
        made_here = gen.per_key.get(key, ())
        n = int(value)
        if not 0 < n <= len(made_here):
            raise ValueError(f"count {n} of {key!r}: only {len(made_here)} input records of that key were made")
        made = made_here[n - 1]
        if made > 0:  # measured (a warm-up record's time is negative)
            values.append((append_ms - made * 1000, append_ms))
    return values


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


async def under_load(peer: ModuleType, workload: Workload, bootstrap: str, rate: float, seconds: float,
                     warmup: float, timeout: float, dump: str | None = None) -> LoadRun:
    # What the harness holds so far (earlier runs' outputs, the peak runs' inputs) is left out of every
    # cyclic GC pass from here on: a full pass over it stops the generator mid-tick.
    gc.collect()
    gc.freeze()
    tag = f"{peer.__name__.rsplit('.', 1)[-1]}-{workload.name}-load-{uuid.uuid4().hex[:6]}"
    app_id, source, sink = f"bench-{tag}", f"in-{tag}", f"out-{tag}"
    await create_topics(bootstrap, [source], [sink])
    watch = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    gen = LoadGenerator(bootstrap, source, rate)
    with tempfile.TemporaryDirectory(prefix="bench-peer-") as workdir:
        process = measure.PeerProcess(peer, PeerRun(workload.name, bootstrap, app_id, source, sink, workdir))
        group = GroupWatch(bootstrap, app_id)
        await watch.start()
        await gen.start()
        await group.start()
        try:
            deadline = time.monotonic() + timeout
            while not await group.stable():
                process.check()
                if time.monotonic() > deadline:
                    raise measure.PeerFailed(f"{peer.NAME}: group not Stable in {timeout:.0f} s: {process.tail()}")
                await asyncio.sleep(0.02)
            first_output = asyncio.Event()

            async def wait_first() -> None:
                while await output_total(watch, sink) == 0:
                    process.check()
                    await asyncio.sleep(0.05)
                first_output.set()

            waiter = asyncio.create_task(wait_first())
            await gen.send_for(timeout, measured=False, until=first_output)
            if not first_output.is_set():
                waiter.cancel()
                raise measure.PeerFailed(f"{peer.NAME}: no output within {timeout:.0f} s: {process.tail()}")
            await waiter
            await gen.send_for(warmup, measured=False)
            reached = await gen.send_for(seconds, measured=True)
            load = load_average()
            expected = gen.passing if workload.name == "stateless" else gen.sent
            while await output_total(watch, sink) < expected:
                process.check()
                if time.monotonic() > deadline + seconds:
                    raise measure.PeerFailed(f"{peer.NAME}: output of {expected} records incomplete in time: "
                                             f"{process.tail()}")
                await asyncio.sleep(0.1)
        finally:
            await group.stop()
            await gen.stop()
            await watch.stop()
            await process.stop()
    measured = latencies(workload.name, await read_output(bootstrap, sink), gen)
    if not measured:
        raise measure.PeerFailed(f"{peer.NAME}: no measured record in the output")
    if dump:
        # One line per measured output record: its append time and its latency (ms), to see when
        # the slow ones came (at a commit, a fetch, a GC pause).
        path = Path(dump) / f"{peer.NAME}-{workload.name}-{rate:.0f}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{at} {ms:.2f}\n" for ms, at in sorted(measured, key=lambda m: m[1])))
    values = [ms for ms, _ in measured]
    appends = [at for _, at in measured]
    span_s = (max(appends) - min(appends)) / 1000
    # Count: one output per input; stateless: the filter keeps ~95%, so outputs are scaled back to inputs.
    inputs_per_output = 1.0 if workload.name == "count" else gen.sent / max(gen.passing, 1)
    out_rate = len(values) * inputs_per_output / span_s if span_s > 0 else 0.0
    return LoadRun(rate, reached, percentile(values, 50), percentile(values, 99), max(values), len(values), load,
                   out_rate)


async def peak(peer: ModuleType, workload: Workload, bootstrap: str, source: str, count: int, steady: float,
               timeout: float, steady_peak: bool) -> tuple[float, float]:
    expect = workload.expectation(make_inputs(count))
    run = await measure.throughput(peer, workload, bootstrap, source, expect, timeout, steady)
    if steady_peak and run.steady_records_per_s is not None:
        return run.steady_records_per_s, load_average()
    return run.records_per_s, load_average()


async def run_workload(name: str, args: argparse.Namespace, bootstrap: str) -> list[Contender]:
    workload = WORKLOADS[name]
    source = f"bench-{name}-peak-{uuid.uuid4().hex[:6]}"
    inputs = make_inputs(args.records)
    await create_topics(bootstrap, [source], [])
    await produce(bootstrap, source, inputs)
    await warm_up(bootstrap, source, len(inputs))
    contenders = [Contender(key, PEERS[key].NAME) for key in args.peers]
    print(f"\n{name}: peaks on {args.records:,} records ({PARTITIONS} partitions)", flush=True)
    for c in contenders:
        try:
            await asyncio.to_thread(PEERS[c.key].prepare)
            c.peak, c.peak_load = await peak(PEERS[c.key], workload, bootstrap, source, args.records,
                                             args.steady, args.timeout, args.steady_peak)
        except Exception as exc:
            c.errors["peak"] = f"{type(exc).__name__}: {exc}"[:400]
            print(f"  {c.name:<22} peak FAILED {c.errors['peak']}", flush=True)
            continue
        print(f"  {c.name:<22} peak {c.peak:>10,.0f} records/s on the pre-filled input (load {c.peak_load:.1f})",
              flush=True)
        if args.loaded_peak:
            try:
                over = await under_load(PEERS[c.key], workload, bootstrap, c.peak * args.overload, args.seconds,
                                        args.warmup, args.timeout)
            except Exception as exc:
                c.errors["peak"] = f"{type(exc).__name__}: {exc}"[:400]
                print(f"  {c.name:<22} loaded peak FAILED {c.errors['peak']}", flush=True)
                c.peak = None
                continue
            # Output clearing a backlog runs above the rate offered: what was kept up is at most what came in.
            c.filled_peak, c.peak, c.peak_load = c.peak, min(over.output_rate, over.reached), over.load
            print(f"  {c.name:<22} loaded peak {c.peak:>10,.0f} records/s ({over.output_rate:,.0f}/s out with "
                  f"{over.offered:,.0f}/s offered, {over.reached:,.0f}/s reached; p99 {over.p99_ms:.0f} ms, "
                  f"load {over.load:.1f})", flush=True)
    for fraction in args.loads:
        for c in contenders:
            if c.peak is None:
                continue
            rate = c.peak * fraction
            try:
                r = await under_load(PEERS[c.key], workload, bootstrap, rate, args.seconds, args.warmup,
                                     args.timeout, dump=args.dump)
            except Exception as exc:
                c.errors[f"{fraction:.0%}"] = f"{type(exc).__name__}: {exc}"[:400]
                print(f"  {c.name:<22} at {fraction:.0%} FAILED {c.errors[f'{fraction:.0%}']}", flush=True)
                continue
            c.runs[fraction] = r
            print(f"  {c.name:<22} at {fraction:.0%} ({r.offered:,.0f}/s offered, {r.reached:,.0f}/s reached): "
                  f"p50 {r.p50_ms:.1f} ms, p99 {r.p99_ms:.1f} ms, max {r.max_ms:.1f} ms "
                  f"({r.records:,} records, load {r.load:.1f})", flush=True)
    return contenders


def table(name: str, contenders: list[Contender], loads: list[float]) -> list[str]:
    lines = [f"### {name}", "",
             "| contender | peak records/s (load) | at | offered / reached records/s | p50 ms | p99 ms | max ms "
             "| records | load |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in contenders:
        filled = "" if c.filled_peak is None else f"; pre-filled {c.filled_peak:,.0f}"
        peak_cell = "failed" if c.peak is None else f"{c.peak:,.0f} ({c.peak_load:.1f}){filled}"
        for fraction in loads:
            r = c.runs.get(fraction)
            label = f"{fraction:.0%}"
            if r is None:
                why = c.errors.get(label) or c.errors.get("peak", "not run")
                lines.append(f"| {c.name} | {peak_cell} | {label} | {why} | – | – | – | – | – |")
                continue
            lines.append(f"| {c.name} | {peak_cell} | {label} | {r.offered:,.0f} / {r.reached:,.0f} | "
                         f"{r.p50_ms:.1f} | {r.p99_ms:.1f} | {r.max_ms:.1f} | {r.records:,} | {r.load:.1f} |")
    ours = next((c for c in contenders if c.key == "streamloop"), None)
    half = ours.runs.get(0.5) if ours else None
    if half is not None and name in GOALS_MS:
        verdict = "met" if half.p99_ms <= GOALS_MS[name] else "NOT met"
        lines += ["", f"Goal p99 ≤ {GOALS_MS[name]:.0f} ms at 50% load: streamloop {half.p99_ms:.1f} ms, {verdict}."]
    return [*lines, ""]


async def main_async(args: argparse.Namespace, bootstrap: str) -> None:
    print(f"latency under load; load average at the start {', '.join(f'{x:.1f}' for x in os.getloadavg())}",
          flush=True)
    results = {name: await run_workload(name, args, bootstrap) for name in args.workloads}
    print()
    for name, contenders in results.items():
        print("\n".join(table(name, contenders, args.loads)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", help="an existing broker; default: start the test broker")
    parser.add_argument("--peers", default=",".join(CONTENDERS), help=f"comma-separated, of: {', '.join(PEERS)}")
    parser.add_argument("--workloads", default="stateless,count", help="comma-separated, of: stateless, count")
    parser.add_argument("--records", type=int, default=200_000, help="input records of a peak run")
    parser.add_argument("--steady-peak", action="store_true",
                        help="the peak is the steady rate, after the first --steady of the output; default: "
                             "the whole run's rate (as compare.py's records/s)")
    parser.add_argument("--steady", type=float, default=0.3, help="the fraction of --steady-peak (default 0.3)")
    parser.add_argument("--overload", type=float, default=1.5,
                        help="the loaded peak's offered rate, as a multiple of the pre-filled rate (default 1.5)")
    parser.add_argument("--filled-peak", dest="loaded_peak", action="store_false",
                        help="take the loads as fractions of the pre-filled input's rate; default: of the loaded "
                             "peak, the output rate kept up while that rate is offered by the generator")
    parser.add_argument("--loads", default="0.5,0.8", help="fractions of each contender's peak to offer")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per load run")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds at the rate after the first output")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a peer may take for one run")
    parser.add_argument("--dump", help="a directory: each load run's (append time, latency) pairs go to a file there")
    args = parser.parse_args()
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    args.loads = [float(x) for x in args.loads.split(",") if x.strip()]
    if unknown := [p for p in args.peers if p not in PEERS]:
        parser.error(f"unknown peers {unknown}; known: {', '.join(PEERS)}")
    if unknown := [w for w in args.workloads if w not in GOALS_MS]:
        parser.error(f"unknown workloads {unknown}; known: {', '.join(GOALS_MS)}")
    if args.bootstrap:
        asyncio.run(main_async(args, args.bootstrap))
        return
    from tests.support.kafka_broker import KafkaBroker

    with KafkaBroker() as broker:
        asyncio.run(main_async(args, broker.bootstrap))


if __name__ == "__main__":
    main()
