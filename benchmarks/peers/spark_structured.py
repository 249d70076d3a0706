"""The order enrichment as a Spark Structured Streaming query: Kafka source, the same broadcast join
with the customer table, Kafka sink. The Spark benchmark's peer (benchmarks/spark_bulk.py).

Runs in the benchmark's own venv (pinned pyspark + the ``spark-sql-kafka-0-10`` jars fetched with
Maven), never imports the engine:

    python benchmarks/peers/spark_structured.py --bootstrap H:P --source IN --sink OUT \\
        --jars DIR --checkpoint DIR [--master local[*]]

Prints ``{"event": "ready", "time": <epoch s>}`` once the SparkSession is up (the benchmark's
clock starts there, as for the engine's processes) and ``{"event": "started"}`` once the query's
first micro-batch is done; runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path

CUSTOMERS = 100
RATE = 0.92
TIERS = ("gold", "silver", "bronze")
SCHEMA = "id long, customer string, amount double, ts long"


def emit(event: str, **fields: object) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--jars", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--max-offsets", type=int, default=None,
                        help="maxOffsetsPerTrigger: records per micro-batch (default: all there are)")
    args = parser.parse_args()

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    jars = ",".join(str(p) for p in sorted(Path(args.jars).glob("*.jar")))
    session = (SparkSession.builder.appName("structured-streaming-enrichment").master(args.master)
               .config("spark.jars", jars).config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.sql.streaming.numRecentProgressUpdates", "10000")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    names = [f"c{c:03d}" for c in range(CUSTOMERS)]
    customers = session.createDataFrame([(n, TIERS[int(n[1:]) % 3]) for n in names],
                                        "customer string, tier string").cache()
    customers.count()
    emit("ready", time=time.time())

    orders = (session.readStream.format("kafka").option("kafka.bootstrap.servers", args.bootstrap)
              .option("subscribe", args.source).option("startingOffsets", "earliest")
              .options(**({} if args.max_offsets is None else {"maxOffsetsPerTrigger": str(args.max_offsets)}))
              .load()
              .select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("o")).select("o.*"))
    enriched = (orders.join(F.broadcast(customers), "customer")
                .select(F.col("customer").alias("key"),
                        F.to_json(F.struct("id", "customer", "amount", "tier",
                                           (F.col("amount") * RATE).alias("eur"), "ts")).alias("value")))
    query = (enriched.writeStream.format("kafka").option("kafka.bootstrap.servers", args.bootstrap)
             .option("topic", args.sink).option("checkpointLocation", args.checkpoint)
             .option("kafka.linger.ms", "5").start())

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    started = False
    while not stop.is_set() and query.isActive:
        if not started and query.lastProgress is not None:
            started = True
            emit("started")
        stop.wait(0.05)
    if query.exception() is not None:
        emit("error", error=str(query.exception())[:2000])
    # Each micro-batch's own durations (addBatch, getBatch, queryPlanning, triggerExecution, ...),
    # for the benchmark's breakdown of where a batch's time goes.
    emit("progress", batches=[{"rows": p.numInputRows, "durationMs": dict(p.durationMs)}
                              for p in query.recentProgress])
    query.stop()
    session.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
