"""Spark benchmark of issue "spark-bulk": the docs' order enrichment (JSON orders keyed by customer,
broadcast join with a 100-row customer table, JSON out) on the same pre-filled topics, in one run:

- **Structured Streaming**: Spark's Kafka source and sink (``benchmarks/peers/spark_structured.py``)
  in its own venv ``.cache/spark-sss-venv`` with pyspark pinned to ``SSS_PYSPARK`` and the
  ``spark-sql-kafka-0-10`` jars of that version fetched with Maven
  (``benchmarks/peers/spark_structured_pom.xml``), made by this script when missing;
- **streamloop ``spark_batch``**: the engine's Spark stage (``tests/support/spark_enrichment.py``);
- **streamloop ``spark_batch``, ``read="executors"``** (``spark_exec``): the same stage with Spark's
  executors reading each task's offset ranges and writing the output topic themselves;
- **streamloop per-record**: the same join as a ``map_values`` in Python.

Each runs in its own process (one SparkContext each) on ``local[*]``; its clock starts when its
Spark session is up ("ready") and stops at the broker's append time of the last output record
(output topics use ``LogAppendTime``). Figures: throughput at 200k and 1M records (4 partitions);
latency p50/p99 (output append time minus the produce time carried in each order) while a
producer offers 2 000 and 20 000 rec/s (after a warm-up at that rate of a third of the run);
and ``spark_batch`` on a Spark-bound variant of the job
(a SHA-512 chain per row) on a standalone cluster of 1 and of 2 workers. Every run's output is read
back and checked (count and content). One table with ratios against Structured Streaming, a plot,
and ``--json`` for the raw figures (``--from-json`` prints and plots them again without a run).

Run: ``python benchmarks/spark_bulk.py`` (starts the test broker), ``--quick`` for a smoke run
(small counts, short latency runs), ``--plot PATH`` for the figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from streamloop.records import TopicPartition  # noqa: E402
from streamloop.serdes import JsonSerde, StringSerde  # noqa: E402
from streamloop.transport import open_transport  # noqa: E402
from streamloop.transport.base import ProducerSettings  # noqa: E402
from tests.support.cluster import Cluster  # noqa: E402
from tests.support.spark_cluster import SparkCluster  # noqa: E402
from tests.support.spark_enrichment import check_output, customer, order  # noqa: E402

SSS_PYSPARK = "4.2.0"
SSS_VENV = ROOT / ".cache" / "spark-sss-venv"
SSS_JARS = ROOT / ".cache" / "spark-sss" / SSS_PYSPARK / "jars"
# What the engine's modules (and the test tooling that starts the broker) need in that venv:
# benchmarks/spark_exec_cost.py runs the executors' cycles there, beside Spark's Kafka connector.
SSS_ENGINE_DEPS = ("orjson", "aiokafka", "anyio", "pytest")
SSS_POM = ROOT / "benchmarks" / "peers" / "spark_structured_pom.xml"
PARTITIONS = 4
KEY, JSON = StringSerde(), JsonSerde()
SYSTEMS = ("structured", "spark_batch", "spark_exec", "per_record")
LABELS = {"structured": "Spark Structured Streaming", "spark_batch": "streamloop spark_batch",
          "spark_exec": "streamloop spark_batch, read=executors", "per_record": "streamloop per-record Python"}
# The spark_batch stage with its executors reading the ranges and writing the sink (no row in this process).
EXECUTORS = {"spark.batch.read": "executors"}


@dataclass
class Figures:
    throughput: dict[str, dict[int, float]] = field(default_factory=dict)   # system -> records -> rec/s
    # The same, clocked from the first output record: start-up (the query's or the client's) left out.
    steady: dict[str, dict[int, float]] = field(default_factory=dict)
    latency: dict[str, dict[int, tuple[float, float]]] = field(default_factory=dict)  # -> rate -> p50, p99 s
    achieved: dict[int, float] = field(default_factory=dict)  # offered rate -> what the producer reached
    workers: dict[int, float] = field(default_factory=dict)   # standalone workers -> rec/s (Spark-bound)
    problems: list[str] = field(default_factory=list)


# -- the Structured Streaming side's environment ----------------------------------------------------
def sss_environment() -> tuple[Path, Path]:
    """The pinned pyspark venv and the connector's jars, made once under ``.cache/``."""
    python = SSS_VENV / "bin" / "python"
    imports = ", ".join(("pyspark", "sys", *SSS_ENGINE_DEPS))
    probe = [str(python), "-c", f"import {imports}; sys.exit(pyspark.__version__ != '{SSS_PYSPARK}')"]
    if not python.exists() or subprocess.run(probe, capture_output=True).returncode != 0:
        print(f"making {SSS_VENV.relative_to(ROOT)} (pyspark=={SSS_PYSPARK}) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(SSS_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"pyspark=={SSS_PYSPARK}", "pyarrow", "pandas",
                        *SSS_ENGINE_DEPS],
                       check=True)
    if not any(SSS_JARS.glob("spark-sql-kafka-0-10_2.13-*.jar")):
        print(f"fetching the spark-sql-kafka-0-10 {SSS_PYSPARK} connector with Maven ...", flush=True)
        staging = SSS_JARS.with_name("jars.partial")
        subprocess.run(["mvn", "-q", "-B", "-f", str(SSS_POM), f"-Dspark.version={SSS_PYSPARK}",
                        "-DexcludeTransitive=true", f"-DoutputDirectory={staging}", "dependency:copy-dependencies"],
                       check=True, stdin=subprocess.DEVNULL)
        staging.rename(SSS_JARS)
    return python, SSS_JARS


