"""The demo behind ``make demo``: an order pipeline on the embedded broker.

Orders flow into ``orders`` (4 partitions) while a client with two stream
threads keeps those of at least 10, flags the VIP ones and writes them to
``big-orders``. With pyspark installed (``streamloop[spark]``) the big orders also
go through a Spark stage on ``local[*]``: per micro-batch, the count and total per
customer, written to ``customer-totals``. The demo prints live progress, then what
went in and came out.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import random
import sys
import tempfile
import time
from collections import Counter
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import anyio.to_thread

from streamloop import ClientState, KafkaStreams, StreamsBuilder
from streamloop.records import TopicPartition
from streamloop.serdes import JsonSerde, StringSerde
from streamloop.transport import open_transport
from streamloop.transport.base import ProducerSettings

ORDERS, BIG_ORDERS, CUSTOMER_TOTALS = "orders", "big-orders", "customer-totals"


def spark_installed() -> bool:
    return importlib.util.find_spec("pyspark") is not None and importlib.util.find_spec("pyarrow") is not None


def build_topology(builder: StreamsBuilder, with_spark: bool = False) -> None:
    big = (builder.stream(ORDERS, key_serde=StringSerde(), value_serde=JsonSerde())
                  .filter(lambda key, order: order["amount"] >= 10)
                  .map_values(lambda order: {**order, "vip": order["amount"] > 1000}))
    big.to(BIG_ORDERS, key_serde=StringSerde(), value_serde=JsonSerde())
    if with_spark:
        (big.spark_batch(totals_per_customer, max_records=5_000, max_wait_ms=500, name="spark-totals")
            .to(CUSTOMER_TOTALS, key_serde=StringSerde(), value_serde=JsonSerde()))


# Quiet and small: the demo's batches are a few thousand records on this machine's cores.
DEMO_SPARK = {
    "spark.master": "local[*]",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
}

# Spark's JVM logs its start-up warnings (hostname, native libraries, the default profile) through
# log4j before any ``setLogLevel`` can run: only a configuration given to the JVM at launch keeps
# them out of the demo's output. Errors still show. Spark's own loggers are named as well: when the
# level of the one that starts the shell differs from the root's, Spark prints how to change it.
QUIET_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
logger.spark.name = org.apache.spark
logger.spark.level = error
appender.console.type = Console
appender.console.name = stderr
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n
"""


