"""The driver process's own CPU per record of a Spark stage right after its source, with
``read="driver"`` (this process fetches, decodes and frames every record) against
``read="executors"`` (Spark's executors read the offset ranges from Kafka themselves).

CPU is ``time.process_time()`` of this Python process only: not the Spark JVM (a child process on
``local[*]``), not Spark's Python workers. Each path runs twice over a pre-filled topic, on
``records`` and on a fifth of them, each run from the client's start until the input is
committed to its end; the figure is the marginal CPU, (CPU(N) − CPU(N/5)) / (N − N/5), so the
client's and the consumer group's fixed start-up cost cancels out. The stage is an aggregate
(a count per customer), so its output is a few rows per batch: what is measured is the input's
cost. ``python benchmarks/spark_bulk.py --read-cpu 100000`` runs it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aiokafka.admin import AIOKafkaAdminClient  # noqa: E402
from aiokafka.errors import GroupCoordinatorNotAvailableError  # noqa: E402

from streamloop import KafkaStreams, StreamsBuilder  # noqa: E402
from streamloop.records import TopicPartition  # noqa: E402
from streamloop.serdes import JsonSerde, StringSerde  # noqa: E402
from streamloop.transport import open_transport  # noqa: E402
from tests.support.cluster import Cluster  # noqa: E402

KEY, JSON = StringSerde(), JsonSerde()
PARTITIONS = 2
SCHEMA = "key string, customer string, amount long"


def per_customer(frame: Any) -> Any:
    from pyspark.sql import functions as F

    return frame.groupBy("customer").agg(F.count("*").alias("orders"), F.sum("amount").alias("total")) \
                .withColumnRenamed("customer", "key")


async def _fill(kafka: Cluster, topic: str, records: int) -> None:
    await kafka.create_topics({topic: PARTITIONS, f"{topic}-out": 1})
    chunk = 20_000
    for first in range(0, records, chunk):
        rows = [(f"c{i % 100}", {"customer": f"c{i % 100}", "amount": i % 1000, "note": "x" * 40})
                for i in range(first, min(records, first + chunk))]
        await kafka.produce(topic, rows, KEY, JSON, partitions=PARTITIONS)


async def _run(kafka: Cluster, bootstrap: str, topic: str, read: str, records: int) -> tuple[float, float]:
    """CPU seconds of this process and wall seconds to commit the topic's ``records`` with ``read``."""
    app = f"read-cpu-{read}-{uuid.uuid4().hex[:6]}"
    builder = StreamsBuilder()
    (builder.stream(topic, key_serde=KEY, value_serde=JSON)
            .spark_batch(per_customer, schema=SCHEMA, read=read, max_records=50_000, max_wait_ms=200)
            .to(f"{topic}-out", key_serde=KEY, value_serde=JSON))
    config = {"application.id": app, "bootstrap.servers": bootstrap, "commit.interval.ms": 200,
              "auto.offset.reset": "earliest", "spark.master": "local[2]"}
    ends = await kafka.end_offsets([TopicPartition(topic, p) for p in range(PARTITIONS)])
    assert sum(ends.values()) == records, ends
    # One admin client for the whole run, asked four times a second: the watch runs in the measured
    # process, and a client started per question (tests.support.cluster.committed_offset) cost more
    # CPU than the engine itself with read="executors" (about half of this process's samples).
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        cpu, wall = time.process_time(), time.monotonic()
        async with KafkaStreams(builder.build(), config):
            while True:
                if await _committed_to(admin, app, ends):
                    break
                await asyncio.sleep(0.25)
        return time.process_time() - cpu, time.monotonic() - wall
    finally:
        await admin.close()


async def _committed_to(admin: Any, group: str, ends: dict[TopicPartition, int]) -> bool:
    try:
        committed = await admin.list_consumer_group_offsets(group)
    except GroupCoordinatorNotAvailableError:
        return False  # the group's coordinator is being set up: it has committed nothing yet
    by_tp = {(tp.topic, tp.partition): meta.offset for tp, meta in committed.items()}
    return all(by_tp.get((tp.topic, tp.partition)) == end for tp, end in ends.items())


async def measure(bootstrap: str, records: int) -> dict[str, dict[str, float]]:
    from tests.support.spark import spark_session

    kafka = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    small = max(1, records // 5)
    topics = {}
    for size in (small, records):
        topics[size] = f"read-cpu-{size}-{uuid.uuid4().hex[:6]}"
        await _fill(kafka, topics[size], size)
    os.environ.setdefault("PYTHONPATH", str(ROOT))  # Spark's Python workers import this checkout's engine
    sessions = spark_session()
    next(sessions)  # started once, outside the measured runs; clients reuse it
    figures: dict[str, dict[str, float]] = {}
    try:
        for read in ("driver", "executors"):
            await _run(kafka, bootstrap, topics[small], read, small)  # warm-up: Python workers, JIT of plans
            cpu_small, _wall = await _run(kafka, bootstrap, topics[small], read, small)
            cpu_big, wall_big = await _run(kafka, bootstrap, topics[records], read, records)
            figures[read] = {
                "cpu_s": cpu_big, "wall_s": wall_big,
                "us_per_record_total": cpu_big / records * 1e6,
                "us_per_record_marginal": (cpu_big - cpu_small) / (records - small) * 1e6,
            }
    finally:
        sessions.close()
    return figures


def report(figures: dict[str, dict[str, float]], records: int) -> str:
    lines = [f"Driver process CPU per record, {records} records over {PARTITIONS} partitions "
             "(time.process_time of this process only)",
             f"{'read':<10} {'marginal µs/rec':>16} {'total µs/rec':>13} {'CPU s':>7} {'wall s':>7}"]
    for read, f in figures.items():
        lines.append(f"{read:<10} {f['us_per_record_marginal']:>16.2f} {f['us_per_record_total']:>13.2f} "
                     f"{f['cpu_s']:>7.2f} {f['wall_s']:>7.1f}")
    return "\n".join(lines)


def run_read_cpu(bootstrap: str | None, records: int) -> str:
    if bootstrap:
        return report(asyncio.run(measure(bootstrap, records)), records)
    from tests.support.kafka_broker import KafkaBroker

    with KafkaBroker() as broker:
        return report(asyncio.run(measure(broker.bootstrap, records)), records)


if __name__ == "__main__":
    print(run_read_cpu(sys.argv[2] if len(sys.argv) > 2 else None, int(sys.argv[1]) if len(sys.argv) > 1 else 100_000))