# -- processes ------------------------------------------------------------------------------------
class Child:
    """A system under test in its own process; its JSON events are read from its output file."""

    def __init__(self, args: Sequence[str], out: Path) -> None:
        self.out_path = out
        self._out = open(out, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(list(args), stdin=subprocess.DEVNULL, stdout=self._out,
                                     stderr=subprocess.STDOUT, cwd=ROOT,
                                     # Spark's Python workers (the executors' reads and writes) import
                                     # this checkout's engine and its dependencies.
                                     env={**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable})

    def event(self, kind: str, **match: Any) -> dict[str, Any] | None:
        for line in self.out_path.read_bytes().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if (isinstance(event, dict) and event.get("event") == kind
                    and all(event.get(k) == v for k, v in match.items())):
                return event
        return None

    async def wait_for(self, kind: str, timeout: float = 180, **match: Any) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (event := self.event(kind, **match)) is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"no '{kind}' event:\n{self.tail()}")
            await asyncio.sleep(0.05)
        return event

    def events(self, kind: str) -> list[dict[str, Any]]:
        found = []
        for line in self.out_path.read_bytes().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("event") == kind:
                found.append(event)
        return found

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.out_path.read_bytes().decode(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()


class Bench:
    def __init__(self, bootstrap: str, workdir: Path, batch: dict[str, Any] | None = None) -> None:
        self.bootstrap = bootstrap
        # Client settings for the spark_batch runs on top of the engine's defaults (``--batch``).
        self.batch = batch or {}
        self.kafka = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
        self.workdir = workdir
        self.sss: tuple[Path, Path] | None = None
        self.row_wise = True  # the enrichment is row-wise: one plan per job (``streamloop.spark.row_wise``)

    def start(self, system: str, source: str, sink: str, *, settings: dict[str, Any] | None = None,
              extra: Sequence[str] = ()) -> Child:
        run = uuid.uuid4().hex[:6]
        out = self.workdir / f"{system}-{run}.out"
        if system == "structured":
            assert self.sss is not None
            python, jars = self.sss
            return Child([str(python), str(ROOT / "benchmarks" / "peers" / "spark_structured.py"),
                          "--bootstrap", self.bootstrap, "--source", source, "--sink", sink, "--jars", str(jars),
                          "--checkpoint", str(self.workdir / f"checkpoint-{run}"), *extra], out)
        if system in ("spark_batch", "spark_exec") and self.row_wise:
            extra = ["--row-wise", *extra]
        base = {"spark.master": "local[*]", "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                "spark.sql.shuffle.partitions": "4", "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1", "num.stream.threads": 1, "commit.interval.ms": 1000,
                "max.poll.records": 5000, "buffered.records.per.partition": 5000, "poll.ms": 20}
        if system in ("spark_batch", "spark_exec"):
            settings = {**self.batch, **(EXECUTORS if system == "spark_exec" else {}), **(settings or {})}
        mode = "python" if system == "per_record" else "spark"
        return Child([sys.executable, "-m", "tests.support.spark_enrichment", "--bootstrap", self.bootstrap,
                      "--application-id", f"spark-bulk-{system}-{run}", "--source", source, "--sink", sink,
                      "--mode", mode, "--warm", "--settings", json.dumps({**base, **(settings or {})}), *extra], out)

    async def fill(self, count: int, stamp: bool = False) -> str:
        source = f"orders-{count}-{uuid.uuid4().hex[:6]}"
        await create(self.kafka, source, PARTITIONS)
        await self.kafka.produce(source, ((customer(i), order(i, int(time.time() * 1000) if stamp else 0))
                                          for i in range(count)), KEY, JSON, partitions=PARTITIONS)
        return source

    async def sink(self) -> str:
        name = f"enriched-{uuid.uuid4().hex[:8]}"
        await create(self.kafka, name, 1, {"message.timestamp.type": "LogAppendTime"})
        return name

    async def end_offset(self, topic: str) -> int:
        tp = TopicPartition(topic, 0)
        return (await self.kafka.end_offsets([tp]))[tp]

    async def until_output(self, child: Child, sink: str, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while await self.end_offset(sink) < count:
            if child.proc.poll() is not None:
                raise RuntimeError(f"{child.out_path.name} exited:\n{child.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{await self.end_offset(sink)} of {count} records after {timeout} s")
            await asyncio.sleep(0.05)

    async def verified(self, sink: str, count: int, what: str, problems: list[str]) -> list[Any]:
        records = await self.kafka.read_all(sink, timeout=300)
        decoded = [(KEY.deserialize(r.key), JSON.deserialize(r.value)) for r in records]
        found = check_output(decoded, count)
        if found:
            problems.append(f"{what}: {found[:3]}")
        return records

    async def throughput(self, system: str, source: str, count: int, problems: list[str],
                         settings: dict[str, Any] | None = None, extra: Sequence[str] = (),
                         events: list[dict[str, Any]] | None = None) -> tuple[float, float]:
        """Records/s from the process's "ready" to the last output record, and from the first output
        record to the last (each system's start-up left out, its first batch's latency kept in).
        ``events``: the child's "job" and "progress" events are added to it (``--breakdown``)."""
        sink = await self.sink()
        child = self.start(system, source, sink, settings=settings, extra=extra)
        try:
            ready = (await child.wait_for("ready"))["time"]
            await self.until_output(child, sink, count, timeout=1800)
        finally:
            child.stop()
        if events is not None:
            events.extend(child.events("job") + child.events("progress"))
        records = await self.verified(sink, count, f"{system} {count}", problems)
        first, last = (f(r.timestamp for r in records) / 1000.0 for f in (min, max))
        return count / max(last - ready, 1e-3), count / max(last - first, 1e-3)

    async def latency(self, system: str, rate: int, seconds: float, problems: list[str]) -> tuple[float, float, float]:
        source = f"orders-rate-{uuid.uuid4().hex[:6]}"
        await create(self.kafka, source, PARTITIONS)
        sink = await self.sink()
        child = self.start(system, source, sink)
        # The first records meet cold paths (Spark's first jobs, the Kafka connector starting):
        # a warm-up of a third of the run is produced at the same rate and left out.
        warmup = seconds / 3
        count = int(rate * (seconds + warmup))
        try:
            await child.wait_for("ready")
            if system == "structured":
                await child.wait_for("started")
            else:
                # Every partition assigned (RUNNING may come before a fresh topic's partitions are
                # known to the group): records flow from the first one produced.
                await child.wait_for("tasks", count=PARTITIONS)
            began = time.time()
            achieved = await offer(self.kafka, source, rate, count)
            await self.until_output(child, sink, count, timeout=600)
        finally:
            child.stop()
        records = await self.verified(sink, count, f"{system} at {rate}/s", problems)
        measured_from = (began + warmup) * 1000
        delays = sorted((r.timestamp - value["ts"]) / 1000.0 for r in records
                        if (value := JSON.deserialize(r.value))["ts"] >= measured_from)
        return percentile(delays, 50), percentile(delays, 99), achieved


async def create(kafka: Cluster, topic: str, partitions: int, config: dict[str, str] | None = None) -> None:
    admin = kafka.transport.admin("bench-admin")
    await admin.start()
    try:
        await admin.create_topics({topic: partitions}, configs={topic: config or {}})
    finally:
        await admin.close()


async def offer(kafka: Cluster, topic: str, rate: int, count: int) -> float:
    """Produce ``count`` orders at ``rate`` rec/s (ticks of 10 ms), each stamped with its produce
    time; returns the rate reached."""
    from aiokafka.partitioner import murmur2

    producer = kafka.transport.producer(ProducerSettings(client_id="bench-rate", linger_ms=1))
    await producer.start()
    started = time.monotonic()
    sent = 0
    try:
        while sent < count:
            due = min(count, int((time.monotonic() - started) * rate) + 1)
            while sent < due:
                name = customer(sent)
                key = KEY.serialize(name)
                partition = (murmur2(key) & 0x7FFFFFFF) % PARTITIONS
                producer.append(topic, partition, key, JSON.serialize(order(sent, int(time.time() * 1000))), None, ())
                sent += 1
            # Appended records may wait in the producer until a flush: send each tick's now, or
            # their send stamps would run ahead of the time they reach the broker.
            await producer.flush()
            await asyncio.sleep(0.01)
        await producer.flush()
    finally:
        await producer.close()
    return count / (time.monotonic() - started)


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, round(pct / 100 * (len(values) - 1)))]


