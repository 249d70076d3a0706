"""Spark batch stages: throughput against per-record Python, the cost of the Arrow conversion,
and what a slow batch on one task adds to another task's latency.

1. Records/s of an enrichment (JSON orders keyed by customer, a broadcast join with a customer
   table and a computed column, JSON out; 4 partitions, one stream thread) through
   ``spark_batch`` with batches of 1k, 10k and 100k records, on the bulk path with one Spark job
   for the thread's tasks (``shared``, the default) and with a job per task
   (``spark.batch.shared=false``, how the bulk path ran before), and on the per-record path
   (``spark.batch.bulk=false``, how every stage ran before the bulk path),
   against the same logic as a per-record ``map_values`` with a dict lookup, on the same input;
   with the stream thread's CPU per record (its OS thread's user + system time, from /proc).
2. The conversion alone: records to a DataFrame and its rows back, through Arrow (what the
   stage does) against plain Python rows (``createDataFrame(list of dicts)`` and ``collect()``).
3. Latency of partition 1's records while partition 0's task has a batch stuck for several
   seconds on the same stream thread, against the same run without the stuck batch (~0 added).

Run: ``python benchmarks/spark_stage.py`` (starts the test broker and a local[2] SparkSession),
``--memory`` for the embedded broker, ``--records``/``--sizes``/``--partitions`` to change the
load, ``--only throughput`` (or ``conversion``, ``latency``) for one part, ``--schema`` to give
the stage the orders' schema.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Generator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamloop import KafkaStreams, StreamsBuilder
from streamloop.records import Record, TopicPartition
from streamloop.serdes import IntegerSerde, JsonSerde, StringSerde
from streamloop.spark.frames import to_frame, to_rows
from streamloop.transport import open_transport
from tests.support.cluster import Cluster

INT, JSON, STR = IntegerSerde(), JsonSerde(), StringSerde()
ORDER_SCHEMA = "key string, id long, customer long, amount double"
CUSTOMERS = 100
TIERS = {c: ("gold", "silver", "bronze")[c % 3] for c in range(CUSTOMERS)}
RATE = 0.92
STUCK_S = 5.0


def order(i: int) -> dict[str, Any]:
    return {"id": i, "customer": i % CUSTOMERS, "amount": float(i % 1000)}


async def wait_for_output(cluster: Cluster, topic: str, count: int, limit_s: float = 900) -> None:
    reader = cluster.transport.reader(f"bench-{uuid.uuid4().hex[:6]}")
    await reader.start()
    tp = TopicPartition(topic, 0)
    deadline = time.monotonic() + limit_s
    try:
        while True:
            end = (await reader.end_offsets([tp]))[tp]
            if end >= count:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{end} of {count} records after {limit_s} s")
            await asyncio.sleep(0.01)
    finally:
        await reader.close()


def resident_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def peak_resident(stop: asyncio.Event, peak: list[float]) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], resident_mb())
        await asyncio.sleep(0.05)


def stream_thread_cpu_s() -> float:
    """CPU seconds (user + system) of this process's stream threads so far, read from /proc by
    their OS thread ids."""
    ticks = 0
    for thread in threading.enumerate():
        if "StreamThread" not in thread.name or thread.native_id is None:
            continue
        try:
            with open(f"/proc/self/task/{thread.native_id}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


async def stream_cpu(stop: asyncio.Event, total: list[float]) -> None:
    """Keep the stream threads' CPU time while they live (their /proc entries go when they end)."""
    while not stop.is_set():
        total[0] = max(total[0], stream_thread_cpu_s())
        await asyncio.sleep(0.05)


