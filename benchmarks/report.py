"""The figures of ``benchmarks/compare.py`` as a markdown page and a PNG chart under ``docs/``."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.measure import LatencyRun, ThroughputRun


@dataclass
class PeerFigures:
    """One peer on one workload: its runs, or why it has none."""

    peer: str
    name: str
    setting: str
    runs: list[ThroughputRun] = field(default_factory=list)
    latency: LatencyRun | None = None
    error: str | None = None
    latency_error: str | None = None

    @property
    def rates(self) -> list[float]:
        return [r.records_per_s for r in self.runs]

    @property
    def median(self) -> float | None:
        return statistics.median(self.rates) if self.runs else None

    @property
    def peak_rss(self) -> int | None:
        values = [r.peak_rss_bytes for r in self.runs if r.peak_rss_bytes is not None]
        return max(values) if values else None


@dataclass
class WorkloadFigures:
    name: str
    title: str
    records: int
    peers: list[PeerFigures]
    note: str = ""


@dataclass
class Report:
    command: str
    date: str
    machine: list[str]
    versions: list[str]
    method: list[str]
    workloads: list[WorkloadFigures]
    extra: list[str] = field(default_factory=list)
    quick: bool = False
    notes: list[str] = field(default_factory=list)


def _ratio(theirs: float | None, ours: float | None) -> str:
    return f"{theirs / ours:.2f}×" if theirs is not None and ours else "–"


def raw_ratios(w: WorkloadFigures) -> dict[str, float]:
    """Each peer's median records/s over the raw aiokafka loop's (the targets of issue #22)."""
    raw = next((p.median for p in w.peers if p.peer == "aiokafka"), None)
    if not raw:
        return {}
    return {p.name: p.median / raw for p in w.peers if p.median}


def _one_line(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(report: Report, chart: str, scripts_page: str) -> str:
    lines = [
        "# Benchmarks",
        "",
        "<!-- Written by benchmarks/compare.py (`make bench`); edit the script, not this page. -->",
        "",
        "streamloop against a bare aiokafka loop (the ceiling of an aiokafka-based engine),",
        "faust-streaming, quixstreams and Apache Kafka Streams (the reference), in one run, on one",
        "broker and on the same input. Ratios are each peer's figure divided by streamloop's:",
        "above 1× a peer has more throughput, more latency or more memory than streamloop.",
        "Below each table, each peer's median records/s over the bare aiokafka loop's (*× raw*).",
        "",
    ]
    if report.quick:
        lines += ["!!! warning \"Not final figures\"",
                  "    These come from a quick run (small inputs, one run) on a machine shared with other",
                  "    work. Rerun `make bench` on a quiet machine for figures to quote.", ""]
    lines += [f"![records per second and latency per peer]({chart})", ""]
    for w in report.workloads:
        ours = next((p for p in w.peers if p.peer == "streamloop"), None)
        near_saturation: list[str] = []
        lines += [f"## {w.title}", "", f"{w.records:,} input records, 4 partitions. {w.note}".rstrip(), ""]
        lines += ["| peer | setting | records/s min / median / max | × streamloop | p50 ms | p99 ms "
                  "| × streamloop (p99) | peak RSS MiB | × streamloop (RSS) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for p in w.peers:
            if p.error is not None and not p.runs:
                lines.append(f"| {p.name} | {_one_line(p.setting)} | **not run**: {_one_line(p.error)} "
                             "| | | | | | |")
                continue
            rates = p.rates
            tp = f"{min(rates):,.0f} / {p.median:,.0f} / {max(rates):,.0f}"
            lat = p.latency
            p50 = f"{lat.p50_ms:.1f}" if lat else ("–" if p.latency_error is None else "failed")
            if lat and p.median and lat.rate > p.median / 2:
                p50 += " ⚠"
                near_saturation.append(p.name)
            p99 = f"{lat.p99_ms:.1f}" if lat else "–"
            rss = p.peak_rss
            ours_lat = ours.latency if ours else None
            lines.append(
                f"| {p.name} | {_one_line(p.setting)} | {tp} | {_ratio(p.median, ours.median if ours else None)} "
                f"| {p50} | {p99} | {_ratio(lat.p99_ms if lat else None, ours_lat.p99_ms if ours_lat else None)} "
                f"| {rss / 2**20:,.0f} | {_ratio(rss, ours.peak_rss if ours else None)} |"
                if rss is not None else
                f"| {p.name} | {_one_line(p.setting)} | {tp} | {_ratio(p.median, ours.median if ours else None)} "
                f"| {p50} | {p99} | {_ratio(lat.p99_ms if lat else None, ours_lat.p99_ms if ours_lat else None)} "
                "| – | – |")
        to_raw = raw_ratios(w)
        if to_raw:
            lines += ["", "Median records/s × the bare aiokafka loop's (raw): "
                      + ", ".join(f"{name} **{ratio:.2f}×**" for name, ratio in to_raw.items()) + "."]
        problems = [(p.name, e) for p in w.peers for e in (p.error if p.runs else None, p.latency_error) if e]
        if problems:
            lines += ["", "Errors:", ""] + [f"- {name}: `{_one_line(e)}`" for name, e in problems]
        lat_rates = {p.latency.rate for p in w.peers if p.latency}
        if lat_rates:
            lines += ["", f"Latency at {', '.join(map(str, sorted(lat_rates)))} records/s."]
        if near_saturation:
            lines += ["", f"⚠ {', '.join(near_saturation)}: the latency rate is above half of the throughput "
                      "measured here, so the latency includes queueing (the rate is near saturation)."]
        lines.append("")
    lines += report.extra
    if report.notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in report.notes] + [""]
    lines += ["## How it was measured", ""] + [f"- {m}" for m in report.method] + [""]
    lines += ["## Versions", ""] + [f"- {v}" for v in report.versions] + [""]
    lines += ["## Machine", ""] + [f"- {m}" for m in report.machine] + [""]
    lines += ["## Command", "", "```sh", report.command, "```", "",
              f"Run on {report.date}. `python benchmarks/compare.py --help` lists the options "
              "(`--quick` for a short check, `--peers`, `--workloads`, `--bootstrap`).", "",
              f"The earlier single-purpose scripts (thread scaling, task timeouts, records in flight) and "
              f"their figures are on [Benchmark scripts]({scripts_page}).", ""]
    return "\n".join(lines)


def chart(report: Report, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = [w for w in report.workloads if any(p.runs for p in w.peers)]
    if not workloads:
        return
    fig, axes = plt.subplots(2, len(workloads), figsize=(5.2 * len(workloads), 7.5), squeeze=False)
    for col, w in enumerate(workloads):
        names = [p.name for p in w.peers]
        x = range(len(names))
        med = [p.median or 0 for p in w.peers]
        low = [(p.median or 0) - (min(p.rates) if p.runs else 0) for p in w.peers]
        high = [(max(p.rates) if p.runs else 0) - (p.median or 0) for p in w.peers]
        ax = axes[0][col]
        bars = ax.bar(x, med, yerr=[low, high], capsize=3,
                      color=["#1f77b4" if p.peer == "streamloop" else "#999999" for p in w.peers])
        for bar, p in zip(bars, w.peers, strict=True):
            if not p.runs:
                ax.annotate("not run", (bar.get_x() + bar.get_width() / 2, 0), ha="center", va="bottom",
                            rotation=90, fontsize=8, color="#aa0000")
        ax.set_title(w.title, fontsize=10)
        ax.set_ylabel("records/s (median, min–max)")
        ax.set_xticks(list(x), names, rotation=30, ha="right", fontsize=8)
        ax = axes[1][col]
        p50 = [p.latency.p50_ms if p.latency else 0 for p in w.peers]
        p99 = [p.latency.p99_ms if p.latency else 0 for p in w.peers]
        ax.bar([i - 0.2 for i in x], p50, width=0.4, label="p50")
        ax.bar([i + 0.2 for i in x], p99, width=0.4, label="p99")
        ax.set_ylabel("end-to-end latency, ms")
        ax.set_xticks(list(x), names, rotation=30, ha="right", fontsize=8)
        if any(p99):
            ax.set_yscale("log")
            ax.legend(fontsize=8)
        else:
            ax.set_yticks([])
            ax.text(0.5, 0.5, "latency not measured for this workload", transform=ax.transAxes, ha="center")
    fig.suptitle("streamloop and its peers, same broker, same input" + (" (quick run)" if report.quick else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