# -- where a job's time goes ----------------------------------------------------------------------
# The engine's phases (``streamloop.spark.timing``) and Structured Streaming's durationMs keys shown.
SS_PHASES = ("latestOffset", "getBatch", "queryPlanning", "addBatch", "walCommit", "commitOffsets",
             "triggerExecution")


async def breakdown(bench: Bench, args: argparse.Namespace, problems: list[str]) -> str:
    """Each size through ``spark_batch`` (each variant of ``--variants``) with its jobs timed, and
    through Structured Streaming in batches of the same size (``maxOffsetsPerTrigger``); a table
    of the median job's phases (ms) and the total over the run's jobs (µs per record)."""
    from streamloop.spark.timing import PHASES

    size = int(bench.batch.get("spark.batch.max.records", 10_000))
    lines = [f"Where a job's time goes: jobs of up to {size:,} records (median ms per job; "
             "µs per record over all jobs)", ""]
    for count in args.sizes:
        source = await bench.fill(count)
        runs: list[tuple[str, float, list[dict[str, Any]]]] = []
        for variant in args.variants:
            bench.row_wise = variant == "row_wise"
            # "before": per part, each part's frame a local relation (Spark's own default, as the
            # engine had it before it made frames of one partition per Arrow batch).
            local = {"spark.sql.execution.arrow.localRelationThreshold": str(64 << 20)} if variant == "before" else {}
            events: list[dict[str, Any]] = []
            _rate, steady = await bench.throughput("spark_batch", source, count, problems, extra=["--timings"],
                                                   events=events, settings=local)
            runs.append((f"spark_batch ({variant})", steady, events))
        if "structured" in args.systems:
            events = []
            _rate, steady = await bench.throughput("structured", source, count, problems,
                                                   extra=["--max-offsets", str(size)], events=events)
            runs.append(("Structured Streaming", steady, events))
        lines.append(f"{count:,} records:")
        lines.append("| run | rec/s from the first output | jobs | " + " | ".join(PHASES) + " | total |")
        lines.append("|---" * (len(PHASES) + 4) + "|")
        for name, steady, events in runs:
            jobs = [e for e in events if e["event"] == "job"]
            if jobs:
                cells = [_phase(jobs, phase) for phase in PHASES]
                total = _phase(jobs, None)
                lines.append(f"| {name} | {steady:,.0f} | {len(jobs)} | " + " | ".join(cells) + f" | {total} |")
                continue
            batches = [b for e in events for b in e.get("batches", []) if b.get("rows")]
            cells = [f"{key} {_median([b['durationMs'].get(key, 0) for b in batches]):.0f}"
                     for key in SS_PHASES]
            rows = sum(b["rows"] for b in batches) or 1
            per = sum(b["durationMs"].get("triggerExecution", 0) for b in batches) * 1000 / rows
            lines.append(f"| {name} | {steady:,.0f} | {len(batches)} | " + ", ".join(cells)
                         + f" (ms; {per:.1f} µs/rec over triggerExecution) |")
        lines.append("")
    return "\n".join(lines)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0