async def throughput(bootstrap: str, spark: Any, records: int, batch: int | None, partitions: int,
                     mode: str = "shared", schema: bool = False) -> tuple[float, float, float]:
    """Records/s through the enrichment, from the client's start to the last output record, the
    growth of this process's resident memory meanwhile (MB) and the stream thread's CPU per input
    record (µs): a Spark stage of ``batch``-record batches, or per-record Python (None). ``mode``:
    ``shared`` (one job for the thread's tasks), ``per-task`` (a job per task) or ``per-record``."""
    run = uuid.uuid4().hex[:6]
    source, sink = f"spark-in-{run}", f"spark-out-{run}"
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    await cluster.create_topics({source: partitions, sink: 1})
    await cluster.produce(source, [(f"c{i % CUSTOMERS}", order(i)) for i in range(records)], STR, JSON,
                          partitions=partitions)
    builder = StreamsBuilder()
    stream = builder.stream(source, key_serde=STR, value_serde=JSON)
    if batch is None:
        stream = stream.map_values(lambda v: {"id": v["id"], "tier": TIERS[v["customer"]],
                                              "eur": v["amount"] * RATE})
    else:
        from pyspark.sql import functions as F

        tiers = spark.createDataFrame(list(TIERS.items()), ["customer", "tier"])
        stream = stream.spark_batch(
            lambda frame: frame.join(F.broadcast(tiers), "customer").select(
                "key", "id", "tier", (frame.amount * RATE).alias("eur")),
            max_records=batch, max_wait_ms=200, schema=ORDER_SCHEMA if schema else None)
    stream.to(sink, key_serde=STR, value_serde=JSON)
    streams = KafkaStreams(builder.build(), {
        "application.id": f"spark-bench-{run}", "bootstrap.servers": bootstrap, "num.stream.threads": 1,
        "commit.interval.ms": 1000, "max.poll.records": 5000, "buffered.records.per.partition": 5000,
        "spark.batch.bulk": mode != "per-record", "spark.batch.shared": mode == "shared",
    })
    base, peak, stop, cpu = resident_mb(), [0.0], asyncio.Event(), [0.0]
    sampler = asyncio.create_task(peak_resident(stop, peak))
    cpu_sampler = asyncio.create_task(stream_cpu(stop, cpu))
    started = time.monotonic()
    async with streams:
        await wait_for_output(cluster, sink, records)
        elapsed = time.monotonic() - started
        cpu[0] = max(cpu[0], stream_thread_cpu_s())
    stop.set()
    await sampler
    await cpu_sampler
    return records / max(elapsed, 1e-6), peak[0] - base, cpu[0] / records * 1e6


def conversion(spark: Any, size: int) -> tuple[float, float]:
    """Seconds to turn ``size`` records into a DataFrame and back: through Arrow, and as Python rows."""
    records = [Record(i % 2, order(i), 0) for i in range(size)]
    to_rows(to_frame(spark, records[:10], "key")[0], "warm-up")
    started = time.perf_counter()
    to_rows(to_frame(spark, records, "key")[0], "bench")
    arrow = time.perf_counter() - started
    started = time.perf_counter()
    rows = [{"key": r.key, **r.value} for r in records]
    [row.asDict() for row in spark.createDataFrame(rows).collect()]
    return arrow, time.perf_counter() - started


async def latency(bootstrap: str, stuck_for: float, records: int) -> list[float]:
    """Seconds from producing each of partition 1's records to reading its output, while partition
    0's first batch is held ``stuck_for`` seconds (0: not held) on the same stream thread."""
    run = uuid.uuid4().hex[:6]
    source, sink = f"spark-lat-in-{run}", f"spark-lat-out-{run}"
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    await cluster.create_topics({source: 2, sink: 1})
    held = threading.Event()

    def stage(frame: Any) -> Any:
        # Both runs look for partition 0's record; only one then holds its batch.
        if not held.is_set() and frame.filter(frame.p == 0).limit(1).count():
            held.set()
            time.sleep(stuck_for)  # the slow cluster
        return frame

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .spark_batch(stage, max_records=50, max_wait_ms=50)
            .filter(lambda _k, v: v["p"] == 1)
            .to(sink, key_serde=INT, value_serde=JSON))
    streams = KafkaStreams(builder.build(), {
        "application.id": f"spark-lat-{run}", "bootstrap.servers": bootstrap, "num.stream.threads": 1,
        "commit.interval.ms": 200, "poll.ms": 20, "linger.ms": 1,
    })
    lags: list[float] = []
    async with streams:
        await cluster.produce(source, [(0, {"p": 0, "i": -1, "sent": time.time()})], INT, JSON, partitions=2)
        reader = cluster.transport.reader(f"bench-{run}")
        await reader.start()
        tp = TopicPartition(sink, 0)
        reader.assign([tp])
        reader.seek(tp, 0)
        try:
            deadline = time.monotonic() + STUCK_S + 60
            for i in range(records):
                # The same pace in both runs: the records span the stuck batch's whole time.
                await cluster.produce(source, [(1, {"p": 1, "i": i, "sent": time.time()})], INT, JSON, partitions=2)
                await asyncio.sleep(STUCK_S / records)
                lags.extend(await _drain(reader))
            while len(lags) < records and time.monotonic() < deadline:
                lags.extend(await _drain(reader))
        finally:
            await reader.close()
    return lags


