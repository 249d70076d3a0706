"""streamloop against its peers, in one run, on one real Kafka broker and the same input.

Peers: streamloop; a bare aiokafka consume→transform→produce loop (the practical
ceiling of an aiokafka-based engine); faust-streaming; quixstreams; and Apache Kafka
Streams itself (``benchmarks/java/StreamsBench.java``, jars fetched with Maven) as the
reference. Each peer runs as its own process (``benchmarks/peers/``).

Workloads (``benchmarks/workloads.py``): (1) stateless JSON filter/map, (2) stateful
count per key (streamloop's only once ``KStream.group_by_key`` exists), (3) an async
processor awaiting 5 ms of I/O per record, (4) a Spark batch stage, streamloop's
only (``benchmarks/spark_stage.py``, run when it is present).

Figures: records/s (min/median/max over ``--runs``), p50/p99 end-to-end latency at a
fixed rate below saturation, peak RSS of the processing process; each also as a ratio
to streamloop's. Written to ``docs/benchmarks.md`` and ``docs/benchmarks.png``.
How each figure is measured: ``benchmarks/measure.py``.

Run: ``make bench`` (starts the test broker once), ``--quick`` for a short check,
``--bootstrap host:port`` for an existing broker.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import traceback
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import measure
from benchmarks.broker_io import create_topics, produce, produce_timed, warm_up
from benchmarks.dsl_workloads import DSL_WORKLOADS, JOIN_GRACE_ENV, JOIN_GRACE_MS, DslExpectation, DslWorkload
from benchmarks.peers import PEERS
from benchmarks.report import PeerFigures, Report, WorkloadFigures, chart, markdown, raw_ratios
from benchmarks.workloads import PARTITIONS, WORKLOADS, Expectation, Workload, make_inputs

ROOT = Path(__file__).resolve().parents[1]
SPARK_STAGE = ROOT / "benchmarks" / "spark_stage.py"
KAFKA_VERSION = "4.1.1"


def scrub(text: str) -> str:
    """Errors go into a committed page: no path of this machine in them."""
    return text.replace(str(ROOT), "<repo>").replace(tempfile.gettempdir(), "<tmp>")


def error_text(exc: BaseException) -> str:
    return scrub(f"{type(exc).__name__}: {exc}")[:600]


def first_line(cmd: list[str]) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
        return (proc.stdout + proc.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({type(exc).__name__})"


def machine() -> list[str]:
    cpu = "unknown CPU"
    mem = "unknown"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
        kib = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                       if line.startswith("MemTotal")))
        mem = f"{kib / 2**20:.1f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    return [f"{platform.system()} {platform.release()} {platform.machine()}", f"{cpu}, {os.cpu_count()} cores",
            f"memory {mem}", f"Python {platform.python_version()}", f"Java: {first_line(['java', '-version'])}",
            "the broker, the harness and the peer share the machine",
            "load average (1, 5, 15 min) at the start: " + load()]


def load() -> str:
    try:
        return ", ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def versions(selected: list[str]) -> list[str]:
    lines = [f"Apache Kafka broker {KAFKA_VERSION} (KRaft, single node, tests/support/kafka_broker.py)"]
    for key in selected:
        lines.append(f"{PEERS[key].NAME}: {PEERS[key].version()}")
    return lines


METHOD = [
    "Each workload's input is produced once (keys = 1,000 customers, 4 partitions); every peer and run "
    "reads that same topic with a fresh consumer group and writes its own output topic.",
    "Before the first run the input is read once through a consumer group, so the broker is warm for every "
    "peer. Each peer runs as its own process; runs alternate between peers (the order rotates every run).",
    "records/s = input records / (last output append time − start of processing). The start is the last "
    "moment the peer's consumer group was seen not yet Stable (polled every 20 ms), so process start-up and "
    "group join do not count, and no run is timed shorter than it was. Output topics use "
    "`message.timestamp.type=LogAppendTime` (the broker's clock, on the same machine). min / median / max over "
    "the runs.",
    "Latency: a fresh input topic; once the peer's group is Stable, a producer at a fixed rate (below every "
    "peer's saturation) stamping each "
    "record with its send time; after a warm-up (until the peer's first output, then `--latency-warmup` s more), "
    "for `--latency-seconds`; "
    "latency = output append time − send time. p50 and p99 of those records.",
    "Peak RSS: `VmHWM` of the peer's process (the Python process or the JVM) just before it is stopped; "
    "the largest over the runs.",
    "Settings: each peer with its own knob for the workload (column *setting*); commit interval 1 s and "
    "producer linger 5 ms where the peer has them.",
]


async def run_spark_stage(bootstrap: str, records: int, timeout: float) -> list[str]:
    """(4) streamloop's Spark batch stage against its per-record version, when the script exists."""
    lines = ["## (4) Spark batch stage (streamloop only)", ""]
    if not SPARK_STAGE.is_file():
        return [*lines, "Not run: `benchmarks/spark_stage.py` is not in this tree yet.", ""]
    cmd = [sys.executable, str(SPARK_STAGE), "--bootstrap", bootstrap, "--records", str(records)]
    print(f"\n(4) spark: {' '.join(cmd[1:])}", flush=True)
    try:
        proc = await asyncio.to_thread(subprocess.run, cmd, cwd=ROOT, capture_output=True, text=True,
                                       timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return [*lines, f"**Failed**: no result within {timeout:.0f} s.", ""]
    output = scrub(proc.stdout.strip())
    print(output, flush=True)
    if proc.returncode != 0:
        tail = scrub("\n".join(proc.stderr.strip().splitlines()[-10:]))
        return [*lines, f"**Failed** (exit {proc.returncode}):", "", "```text", tail or output, "```", ""]
    return [*lines, f"`python benchmarks/spark_stage.py --records {records}` printed:", "",
            "```text", output, "```", ""]


async def dsl_input(workload: DslWorkload, count: int, bootstrap: str) -> tuple[str, DslExpectation]:
    """A DSL workload's input topics (comma-separated, in the order the peers take them), filled."""
    tag = uuid.uuid4().hex[:6]
    topics = {role: f"bench-{workload.name}-{role}-{tag}" for role in workload.topics}
    inputs = workload.inputs(count)
    await create_topics(bootstrap, list(topics.values()), [])
    await produce_timed(bootstrap, [(topics[role], key, value, at) for role, key, value, at in inputs])
    for role, topic in topics.items():
        await warm_up(bootstrap, topic, sum(1 for r in inputs if r[0] == role))
    return ",".join(topics.values()), workload.expectation(inputs)


async def run_workload(name: str, args: argparse.Namespace, bootstrap: str, peers: list[str]) -> WorkloadFigures:
    workload: Workload | DslWorkload
    expect: Expectation | DslExpectation
    if name in DSL_WORKLOADS:
        workload = DSL_WORKLOADS[name]
        count = args.records
        source, expect = await dsl_input(workload, count, bootstrap)
    else:
        workload = WORKLOADS[name]
        count = args.async_records if name == "async-io" else args.records
        source = f"bench-{name}-in-{uuid.uuid4().hex[:6]}"
        inputs = make_inputs(count)
        await create_topics(bootstrap, [source], [])
        await produce(bootstrap, source, inputs)
        await warm_up(bootstrap, source, len(inputs))
        expect = workload.expectation(inputs)
    print(f"\n{workload.title}: {expect.records_in:,} records on {PARTITIONS} partitions in {source}", flush=True)

    figures = {key: PeerFigures(key, PEERS[key].NAME, PEERS[key].setting(name)) for key in peers}
    for key in peers:
        peer = PEERS[key]
        missing = getattr(peer, "missing_feature", lambda _w: None)(name)
        if missing:
            figures[key].error = missing
            continue
        try:
            await asyncio.to_thread(peer.prepare)
        except Exception as exc:
            figures[key].error = error_text(exc)
    for run_no in range(args.runs):
        order = peers[run_no % len(peers):] + peers[:run_no % len(peers)]
        for key in order:
            f = figures[key]
            if f.error is not None:
                continue
            try:
                result = await measure.throughput(PEERS[key], workload, bootstrap, source, expect, args.timeout,
                                                  args.warmup)
            except Exception as exc:
                f.error = error_text(exc)
                print(f"  run {run_no + 1} {f.name:<22} FAILED {f.error}", flush=True)
                if not isinstance(exc, measure.PeerFailed):
                    traceback.print_exc()
                continue
            f.runs.append(result)
            rss = f"{result.peak_rss_bytes / 2**20:,.0f} MiB" if result.peak_rss_bytes else "?"
            steady = "" if result.steady_records_per_s is None else \
                f", steady {result.steady_records_per_s:,.0f} records/s"
            print(f"  run {run_no + 1} {f.name:<22} {result.records_per_s:>10,.0f} records/s "
                  f"({result.seconds:.2f} s){steady}, peak RSS {rss}", flush=True)
    if isinstance(workload, Workload) and workload.latency and args.latency_seconds > 0:
        rate = args.latency_rate or workload.latency_rate
        for key in peers:
            f = figures[key]
            if not f.runs:
                continue
            try:
                f.latency = await measure.latency(PEERS[key], workload, bootstrap, rate, args.latency_seconds,
                                                  args.latency_warmup, args.timeout)
            except Exception as exc:
                f.latency_error = error_text(exc)
                print(f"  latency {f.name:<22} FAILED {f.latency_error}", flush=True)
                continue
            print(f"  latency {f.name:<22} at {rate}/s: p50 {f.latency.p50_ms:.1f} ms, "
                  f"p99 {f.latency.p99_ms:.1f} ms ({f.latency.records} records)", flush=True)
    ratios = raw_ratios(WorkloadFigures(name, workload.title, count, list(figures.values())))
    if ratios:
        print("  median records/s × raw aiokafka: "
              + ", ".join(f"{peer} {ratio:.2f}×" for peer, ratio in ratios.items()), flush=True)
    steady_figures = steady_ratios(list(figures.values()))
    if steady_figures:
        times = "\u00d7"  # the page's sign for a ratio
        print(f"  steady (after the first {args.warmup:.0%} of the output), median records/s {times} raw aiokafka: "
              + ", ".join(f"{peer} {ratio:.2f}{times}" for peer, ratio in steady_figures.items()), flush=True)
    note = "Latency is not measured for this workload (its output is a count, not the stamped record)." \
        if not workload.latency else ""
    if name in DSL_WORKLOADS:
        note = "Latency is not measured for the DSL workloads; every output checked against the input."
        against = to_kafka_streams(list(figures.values()))
        if against:
            print(f"  streamloop / Kafka Streams: {against}", flush=True)
            note += f" streamloop / Kafka Streams: {against}."
    return WorkloadFigures(name, workload.title, expect.records_in, [figures[k] for k in peers], note)


def to_kafka_streams(peers: list[PeerFigures]) -> str:
    """streamloop's median records/s (and steady records/s) over Kafka Streams', and its peak RSS over theirs."""
    by_key = {p.peer: p for p in peers}
    ours, theirs = by_key.get("streamloop"), by_key.get("kafka-streams")
    if ours is None or theirs is None or not ours.median or not theirs.median:
        return ""
    parts = [f"records/s {ours.median / theirs.median:.2f}\u00d7 ({ours.median:,.0f} / {theirs.median:,.0f})"]
    steady = [statistics.median(rates) for p in (ours, theirs)
              if (rates := [r.steady_records_per_s for r in p.runs if r.steady_records_per_s is not None])]
    if len(steady) == 2:
        parts.append(f"steady {steady[0] / steady[1]:.2f}\u00d7 ({steady[0]:,.0f} / {steady[1]:,.0f})")
    if ours.peak_rss and theirs.peak_rss:
        parts.append(f"peak RSS {ours.peak_rss / theirs.peak_rss:.2f}\u00d7 "
                     f"({ours.peak_rss / 2**20:,.0f} / {theirs.peak_rss / 2**20:,.0f} MiB)")
    return ", ".join(parts)


def steady_ratios(peers: list[PeerFigures]) -> dict[str, float]:
    """Each peer's median steady records/s (``--warmup``) over the raw aiokafka loop's."""
    medians = {p.peer: statistics.median(rates) for p in peers
               if (rates := [r.steady_records_per_s for r in p.runs if r.steady_records_per_s is not None])}
    raw = medians.get("aiokafka")
    if not raw:
        return {}
    return {p.name: medians[p.peer] / raw for p in peers if p.peer in medians}


async def main_async(args: argparse.Namespace, bootstrap: str, command: str) -> Report:
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    results = [await run_workload(name, args, bootstrap, peers) for name in names
               if name in WORKLOADS or name in DSL_WORKLOADS]
    extra = await run_spark_stage(bootstrap, args.records, args.timeout) if "spark" in names else []
    return Report(command, started, machine(), versions(peers), METHOD, results, extra, args.quick, args.note)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", help="an existing broker; default: start the test broker once")
    parser.add_argument("--quick", action="store_true",
                        help="small inputs, one run, short latency runs: checks the harness, not final figures")
    parser.add_argument("--records", type=int, help="input records of the stateless, count and DSL workloads")
    parser.add_argument("--async-records", type=int, help="input records of the async-io workload")
    parser.add_argument("--runs", type=int, help="throughput runs per peer (default 3)")
    parser.add_argument("--latency-seconds", type=float, help="measured seconds of a latency run (0: none)")
    parser.add_argument("--latency-warmup", type=float,
                        help="seconds at the rate after the peer's first output, before measuring (default 3)")
    parser.add_argument("--latency-rate", type=int, help="records/s of the latency runs (default per workload)")
    parser.add_argument("--warmup", type=float, default=0.0,
                        help="also print a steady rate: records/s after this fraction of the output "
                             "(e.g. 0.3), as a ratio to raw; 0: none")
    parser.add_argument("--join-grace-ms", type=int,
                        help=f"grace of the join workload (default {JOIN_GRACE_MS}): how far in event time one "
                             "input may run ahead of the other before pairs are lost")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a peer may take for one run")
    parser.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated, of: {', '.join(PEERS)}")
    parser.add_argument("--workloads", default="stateless,count,async-io,spark",
                        help="comma-separated, of: stateless, count, async-io, spark, and the DSL workloads "
                             f"(streamloop and Kafka Streams only): {', '.join(DSL_WORKLOADS)}")
    parser.add_argument("--docs", default=str(ROOT / "docs"), help="where benchmarks.md and benchmarks.png go")
    parser.add_argument("--no-docs", action="store_true", help="print the figures only")
    parser.add_argument("--note", action="append", default=[],
                        help="a line for the page's Notes (e.g. the figures of an earlier run); repeatable")
    args = parser.parse_args()
    defaults = (20_000, 2_000, 1, 3.0, 1.0) if args.quick else (100_000, 5_000, 3, 10.0, 3.0)
    args.records = args.records or defaults[0]
    args.async_records = args.async_records or defaults[1]
    args.runs = args.runs or defaults[2]
    args.latency_seconds = defaults[3] if args.latency_seconds is None else args.latency_seconds
    args.latency_warmup = defaults[4] if args.latency_warmup is None else args.latency_warmup
    if not 0 <= args.warmup < 1:
        parser.error("--warmup is a fraction of the output, from 0 up to 1")
    unknown = [p for p in args.peers.split(",") if p.strip() and p.strip() not in PEERS]
    if unknown:
        parser.error(f"unknown peers {unknown}; known: {', '.join(PEERS)}")
    unknown = [w for w in args.workloads.split(",") if w.strip()
               and w.strip() not in (*WORKLOADS, *DSL_WORKLOADS, "spark")]
    if unknown:
        parser.error(f"unknown workloads {unknown}; known: {', '.join((*WORKLOADS, *DSL_WORKLOADS))}, spark")
    if args.join_grace_ms is not None:
        os.environ[JOIN_GRACE_ENV] = str(args.join_grace_ms)  # read by the peers' processes
    command = scrub("python benchmarks/compare.py " + " ".join(sys.argv[1:]))

    if args.bootstrap:
        report = asyncio.run(main_async(args, args.bootstrap, command.strip()))
    else:
        from tests.support.kafka_broker import KafkaBroker

        with KafkaBroker() as broker:
            report = asyncio.run(main_async(args, broker.bootstrap, command.strip()))
    page = markdown(report, "benchmarks.png", "benchmark-scripts.md")
    if args.no_docs:
        print(page)
        return
    docs = Path(args.docs)
    chart(report, docs / "benchmarks.png")
    (docs / "benchmarks.md").write_text(page)
    print(f"\nwrote {docs / 'benchmarks.md'} and {docs / 'benchmarks.png'}")


if __name__ == "__main__":
    main()