def _phase(jobs: list[dict[str, Any]], phase: str | None) -> str:
    """A phase's (None: all phases') median ms per job and µs per record over all jobs."""
    per_job = [sum(j["phases"].values()) if phase is None else j["phases"].get(phase, 0.0) for j in jobs]
    records = sum(j["records"] for j in jobs) or 1
    return f"{_median(per_job) * 1000:.1f} ({sum(per_job) * 1e6 / records:.1f})"


# -- the run ---------------------------------------------------------------------------------------
async def run(bootstrap: str, args: argparse.Namespace, workdir: Path) -> Figures:
    bench = Bench(bootstrap, workdir, args.batch)
    figures = Figures()
    bench.sss = sss_environment() if "structured" in args.systems else None
    if args.breakdown:
        print(await breakdown(bench, args, figures.problems), flush=True)
        return figures
    systems = [s for s in SYSTEMS if s in args.systems]
    for count in args.sizes:
        source = await bench.fill(count)
        for system in systems:
            rate, steady = await bench.throughput(system, source, count, figures.problems)
            figures.throughput.setdefault(system, {})[count] = rate
            figures.steady.setdefault(system, {})[count] = steady
            print(f"  throughput {LABELS[system]:<30} {count:>9,}: {rate:>10,.0f} rec/s from ready, "
                  f"{steady:>10,.0f} rec/s from the first output", flush=True)
    for rate in args.rates:
        for system in systems:
            p50, p99, achieved = await bench.latency(system, rate, args.seconds, figures.problems)
            figures.latency.setdefault(system, {})[rate] = (p50, p99)
            figures.achieved[rate] = min(figures.achieved.get(rate, achieved), achieved)
            print(f"  latency {LABELS[system]:<30} at {rate:>6,}/s (reached {achieved:,.0f}): "
                  f"p50 {p50:.3f} s, p99 {p99:.3f} s", flush=True)
    if args.workers_records:
        source = await bench.fill(args.workers_records)
        for workers in (1, 2):
            with SparkCluster(workers=workers) as spark:
                settings = {**spark.client_settings(executor_memory="768m"),
                            "spark.sql.shuffle.partitions": "4"}
                rate, _steady = await bench.throughput("spark_batch", source, args.workers_records, figures.problems,
                                                       settings=settings, extra=["--heavy", str(args.heavy)])
            figures.workers[workers] = rate
            print(f"  Spark-bound spark_batch on {workers} standalone worker(s): {rate:,.0f} rec/s", flush=True)
    return figures