async def _drain(reader: Any) -> list[float]:
    now = time.time()
    return [now - JSON.deserialize(r.value)["sent"] for batch in (await reader.poll(20, 10_000)).values()
            for r in batch]


async def main_async(bootstrap: str, records: int, sizes: list[int], runs: int, partitions: int,
                     only: str | None, schema: bool, modes: list[str]) -> None:
    from tests.support.spark import spark_session

    sessions: Generator[Any, None, None] = spark_session()  # type: ignore[assignment]
    spark = next(sessions)
    try:
        print(f"SparkSession {spark.sparkContext.master}, Arrow "
              f"{spark.conf.get('spark.sql.execution.arrow.pyspark.enabled')}; broker {bootstrap}\n")
        if only in (None, "conversion"):
            print("1. Conversion only (records -> DataFrame -> rows), median of 3:")
            for size in sizes:
                pairs = [conversion(spark, size) for _ in range(3)]
                arrow = statistics.median(p[0] for p in pairs)
                plain = statistics.median(p[1] for p in pairs)
                print(f"   {size:>7,} records: Arrow {arrow * 1000:8.1f} ms ({size / arrow:>9,.0f} rec/s), "
                      f"Python rows {plain * 1000:8.1f} ms ({size / plain:>9,.0f} rec/s): {plain / arrow:.1f}x")

        if only in (None, "throughput"):
            print(f"\n2. Enrichment of {records:,} records ({partitions} partitions, 1 stream thread"
                  f"{', schema=' + repr(ORDER_SCHEMA) if schema else ''}), median of {runs}:")
            python = None
            cases: list[tuple[int | None, str]] = [(None, "")]
            cases += [(size, mode) for size in sizes for mode in modes]
            for batch, mode in cases:
                results = [await throughput(bootstrap, spark, records, batch, partitions, mode, schema)
                           for _ in range(runs)]
                rate = statistics.median(r[0] for r in results)
                grown = max(r[1] for r in results)
                cpu = statistics.median(r[2] for r in results)
                python = python or rate
                label = ("per-record Python (map_values)" if batch is None else
                         f"spark_batch {batch:>7,}, {mode}")
                print(f"   {label:<36} {rate:>9,.0f} records/s ({rate / python:.2f}x), "
                      f"stream thread {cpu:6.1f} µs/record, resident memory +{grown:,.0f} MB")

        if only in (None, "latency"):
            print("\n3. Latency of partition 1 while partition 0's batch is stuck 5 s (same stream thread):")
            await latency(bootstrap, 0, 20)  # warm-up
            calm = await latency(bootstrap, 0, 100)
            stuck = await latency(bootstrap, STUCK_S, 100)
            for label, lags in (("no stuck batch", calm), ("beside a stuck batch", stuck)):
                print(f"   {label:<22} median {statistics.median(lags) * 1000:7.1f} ms, "
                      f"p99 {sorted(lags)[int(len(lags) * 0.99) - 1] * 1000:7.1f} ms ({len(lags)} records)")
            print(f"   added by the stuck batch (median): "
                  f"{(statistics.median(stuck) - statistics.median(calm)) * 1000:+.1f} ms (target ~0)")
    finally:
        sessions.close()


def main() -> None:
    import logging

    logging.basicConfig(level=logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", help="an existing broker; default: start the test broker")
    parser.add_argument("--memory", action="store_true", help="use the embedded broker")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1_000, 10_000, 100_000])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--only", choices=["conversion", "throughput", "latency"])
    parser.add_argument("--schema", action="store_true", help="give the stage the orders' schema")
    parser.add_argument("--modes", type=lambda s: s.split(","), default=["per-record", "per-task", "shared"],
                        help="Spark stage runs to compare: per-record, per-task (bulk, a job per task), shared")
    args = parser.parse_args()
    rest = (args.records, args.sizes, args.runs, args.partitions, args.only, args.schema, args.modes)
    if args.memory:
        asyncio.run(main_async(f"memory://spark-bench-{uuid.uuid4().hex[:6]}", *rest))
    elif args.bootstrap:
        asyncio.run(main_async(args.bootstrap, *rest))
    else:
        from tests.support.kafka_broker import KafkaBroker

        with KafkaBroker() as broker:
            asyncio.run(main_async(broker.bootstrap, *rest))


if __name__ == "__main__":
    main()
