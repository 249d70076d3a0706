"""What a cycle of ``read="executors"`` costs: the Spark jobs over 4 tasks' ranges, timed in phases.

With a direct sink, each cycle of the executors' path is two Spark jobs over the ranges: a read
(``kafka_reader.read_ranges``: the Python data source planned, the ranges fetched, decoded and
persisted, the side rows collected) and a write (``kafka_reader.write_ranges``: the enrichment of
docs/spark.md applied, its rows serialized and produced by the executors, acknowledged). This
script calls those functions directly on a ``local[*]`` session over a pre-filled topic of 4
partitions, as the engine's tasks do, and prints each phase's seconds for:

- a cold cycle (the session's first use of the two data sources: Spark's Python workers start),
  then cycles of 1 record per range (the fixed cost of a cycle), then of ``--records`` per range;
- each of those two ways: ``shared`` (the 4 ranges in one read and one write job: the default for a
  direct sink and a row-wise function, ``streamloop.tasks.range_jobs``) and ``alone`` (a read and a
  write job per range, the 4 ranges' jobs running at once on 4 threads, as 4 tasks without
  sharing run them).

``--client connector`` times the same cycles through Spark's own Kafka connector (the JVM fetches
and produces; our serdes decode and serialize in ``mapInArrow``: ``spark_connector_cycle.py``),
``connector-one-job`` through the connector in one job a cycle (no read job: what asking the
handlers before the write costs), ``connector-jvm`` and ``connector-jvm-one-job`` the same with the
JSON decoded and encoded in the JVM (``from_json``/``to_json``: Structured Streaming's own plan, no
Python worker), ``all`` all five, interleaved round by round, in one run (or a comma-separated
list of them). The connector exists for the pinned pyspark only (``spark_bulk.SSS_PYSPARK``), so
those runs re-run the script in that venv, the engine's cycles too.

Run: ``python benchmarks/spark_exec_cost.py`` (starts the test broker), ``--records N``,
``--rounds N``, ``--client engine|connector|...|all``. Prints seconds per cycle and
µs per record; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.spark_bulk import JSON, KEY, PARTITIONS, Bench  # noqa: E402
from streamloop.spark.kafka_source import KafkaRange, ReadSpec  # noqa: E402
from tests.support.spark_enrichment import OUTPUT_FIELDS, SCHEMA, enrich  # noqa: E402

ENGINE, CONNECTOR, ONE_JOB, JVM, JVM_ONE_JOB, ALL = ("engine", "connector", "connector-one-job", "connector-jvm",
                                                    "connector-jvm-one-job", "all")
CLIENTS = {ENGINE: "Python data sources (the engine)", CONNECTOR: "Spark's Kafka connector",
           ONE_JOB: "Spark's Kafka connector, one job (no handler asked first)",
           JVM: "Spark's Kafka connector, JSON in the JVM",
           JVM_ONE_JOB: "Spark's Kafka connector, JSON in the JVM, one job"}


class Cycles:
    def __init__(self, session: Any, bootstrap: str, source: str, sink: str) -> None:
        from streamloop.spark.schema import resolve_schema

        self.session = session
        self.kafka = {"bootstrap_servers": bootstrap}
        self.source, self.sink = source, sink
        self.schema = resolve_schema(session, SCHEMA)
        self.positions = [0] * PARTITIONS
        self.client = ENGINE

    def _take(self, records: int) -> list[KafkaRange]:
        ranges = []
        for p in range(PARTITIONS):
            ranges.append(KafkaRange(self.source, p, self.positions[p], self.positions[p] + records))
            self.positions[p] += records
        return ranges

    def _jobs(self, ranges: list[KafkaRange]) -> tuple[float, float]:
        """One read and one write job over ``ranges``: the seconds of each."""
        if self.client in (CONNECTOR, ONE_JOB):
            return self._connector_jobs(ranges)
        if self.client in (JVM, JVM_ONE_JOB):
            return self._jvm_jobs(ranges)
        from streamloop.spark.kafka_reader import read_ranges, write_ranges
        from streamloop.spark.kafka_writer import WriteSpec

        session = self.session
        spec = ReadSpec(self.kafka, tuple(ranges), KEY, JSON, "key", self.schema)
        began = time.perf_counter()
        frame, _outcomes = read_ranges(session, spec)
        read = time.perf_counter()
        stamps = tuple(range(len(ranges))) if len(ranges) > 1 else ()
        write = WriteSpec(self.kafka, self.sink, 1, "key", OUTPUT_FIELDS, KEY, JSON, 0, stamps)
        try:
            write_ranges(session, frame, enrich, spec, write, list(range(len(ranges))))
        finally:
            frame.unpersist()
        return read - began, time.perf_counter() - read

    def _connector_jobs(self, ranges: list[KafkaRange]) -> tuple[float, float]:
        from benchmarks import spark_connector_cycle as connector

        bootstrap = self.kafka["bootstrap_servers"]
        began = time.perf_counter()
        frame, _side = connector.read_ranges(self.session, bootstrap, ranges, KEY, JSON, "key", self.schema,
                                              ask_first=self.client == CONNECTOR)
        read = time.perf_counter()
        try:
            connector.write_ranges(self.session, bootstrap, frame, enrich, self.schema, self.sink, 1, "key",
                                   OUTPUT_FIELDS, KEY, JSON)
        finally:
            frame.unpersist()
        return read - began, time.perf_counter() - read

    def _jvm_jobs(self, ranges: list[KafkaRange]) -> tuple[float, float]:
        from benchmarks import spark_connector_cycle as connector

        bootstrap = self.kafka["bootstrap_servers"]
        began = time.perf_counter()
        frame, _side = connector.read_ranges_jvm(self.session, bootstrap, ranges, "key", self.schema,
                                                  ask_first=self.client == JVM)
        read = time.perf_counter()
        try:
            connector.write_ranges_jvm(bootstrap, frame, enrich, self.schema, self.sink, "key", OUTPUT_FIELDS)
        finally:
            frame.unpersist()
        return read - began, time.perf_counter() - read

    def cycle(self, records: int, shared: bool) -> tuple[float, float, float]:
        """Seconds of the whole cycle, of its read and of its write (the slowest task's when alone)."""
        ranges = self._take(records)
        began = time.perf_counter()
        if shared:
            read, write = self._jobs(ranges)
        else:
            with ThreadPoolExecutor(len(ranges)) as pool:
                phases = list(pool.map(lambda r: self._jobs([r]), ranges))
            read, write = max(p[0] for p in phases), max(p[1] for p in phases)
        return time.perf_counter() - began, read, write


def session_for_bench(jars: str | None) -> Any:
    from pyspark.sql import SparkSession

    from streamloop.spark.session import session_settings

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master("local[*]").appName("spark-exec-cost")
    settings = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                "spark.sql.shuffle.partitions": "4", "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1"}
    if jars:
        settings["spark.jars"] = jars
    for key, value in session_settings(settings).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    session.range(10).count()  # the session's own first job, left out
    return session