def table(figures: Figures) -> str:
    systems = [s for s in SYSTEMS if s in figures.throughput or s in figures.latency]
    head = "| | " + " | ".join(LABELS[s] for s in systems) + " |"
    lines = [head, "|---" * (len(systems) + 1) + "|"]

    def ratio(value: float, base: float | None, higher_better: bool) -> str:
        if base is None or base <= 0 or value <= 0:
            return ""
        return f" ({value / base:.2f}×)" if higher_better else f" ({base / value:.2f}× faster)"

    for count in sorted({c for per in figures.throughput.values() for c in per}):
        base = figures.throughput.get("structured", {}).get(count)
        cells = [f"{figures.throughput[s][count]:,.0f} rec/s" + (ratio(figures.throughput[s][count], base, True)
                                                                 if s != "structured" else "")
                 for s in systems if count in figures.throughput.get(s, {})]
        lines.append(f"| throughput, {count:,} records, from ready | " + " | ".join(cells) + " |")
        base = figures.steady.get("structured", {}).get(count)
        cells = [f"{figures.steady[s][count]:,.0f} rec/s" + (ratio(figures.steady[s][count], base, True)
                                                             if s != "structured" else "")
                 for s in systems if count in figures.steady.get(s, {})]
        lines.append(f"| throughput, {count:,} records, from the first output | " + " | ".join(cells) + " |")
    for rate in sorted({r for per in figures.latency.values() for r in per}):
        base99 = figures.latency.get("structured", {}).get(rate, (None, None))[1]
        cells = []
        for s in systems:
            p50, p99 = figures.latency[s][rate]
            cells.append(f"p50 {p50:.3f} s, p99 {p99:.3f} s" + (ratio(p99, base99, False) if s != "structured" else ""))
        reached = figures.achieved.get(rate, 0)
        lines.append(f"| latency at {rate:,} rec/s offered (reached {reached:,.0f}) | " + " | ".join(cells) + " |")
    if figures.workers:
        one, two = figures.workers.get(1, 0), figures.workers.get(2, 0)
        lines.append("")
        lines.append(f"Spark-bound `spark_batch` on a standalone cluster: 1 worker {one:,.0f} rec/s, "
                     f"2 workers {two:,.0f} rec/s ({two / one if one else 0:.2f}×)")
    return "\n".join(lines)