def spark_settings(show_logs: bool, workdir: str) -> dict[str, str]:
    """The demo session's settings; unless ``show_logs``, with the JVM's log4j at ERROR (its
    configuration written into ``workdir``, which must outlive the session's start)."""
    settings = dict(DEMO_SPARK)
    if not show_logs:
        path = os.path.join(workdir, "log4j2-quiet.properties")
        with open(path, "w", encoding="utf-8") as file:
            file.write(QUIET_LOG4J)
        settings["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{path}"
    return settings


def start_spark(show_logs: bool = False) -> tuple[Any, bool]:
    """The demo's SparkSession, started before the client (which then uses it) so the progress
    below is not held up by Spark's start-up; and whether the demo started it (a session already
    running in the process is only borrowed: its owner stops it)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    # pyspark's one record of the process's running context (no public accessor across threads).
    borrowed = SparkContext._active_spark_context is not None
    builder = SparkSession.builder.appName("streamloop-demo")
    with tempfile.TemporaryDirectory(prefix="streamloop-demo-") as workdir:
        for key, value in spark_settings(show_logs, workdir).items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()  # the JVM has read its log4j configuration once this returns
    session.sparkContext.setLogLevel("ERROR")
    return session, not borrowed


def totals_per_customer(orders: Any) -> Any:
    """A per-batch aggregate, run by Spark: orders and amount per customer (the record key)."""
    from pyspark.sql import functions as F

    return orders.groupBy("key").agg(F.count("*").alias("orders"), F.round(F.sum("amount"), 2).alias("total"))


async def produce_orders(bootstrap: str, count: int, rate: int, seed: int) -> list[dict[str, Any]]:
    transport = open_transport({"bootstrap.servers": bootstrap})
    admin = transport.admin("demo-admin")
    await admin.start()
    await admin.create_topics({ORDERS: 4, BIG_ORDERS: 4, CUSTOMER_TOTALS: 1})
    await admin.close()
    producer = transport.producer(ProducerSettings(client_id="demo-producer"))
    await producer.start()
    rng = random.Random(seed)
    orders = []
    customers = [f"customer-{i}" for i in range(20)]
    started = time.monotonic()
    for i in range(count):
        order: dict[str, Any] = {"id": i, "customer": rng.choice(customers),
                                 "amount": round(rng.expovariate(1 / 200), 2)}
        orders.append(order)
        key = order["customer"].encode()
        producer.append(ORDERS, hash(order["customer"]) % 4, key, JsonSerde().serialize(order), None, ())
        if i % 100 == 99:
            await producer.flush()
            # Pace the input so the progress is visible.
            ahead = (i + 1) / rate - (time.monotonic() - started)
            if ahead > 0:
                await anyio.sleep(ahead)
    await producer.flush()
    await producer.close()
    return orders


async def read_output(bootstrap: str, topic: str = BIG_ORDERS, partitions: int = 4) -> list[Any]:
    transport = open_transport({"bootstrap.servers": bootstrap})
    reader = transport.reader("demo-reader")
    await reader.start()
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    reader.assign(tps)
    for tp in tps:
        reader.seek(tp, 0)
    ends = await reader.end_offsets(tps)
    out: list[Any] = []
    seen = dict.fromkeys(tps, 0)
    while any(seen[tp] < ends[tp] for tp in tps):
        for tp, records in (await reader.poll(100, 10_000)).items():
            out.extend(records)
            if records:
                seen[TopicPartition(tp.topic, tp.partition)] = records[-1].offset + 1
    await reader.close()
    return out


async def main_async(count: int, rate: int, threads: int, with_spark: bool = False, spark_logs: bool = False) -> int:
    bootstrap = "memory://demo"
    spark_note = " -> spark_batch(totals per customer) on local[*]" if with_spark else ""
    print(f"streamloop demo: {count} orders through filter(amount >= 10) -> map_values(vip){spark_note} "
          f"on the embedded broker ({bootstrap}), {threads} stream threads\n")
    builder = StreamsBuilder()
    build_topology(builder, with_spark)
    topology = builder.build()
    print(topology.describe())
    session, owned = None, False
    if with_spark:
        print("Starting Spark on local[*] (a few seconds)...")
        started_spark = time.monotonic()
        session, owned = await anyio.to_thread.run_sync(start_spark, spark_logs)
        print(f"Spark is up after {time.monotonic() - started_spark:.1f} s\n")
    try:
        return await run_pipeline(bootstrap, topology, count, rate, threads, with_spark)
    finally:
        if owned and session is not None:
            await anyio.to_thread.run_sync(session.stop)


async def run_pipeline(bootstrap: str, topology: Any, count: int, rate: int, threads: int, with_spark: bool) -> int:
    async with anyio.create_task_group() as group:
        result = await _run_pipeline(group, bootstrap, topology, count, rate, threads, with_spark)
        group.cancel_scope.cancel()  # the producer, should the client have failed before the input was in
    return result


async def _run_pipeline(group: anyio.abc.TaskGroup, bootstrap: str, topology: Any, count: int, rate: int,
                        threads: int, with_spark: bool) -> int:
    """The orders are produced in ``group`` while the client runs; returns once all are out."""
    orders: list[dict[str, Any]] = []
    produced = anyio.Event()

    async def produce() -> None:
        orders.extend(await produce_orders(bootstrap, count, rate, seed=42))
        produced.set()

    group.start_soon(produce)
    await anyio.lowlevel.checkpoint()  # let the producer create the topics first
    while not produced.is_set() and "orders" not in await _topics(bootstrap):  # noqa: ASYNC110 - polls the broker
        await anyio.sleep(0.01)
    streams = KafkaStreams(topology, {
        "application.id": "orders-app",
        "bootstrap.servers": bootstrap,
        "num.stream.threads": threads,
        "commit.interval.ms": 200,
        **(DEMO_SPARK if with_spark else {}),
    })
    started = time.monotonic()
    async with streams:
        last = (-1, -1)
        while True:
            polled = int(sum(m.value for m in streams.metrics() if m.name == "records-polled-total"))
            written = await _output_count(bootstrap)
            if (polled, written) != last:
                print(f"  t={time.monotonic() - started:5.2f}s  state={streams.state.name:<12} "
                      f"records in={polled:>7}  out={written:>7}")
                last = (polled, written)
            # Done once every kept order is out (the expected count is known once input is complete).
            kept = sum(1 for o in orders if o["amount"] >= 10) if produced.is_set() else None
            if kept is not None and written >= kept and (not with_spark or await _counted(bootstrap) >= kept):
                break
            if streams.state is ClientState.ERROR:
                print("The client went to ERROR; see the log above", file=sys.stderr)
                return 1
            await anyio.sleep(0.25)
        threads_meta = streams.metadata_for_local_threads()
    elapsed = time.monotonic() - started
    output = await read_output(bootstrap)
    expected = [o for o in orders if o["amount"] >= 10]
    vip = sum(1 for r in output if JsonSerde().deserialize(r.value)["vip"])
    per_partition = Counter(r.partition for r in output)
    print(f"\nIn:  {len(orders)} orders on '{ORDERS}'")
    print(f"Out: {len(output)} orders on '{BIG_ORDERS}' ({len(orders) - len(expected)} dropped by the filter, "
          f"{vip} flagged VIP), per partition {dict(sorted(per_partition.items()))}")
    for meta in threads_meta:
        tasks = ", ".join(sorted(str(t.task_id) for t in meta.active_tasks))
        print(f"Thread {meta.thread_name}: tasks [{tasks}]")
    if with_spark:
        totals = [JsonSerde().deserialize(r.value) for r in await read_output(bootstrap, CUSTOMER_TOTALS, 1)]
        counted = sum(t["orders"] for t in totals)
        print(f"Spark: {len(totals)} per-batch customer totals on '{CUSTOMER_TOTALS}', counting {counted} orders "
              f"worth {sum(t['total'] for t in totals):,.2f}")
    print(f"Took {elapsed:.2f} s; the client closed cleanly ({streams.state.name}).")
    ok = len(output) >= len(expected) and {o["id"] for o in expected} <= {
        JsonSerde().deserialize(r.value)["id"] for r in output}
    if with_spark:
        ok = ok and counted >= len(expected)
    print("Check: every kept order is in the output" if ok else "Check FAILED: orders are missing")
    return 0 if ok else 1


async def _counted(bootstrap: str) -> int:
    """Orders counted so far by the Spark totals."""
    return sum(JsonSerde().deserialize(r.value)["orders"] for r in await read_output(bootstrap, CUSTOMER_TOTALS, 1))


async def _output_count(bootstrap: str) -> int:
    reader = open_transport({"bootstrap.servers": bootstrap}).reader("demo-progress")
    await reader.start()
    try:
        ends = await reader.end_offsets([TopicPartition(BIG_ORDERS, p) for p in range(4)])
        return sum(ends.values())
    finally:
        await reader.close()


async def _topics(bootstrap: str) -> dict[str, int]:
    admin = open_transport({"bootstrap.servers": bootstrap}).admin("demo-admin")
    await admin.start()
    try:
        return await admin.partition_counts([ORDERS, BIG_ORDERS])
    finally:
        await admin.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options, on its own parser or on ``streamloop demo``'s."""
    parser.add_argument("--orders", type=int, default=20_000, help="orders to produce (default: %(default)s)")
    parser.add_argument("--rate", type=int, default=10_000, help="orders per second (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2, help="stream threads (default: %(default)s)")
    parser.add_argument("--spark", action=argparse.BooleanOptionalAction, default=None,
                        help="add the Spark stage (default: when pyspark is installed)")
    parser.add_argument("--spark-logs", action="store_true",
                        help="show Spark's own log (its JVM's warnings); by default only its errors")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Run the demo with the options of ``add_arguments``."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(threadName)s %(message)s")
    with_spark = spark_installed() if args.spark is None else args.spark
    return anyio.run(main_async, args.orders, args.rate, args.threads, with_spark, args.spark_logs, backend="asyncio")


if __name__ == "__main__":
    sys.exit(main())
