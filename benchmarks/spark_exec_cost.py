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

Run: ``python benchmarks/spark_exec_cost.py`` (starts the test broker), ``--records N``,
``--rounds N``. Prints seconds per cycle and µs per record; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
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


class Cycles:
    def __init__(self, session: Any, bootstrap: str, source: str, sink: str) -> None:
        from streamloop.spark.schema import resolve_schema

        self.session = session
        self.kafka = {"bootstrap_servers": bootstrap}
        self.source, self.sink = source, sink
        self.schema = resolve_schema(session, SCHEMA)
        self.positions = [0] * PARTITIONS

    def _take(self, records: int) -> list[KafkaRange]:
        ranges = []
        for p in range(PARTITIONS):
            ranges.append(KafkaRange(self.source, p, self.positions[p], self.positions[p] + records))
            self.positions[p] += records
        return ranges

    def _jobs(self, ranges: list[KafkaRange]) -> tuple[float, float]:
        """One read and one write job over ``ranges``: the seconds of each."""
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


def session_for_bench() -> Any:
    from pyspark.sql import SparkSession

    from streamloop.spark.session import session_settings

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master("local[*]").appName("spark-exec-cost")
    settings = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                "spark.sql.shuffle.partitions": "4", "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1"}
    for key, value in session_settings(settings).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    session.range(10).count()  # the session's own first job, left out
    return session


def run(bootstrap: str, records: int, rounds: int) -> str:
    with tempfile.TemporaryDirectory(prefix="spark-exec-cost-") as tmp:
        bench = Bench(bootstrap, Path(tmp))

        async def topics() -> tuple[str, str]:
            # Keys spread over the 4 partitions unevenly (murmur2 of 100 customers): room for every cycle.
            return await bench.fill(PARTITIONS * 3 * (2 * rounds * records + 8)), await bench.sink()

        source, sink = asyncio.run(topics())
        cycles = Cycles(session_for_bench(), bootstrap, source, sink)
        lines = [f"Spark jobs of read='executors' over {PARTITIONS} ranges (local[*], {os.cpu_count()} cores; "
                 "seconds: cycle = read + write)", "",
                 "| cycle | ranges' jobs | records per range | cycle s | read s | write s | µs per record |",
                 "|---|---|---|---|---|---|---|"]

        def row(name: str, per_range: int, shared: bool) -> None:
            total, read, write = cycles.cycle(per_range, shared)
            per = f"{total * 1e6 / (per_range * PARTITIONS):.1f}" if per_range > 1 else "-"
            lines.append(f"| {name} | {'shared' if shared else 'alone'} | {per_range:,} | {total:.2f} | {read:.2f} | "
                         f"{write:.2f} | {per} |")
            print(lines[-1], flush=True)

        row("cold (first use)", 1, True)
        for _ in range(rounds):
            for shared in (False, True):
                row("fixed cost", 1, shared)
                row("batch", records, shared)
        return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", default=None, help="an existing broker (default: start the test broker)")
    parser.add_argument("--records", type=int, default=10_000, help="records per range of a batch cycle")
    parser.add_argument("--rounds", type=int, default=2, help="alone/shared pairs of each cycle")
    args = parser.parse_args(argv)
    if args.bootstrap:
        print("\n" + run(args.bootstrap, args.records, args.rounds))
        return 0
    from tests.support.kafka_broker import KafkaBroker

    with KafkaBroker() as broker:
        print("\n" + run(broker.bootstrap, args.records, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
