"""Spark batch stages: throughput against per-record Python, the cost of the Arrow conversion,
and what a slow batch on one task adds to another task's latency.

1. Records/s of an enrichment (a join with a customer table and a computed column) through
   ``spark_batch`` with batches of 1k, 10k and 100k records, against the same logic as a
   per-record ``map_values`` with a dict lookup, on the same input.
2. The conversion alone: records to a DataFrame and its rows back, through Arrow (what the
   stage does) against plain Python rows (``createDataFrame(list of dicts)`` and ``collect()``).
3. Latency of partition 1's records while partition 0's task has a batch stuck for several
   seconds on the same stream thread, against the same run without the stuck batch (~0 added).

Run: ``python benchmarks/spark_stage.py`` (starts the test broker and a local[2] SparkSession),
``--memory`` for the embedded broker, ``--records``/``--sizes`` to change the load.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import KafkaStreams, StreamsBuilder  # noqa: E402
from engine.records import Record, TopicPartition  # noqa: E402
from engine.serdes import IntegerSerde, JsonSerde  # noqa: E402
from engine.spark.frames import to_frame, to_rows  # noqa: E402
from engine.transport import open_transport  # noqa: E402
from tests.support.cluster import Cluster  # noqa: E402

INT, JSON = IntegerSerde(), JsonSerde()
CUSTOMERS = 100
TIERS = {c: ("gold", "silver", "bronze")[c % 3] for c in range(CUSTOMERS)}
RATE = 0.92
STUCK_S = 5.0


def order(i: int) -> dict[str, Any]:
    return {"id": i, "customer": i % CUSTOMERS, "amount": float(i % 1000)}


async def wait_for_output(cluster: Cluster, topic: str, count: int, timeout: float = 900) -> None:
    reader = cluster.transport.reader(f"bench-{uuid.uuid4().hex[:6]}")
    await reader.start()
    tp = TopicPartition(topic, 0)
    deadline = time.monotonic() + timeout
    try:
        while True:
            end = (await reader.end_offsets([tp]))[tp]
            if end >= count:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{end} of {count} records after {timeout} s")
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


async def throughput(bootstrap: str, spark: Any, records: int, batch: int | None) -> tuple[float, float]:
    """Records/s through the enrichment, from the client's start to the last output record, and the
    growth of this process's resident memory meanwhile (MB): a Spark stage of ``batch``-record
    batches, or per-record Python (None)."""
    run = uuid.uuid4().hex[:6]
    source, sink = f"spark-in-{run}", f"spark-out-{run}"
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    await cluster.create_topics({source: 2, sink: 1})
    await cluster.produce(source, [(i % 2, order(i)) for i in range(records)], INT, JSON, partitions=2)
    builder = StreamsBuilder()
    stream = builder.stream(source, key_serde=INT, value_serde=JSON)
    if batch is None:
        stream = stream.map_values(lambda v: {"id": v["id"], "tier": TIERS[v["customer"]],
                                              "eur": v["amount"] * RATE})
    else:
        from pyspark.sql import functions as F

        tiers = spark.createDataFrame(list(TIERS.items()), ["customer", "tier"])
        stream = stream.spark_batch(
            lambda frame: frame.join(F.broadcast(tiers), "customer").select(
                "key", "id", "tier", (frame.amount * RATE).alias("eur")),
            max_records=batch, max_wait_ms=200)
    stream.to(sink, key_serde=INT, value_serde=JSON)
    streams = KafkaStreams(builder.build(), {
        "application.id": f"spark-bench-{run}", "bootstrap.servers": bootstrap, "num.stream.threads": 1,
        "commit.interval.ms": 1000, "max.poll.records": 5000, "buffered.records.per.partition": 5000,
    })
    base, peak, stop = resident_mb(), [0.0], asyncio.Event()
    sampler = asyncio.create_task(peak_resident(stop, peak))
    started = time.monotonic()
    async with streams:
        await wait_for_output(cluster, sink, records)
        elapsed = time.monotonic() - started
    stop.set()
    await sampler
    return records / max(elapsed, 1e-6), peak[0] - base


def conversion(spark: Any, size: int) -> tuple[float, float]:
    """Seconds to turn ``size`` records into a DataFrame and back: through Arrow, and as Python rows."""
    records = [Record(i % 2, order(i), 0) for i in range(size)]
    to_rows(to_frame(spark, records[:10], "key"), "warm-up")
    started = time.perf_counter()
    to_rows(to_frame(spark, records, "key"), "bench")
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


async def main_async(bootstrap: str, records: int, sizes: list[int], runs: int) -> None:
    from tests.support.spark import spark_session

    sessions = spark_session()
    spark = next(sessions)
    try:
        print(f"SparkSession {spark.sparkContext.master}, Arrow "
              f"{spark.conf.get('spark.sql.execution.arrow.pyspark.enabled')}; broker {bootstrap}\n")
        print("1. Conversion only (records -> DataFrame -> rows), median of 3:")
        for size in sizes:
            pairs = [conversion(spark, size) for _ in range(3)]
            arrow = statistics.median(p[0] for p in pairs)
            plain = statistics.median(p[1] for p in pairs)
            print(f"   {size:>7,} records: Arrow {arrow * 1000:8.1f} ms ({size / arrow:>9,.0f} rec/s), "
                  f"Python rows {plain * 1000:8.1f} ms ({size / plain:>9,.0f} rec/s): {plain / arrow:.1f}x")

        print(f"\n2. Enrichment of {records:,} records (2 partitions, 1 stream thread), median of {runs}:")
        python = None
        for size in [None, *sizes]:
            results = [await throughput(bootstrap, spark, records, size) for _ in range(runs)]
            rate = statistics.median(r[0] for r in results)
            grown = max(r[1] for r in results)
            python = python or rate
            label = "per-record Python (map_values)" if size is None else f"spark_batch, batches of {size:>7,}"
            print(f"   {label:<36} {rate:>9,.0f} records/s ({rate / python:.2f}x), "
                  f"resident memory +{grown:,.0f} MB")

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
    args = parser.parse_args()
    if args.memory:
        asyncio.run(main_async(f"memory://spark-bench-{uuid.uuid4().hex[:6]}", args.records, args.sizes, args.runs))
    elif args.bootstrap:
        asyncio.run(main_async(args.bootstrap, args.records, args.sizes, args.runs))
    else:
        from tests.support.kafka_broker import KafkaBroker

        with KafkaBroker() as broker:
            asyncio.run(main_async(broker.bootstrap, args.records, args.sizes, args.runs))


if __name__ == "__main__":
    main()