def plot(figures: Figures, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = [s for s in SYSTEMS if s in figures.throughput]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4))
    counts = sorted({c for per in figures.throughput.values() for c in per})
    width = 0.8 / max(1, len(systems))
    for i, s in enumerate(systems):
        xs = [j + i * width for j in range(len(counts))]
        # Both clocks in one bar: the light one from the first output, the narrow dark one from ready.
        bars = left.bar(xs, [figures.steady[s].get(c, 0) for c in counts], width, alpha=0.45, label=LABELS[s])
        colour = bars.patches[0].get_facecolor()
        left.bar(xs, [figures.throughput[s].get(c, 0) for c in counts], width * 0.45, color=colour, alpha=1.0)
    left.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(counts))],
                    [f"{c:,} records" for c in counts])
    left.set_ylabel("records/s")
    left.set_title("Throughput: from the first output (wide), from ready (narrow)", fontsize=10)
    left.legend(fontsize=8, loc="upper left", framealpha=0.9)
    left.set_ylim(0, max(v for per in figures.steady.values() for v in per.values()) * 1.35)
    rates = sorted({r for per in figures.latency.values() for r in per})
    for i, s in enumerate([s for s in SYSTEMS if s in figures.latency]):
        right.bar([j + i * width for j in range(len(rates))], [figures.latency[s][r][1] for r in rates], width,
                  label=LABELS[s])
    right.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(rates))],
                     [f"{r:,} rec/s" for r in rates])
    right.set_yscale("log")
    right.set_ylabel("p99 latency (s, log)")
    right.set_title("p99 latency at an offered rate")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def load_figures(path: Path) -> Figures:
    """What ``--json`` wrote: JSON's keys are strings, the figures' counts and rates ints."""
    raw = json.loads(path.read_text())

    def by_int(per: dict[str, Any]) -> dict[int, Any]:
        return {int(k): tuple(v) if isinstance(v, list) else v for k, v in per.items()}

    return Figures(throughput={s: by_int(v) for s, v in raw["throughput"].items()},
                   steady={s: by_int(v) for s, v in raw["steady"].items()},
                   latency={s: by_int(v) for s, v in raw["latency"].items()},
                   achieved=by_int(raw["achieved"]), workers=by_int(raw["workers"]), problems=raw["problems"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run: small counts, short latency runs")
    parser.add_argument("--bootstrap", default=None, help="an existing broker (default: start the test broker)")
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument("--sizes", type=int, nargs="+", default=None)
    parser.add_argument("--rates", type=int, nargs="+", default=None)
    parser.add_argument("--seconds", type=float, default=None, help="length of each latency run")
    parser.add_argument("--workers-records", type=int, default=None, help="0 skips the 1-vs-2-workers run")
    parser.add_argument("--heavy", type=int, default=64, help="SHA-512 rounds per row of the Spark-bound job")
    parser.add_argument("--batch", type=json.loads, default={},
                        help='JSON of spark.batch.* settings for the spark_batch runs (default: the engine\'s)')
    parser.add_argument("--breakdown", action="store_true",
                        help="only where a job's time goes: --sizes through spark_batch (each of --variants) "
                             "with its jobs timed, and through Structured Streaming in batches of the same size")
    parser.add_argument("--variants", nargs="+", default=["before", "per_part", "row_wise"],
                        choices=["before", "per_part", "row_wise"],
                        help="--breakdown's spark_batch runs: the function applied per task's part (with local "
                             "relations as before, or frames of a partition per Arrow batch), or once per job "
                             "(streamloop.spark.row_wise)")
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    parser.add_argument("--from-json", type=Path, default=None, metavar="PATH",
                        help="no run: the table (and --plot) of figures an earlier run wrote with --json")
    parser.add_argument("--read-cpu", type=int, default=None, metavar="RECORDS",
                        help="only this process's CPU per record, read='driver' against read='executors' "
                             "(benchmarks/spark_read_cpu.py), over RECORDS records")
    args = parser.parse_args(argv)
    if args.from_json is not None:
        figures = load_figures(args.from_json)
        print(table(figures))
        if args.plot:
            plot(figures, args.plot)
        return 0
    if args.read_cpu is not None:
        from benchmarks.spark_read_cpu import run_read_cpu

        print(run_read_cpu(args.bootstrap, args.read_cpu))
        return 0
    args.sizes = args.sizes or ([5_000] if args.quick else [200_000, 1_000_000])
    args.rates = args.rates or [2_000, 20_000]
    args.seconds = args.seconds or (3.0 if args.quick else 15.0)
    if args.workers_records is None:
        args.workers_records = 4_000 if args.quick else 100_000

    with tempfile.TemporaryDirectory(prefix="spark-bulk-") as tmp:
        if args.bootstrap:
            figures = asyncio.run(run(args.bootstrap, args, Path(tmp)))
        else:
            from tests.support.kafka_broker import KafkaBroker

            with KafkaBroker() as broker:
                figures = asyncio.run(run(broker.bootstrap, args, Path(tmp)))
    if not args.breakdown:
        print()
        print(table(figures))
    if figures.problems:
        print("\nOUTPUT PROBLEMS:\n" + "\n".join(figures.problems))
    if args.plot:
        plot(figures, args.plot)
        print(f"\nplot: {args.plot}")
    if args.json:
        args.json.write_text(json.dumps(asdict(figures), indent=1))
    return 1 if figures.problems else 0


if __name__ == "__main__":
    sys.exit(main())
