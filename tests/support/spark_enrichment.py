"""The order-enrichment job of docs/spark.md, shared by the Spark cluster tests and benchmark.

JSON orders ``{"id", "customer", "amount", "ts"}`` keyed by customer are joined (broadcast) with a
small customer table and leave as JSON ``{"id", "customer", "amount", "tier", "eur", "ts"}`` under
the same key. ``ts`` is the order's produce time (ms), carried through so a sink topic with
``message.timestamp.type=LogAppendTime`` gives each record's end-to-end latency.

It runs in its own process, because a process has one SparkContext and the test session's is a
``local[2]`` one that a client in the test process would reuse:

    python -m tests.support.spark_enrichment --bootstrap HOST:PORT --application-id APP \\
        --source IN --sink OUT [--mode spark|python] [--settings JSON] [--heavy N] [--fail-at ID] [--slow-ms MS]

It prints one JSON object a line: ``{"event": "ready", "time": <epoch s>}`` just before the
client starts (with ``--warm``, once the SparkSession is up), ``{"event": "state", "state": ...}``,
``{"event": "tasks", "count": N}`` (active tasks, when it changes), ``{"event": "handler",
"error": ..., "chain": [type names]}`` (the uncaught-exception handler, which answers
SHUTDOWN_CLIENT) and ``{"event": "final", "state": ...}``; it exits on a terminal state or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import time
from collections.abc import Iterable
from typing import Any

from tests.support.app_process import emit, run_until_stopped

CUSTOMERS = 100
RATE = 0.92
TIERS = ("gold", "silver", "bronze")
SCHEMA = "key string, id long, customer string, amount double, ts long"
OUTPUT_FIELDS = ("id", "customer", "amount", "tier", "eur", "ts")


def customer(i: int) -> str:
    return f"c{i % CUSTOMERS:03d}"


def tier(name: str) -> str:
    return TIERS[int(name[1:]) % len(TIERS)]


def order(i: int, ts: int = 0) -> dict[str, Any]:
    return {"id": i, "customer": customer(i), "amount": float(i % 1000) + 0.5, "ts": ts}


def enriched(value: dict[str, Any]) -> dict[str, Any]:
    """What per-record Python makes of one order (and what Spark must make of it)."""
    return {"id": value["id"], "customer": value["customer"], "amount": value["amount"],
            "tier": tier(value["customer"]), "eur": value["amount"] * RATE, "ts": value["ts"]}


def check_output(records: Iterable[tuple[Any, dict[str, Any]]], count: int) -> list[str]:
    """Problems with the output of ``count`` orders ``0..count-1`` (empty: all there and right).

    Every id must be there (duplicates allowed: at-least-once), each under its customer's key
    with its tier and ``eur`` computed from its amount.
    """
    problems: list[str] = []
    seen: set[int] = set()
    for key, value in records:
        i = value.get("id")
        if not isinstance(i, int) or not 0 <= i < count:
            problems.append(f"unknown id in {value!r}")
            continue
        seen.add(i)
        want = order(i)
        if key != want["customer"] or value.get("customer") != want["customer"]:
            problems.append(f"id {i}: key {key!r}, customer {value.get('customer')!r}")
        if value.get("tier") != tier(want["customer"]):
            problems.append(f"id {i}: tier {value.get('tier')!r}")
        if value.get("amount") != want["amount"] or abs(value.get("eur", -1.0) - want["amount"] * RATE) > 1e-6:
            problems.append(f"id {i}: amount {value.get('amount')!r}, eur {value.get('eur')!r}")
        if len(problems) > 10:
            break
    missing = count - len(seen)
    if missing:
        problems.append(f"{missing} of {count} ids missing (first: {sorted(set(range(count)) - seen)[:5]})")
    return problems


_customer_frames: dict[int, Any] = {}


def customers_frame(session: Any) -> Any:
    """The customer table, made once per SparkSession (small: it is broadcast to every task)."""
    frame = _customer_frames.get(id(session))
    if frame is None:
        names = [customer(c) for c in range(CUSTOMERS)]
        frame = session.createDataFrame([(n, tier(n)) for n in names], "customer string, tier string").cache()
        _customer_frames[id(session)] = frame
    return frame


def enrich(orders: Any, heavy: int = 0, fail_at: int | None = None, slow_ms: int = 0) -> Any:
    """The Spark side: the broadcast join and the computed column.

    ``heavy`` > 0 makes the job Spark-bound (a chain of SHA-512 per row, in the executors, spread
    over at least 4 partitions) without changing its output; ``fail_at`` makes the executors
    raise on that order id (a job error from inside Spark, not from the driver's Python);
    ``slow_ms`` makes each row take that long in the executors, so a batch lasts long enough
    for a test to kill a worker while it runs.
    """
    from pyspark.sql import functions as F

    if heavy:
        orders = orders.repartition(4)
        digest = F.col("customer")
        for _ in range(heavy):
            digest = F.sha2(digest, 512)
        # Kept only as a filter that never drops a row, so the optimizer must compute it.
        orders = orders.where(F.length(digest) == 128)
    if slow_ms:
        orders = orders.repartition(2).where(F.expr(
            f"coalesce(reflect('java.lang.Thread', 'sleep', cast({slow_ms} as bigint)), 'slept') is not null"))
    if fail_at is not None:
        orders = orders.withColumn(
            "id", F.when(F.col("id") == fail_at, F.raise_error(F.lit(f"order {fail_at} is bad")))
                   .otherwise(F.col("id")))
    joined = orders.join(F.broadcast(customers_frame(orders.sparkSession)), "customer")
    return joined.select("key", "id", "customer", "amount", "tier",
                         (F.col("amount") * RATE).alias("eur"), "ts")


def build(args: argparse.Namespace) -> Any:
    from streamloop import KafkaStreams, StreamsBuilder
    from streamloop.handlers import StreamThreadExceptionResponse
    from streamloop.serdes import JsonSerde, StringSerde
    from tests.support.apps import streams_config

    key, json_serde = StringSerde(), JsonSerde()
    builder = StreamsBuilder()
    stream = builder.stream(args.source, key_serde=key, value_serde=json_serde)
    if args.mode == "python":
        stream = stream.map_values(enriched)
    else:
        heavy, fail_at, slow_ms = args.heavy, args.fail_at, args.slow_ms

        def job(frame: Any) -> Any:
            return enrich(frame, heavy, fail_at, slow_ms)

        if args.row_wise:
            from streamloop.spark import row_wise

            job = row_wise(job)
        stream = stream.spark_batch(job, schema=SCHEMA,
                                    max_records=args.max_records, max_wait_ms=args.max_wait_ms,
                                    value_columns=list(OUTPUT_FIELDS), name="enrich")
    stream.to(args.sink, key_serde=key, value_serde=json_serde)
    config = streams_config(args.bootstrap, args.application_id, **json.loads(args.settings))
    streams = KafkaStreams(builder.build(), config)

    def handler(exc: BaseException) -> Any:
        chain, current = [], exc
        while current is not None and len(chain) < 8:
            chain.append(type(current).__name__)
            current = current.__cause__
        emit("handler", error=repr(exc)[:2000], chain=chain)
        return StreamThreadExceptionResponse.SHUTDOWN_CLIENT

    streams.set_uncaught_exception_handler(handler)
    streams.set_state_listener(lambda new, _old: emit("state", state=new.name))
    return streams


def warm_up(settings: dict[str, Any], mode: str) -> None:
    """Start the SparkSession the client will reuse, so a benchmark's clock starts with Spark up
    (as it does for Structured Streaming, whose query starts on a running session)."""
    if mode != "spark":
        return
    from pyspark.sql import SparkSession

    from streamloop.spark.session import session_settings

    builder = SparkSession.builder.appName("streamloop-enrichment")
    for key, value in session_settings(settings).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    customers_frame(session).count()



def main(argv: list[str] | None = None) -> int:

    parser = argparse.ArgumentParser(prog="python -m tests.support.spark_enrichment")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--application-id", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--mode", choices=["spark", "python"], default="spark")
    parser.add_argument("--settings", default="{}", help="JSON object of extra client settings")
    parser.add_argument("--max-records", type=int, default=None)
    parser.add_argument("--max-wait-ms", type=int, default=None)
    parser.add_argument("--heavy", type=int, default=0)
    parser.add_argument("--fail-at", type=int, default=None)
    parser.add_argument("--slow-ms", type=int, default=0)
    parser.add_argument("--row-wise", action="store_true",
                        help="mark the job row_wise (one plan per job for the thread's tasks)")
    parser.add_argument("--timings", action="store_true",
                        help='print each Spark job\'s phases as {"event": "job", ...} (streamloop.spark.timing)')
    parser.add_argument("--warm", action="store_true",
                        help="start the SparkSession (and cache the customer table) before the client")
    args = parser.parse_args(argv)

    streams = build(args)
    if args.timings:
        from streamloop.spark import timing

        timing.record_jobs(lambda clock: emit("job", records=clock.records, parts=clock.parts,
                                              phases=clock.phases))
    if args.warm:
        warm_up(json.loads(args.settings), args.mode)
    emit("ready", time=time.time())
    return run_until_stopped(streams)


if __name__ == "__main__":
    sys.exit(main())


class EnrichmentProcess:
    """The app above in a child process; its events are read from its output file."""

    def __init__(self, out: Any, *args: str) -> None:
        import os
        import subprocess

        self._out_path = out
        self._out = open(out, "wb")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.spark_enrichment", *args],
                                     stdin=subprocess.DEVNULL, stdout=self._out, stderr=subprocess.STDOUT,
                                     env=env)

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        found = []
        with open(self._out_path, "rb") as out:
            for line in out:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # Spark's own log lines
                if isinstance(event, dict) and (kind is None or event.get("event") == kind):
                    found.append(event)
        return found

    def output(self, lines: int = 40) -> str:
        with open(self._out_path, "rb") as out:
            return "\n".join(out.read().decode(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 90.0) -> int:
        import subprocess

        if self.events("final"):
            # The client is closed already; the process is on its way out (its JVM ending).
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._out.close()
        return code