def run(bootstrap: str, records: int, rounds: int, clients: list[str], jars: str | None) -> str:
    with tempfile.TemporaryDirectory(prefix="spark-exec-cost-") as tmp:
        bench = Bench(bootstrap, Path(tmp))

        async def topics() -> tuple[str, str]:
            # Keys spread over the 4 partitions unevenly (murmur2 of 100 customers): room for every cycle.
            need = PARTITIONS * 3 * len(clients) * (2 * rounds * records + 8)
            return await bench.fill(need), await bench.sink()

        source, sink = asyncio.run(topics())
        import pyspark

        cycles = Cycles(session_for_bench(jars), bootstrap, source, sink)
        lines = [f"Spark jobs of read='executors' over {PARTITIONS} ranges (local[*], {os.cpu_count()} cores, "
                 f"pyspark {pyspark.__version__}; seconds: cycle = read + write)", "",
                 "| Kafka client | cycle | ranges' jobs | records per range | cycle s | read s | write s "
                 "| µs per record |",
                 "|---|---|---|---|---|---|---|---|"]

        def row(name: str, per_range: int, shared: bool) -> None:
            total, read, write = cycles.cycle(per_range, shared)
            per = f"{total * 1e6 / (per_range * PARTITIONS):.1f}" if per_range > 1 else "-"
            lines.append(f"| {CLIENTS[cycles.client]} | {name} | {'shared' if shared else 'alone'} | {per_range:,} | "
                         f"{total:.2f} | {read:.2f} | {write:.2f} | {per} |")
            print(lines[-1], flush=True)

        for index, client in enumerate(clients):
            cycles.client = client
            # Only the first client's first cycle starts Spark's Python workers.
            row("cold (first use)" if index == 0 else "first use (Python workers up)", 1, True)
        for _ in range(rounds):
            for client in clients:  # interleaved: the clients share each round's machine load
                cycles.client = client
                for shared in (False, True):
                    row("fixed cost", 1, shared)
                    row("batch", records, shared)
        return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", default=None, help="an existing broker (default: start the test broker)")
    parser.add_argument("--records", type=int, default=10_000, help="records per range of a batch cycle")
    parser.add_argument("--rounds", type=int, default=2, help="alone/shared pairs of each cycle")
    parser.add_argument("--client", default=ENGINE,
                        help="who reads and writes Kafka on the executors: the engine's Python data sources, "
                             "Spark's Kafka connector (benchmarks/spark_connector_cycle.py), the connector in one "
                             "job a cycle, the connector with JSON decoded and encoded in the JVM (one or two "
                             "jobs), or all of them in one run; a comma-separated list picks several")
    args = parser.parse_args(argv)
    clients = list(CLIENTS) if args.client == ALL else args.client.split(",")
    if unknown := set(clients) - set(CLIENTS):
        parser.error(f"--client: unknown {', '.join(sorted(unknown))}; choose from {', '.join([*CLIENTS, ALL])}")
    jars = None
    if set(clients) - {ENGINE}:
        import pyspark

        from benchmarks.spark_bulk import SSS_PYSPARK, sss_environment

        python, jar_dir = sss_environment()
        if pyspark.__version__ != SSS_PYSPARK:
            # The connector exists for the pinned pyspark only: run again in its venv, every client
            # on the same Spark.
            env = {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": str(python)}
            return subprocess.run([str(python), __file__, *(argv if argv is not None else sys.argv[1:])],
                                  env=env).returncode
        jars = ",".join(str(jar) for jar in sorted(jar_dir.glob("*.jar")))
    if args.bootstrap:
        print("\n" + run(args.bootstrap, args.records, args.rounds, clients, jars))
        return 0
    from tests.support.kafka_broker import KafkaBroker

    with KafkaBroker() as broker:
        print("\n" + run(broker.bootstrap, args.records, args.rounds, clients, jars))
    return 0


if __name__ == "__main__":
    sys.exit(main())
