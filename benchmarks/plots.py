"""Figures of docs/benchmarks.md's issue-#34 section, drawn from its markdown tables.

Reads ``docs/benchmarks.md``, finds under "## The stateful DSL, latency under load, records in flight
(issue #34, first round)" each subsection by its heading (matched exactly), takes the first markdown
table under it and parses its cells ("7,656", "1.58×", "81 / 341 (0.24×)", "2.71 → 2.56",
"2.8 / 127.8 / 254.9": a note in parentheses after the numbers is ignored, a lone dash is a figure
not measured). No figure is written in this script: rewrite a table and run it again to redraw. A
missing heading, a missing table or a cell that does not parse stops it with an error naming the
heading and the cell. One PNG per table, beside the page:

- ``benchmarks-dsl.png``: "The DSL against Kafka Streams 4.1", rec/s and peak RSS per workload;
- ``benchmarks-count.png``: "Count with changelog against the raw loop", wall after/before and
  CPU seconds per run before → after, per change;
- ``benchmarks-segments.png``: "Window stores in segments", expiry µs per record against stream time;
- ``benchmarks-latency.png``: "Latency under load", the latency quantiles per contender, stateless and count;
- ``benchmarks-in-flight.png``: "Records in flight at 32 and 256 per task", rec/s and CPU µs per record
  of each run at each level.

    .venv/bin/python benchmarks/plots.py                 # reads and writes docs/
    .venv/bin/python benchmarks/plots.py --docs DIR      # DIR/benchmarks.md, DIR/benchmarks-*.png

Needs matplotlib (the ``bench`` extra); parsing alone (``benchmarks/doc_tables.py``) does not.
"""

from __future__ import annotations

import argparse
import math
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.doc_tables import (
    MISSING,
    Count,
    Dsl,
    InFlight,
    InFlightRow,
    Latency,
    LatencyRow,
    Segments,
    Table,
    TableError,
    parse_all,
)

STREAMLOOP = "#1f77b4"
PEER = "#999999"


# --- drawing -----------------------------------------------------------------------------------------


def _fmt(value: float, decimals: int = 0) -> str:
    """A bar's figure as the tables write it: "7,656", "1.58", "127.8"; "–" if not measured."""
    if math.isnan(value):
        return "–"
    return f"{value:,.{0 if abs(value) >= 1000 else decimals}f}"


def _wrap(text: str, width: int, lines: int = 3) -> str:
    return "\n".join(textwrap.wrap(text, width, max_lines=lines, placeholder=" …", break_long_words=False,
                                    break_on_hyphens=False))


def _title(fig: Any, t: Table, extra: str = "") -> None:
    load = t.load()
    notes = ", ".join(n for n in (extra, load) if n)
    fig.suptitle(t.heading + (f" ({notes})" if notes else ""), fontsize=12)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _grouped(ax: Any, labels: Sequence[str], series: Sequence[tuple[str, Sequence[float], str]],
             decimals: int = 0, width: float = 0.8) -> None:
    """Bars of each series side by side per label; a figure not measured is marked "–" on the axis."""
    step = width / len(series)
    for k, (name, values, color) in enumerate(series):
        xs = [i - width / 2 + step * (k + 0.5) for i in range(len(labels))]
        bars = ax.bar(xs, [0 if math.isnan(v) else v for v in values], step * 0.95, label=name, color=color)
        ax.bar_label(bars, [_fmt(v, decimals) for v in values], fontsize=7, padding=1)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)


def draw_dsl(data: Dsl, path: Path) -> Path:
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 8.5))
    labels = [_wrap(r.workload, 20) for r in data.rows]
    _grouped(top, labels, [("streamloop", [r.ours for r in data.rows], STREAMLOOP),
                           ("Kafka Streams", [r.theirs for r in data.rows], PEER)])
    for i, r in enumerate(data.rows):
        top.annotate(f"{_fmt(r.ratio, 2)}× KS", (i, max(r.ours, r.theirs)), xytext=(0, 12),
                     textcoords="offset points", ha="center", fontsize=8, fontweight="bold")
    top.set_ylabel("records/s")
    top.set_ylim(0, max(max(r.ours, r.theirs) for r in data.rows) * 1.22)
    top.set_title(f"Throughput, {data.table.header[0]} (× KS: streamloop's rate over Kafka Streams')", fontsize=10)
    top.legend(fontsize=8, loc="upper left")
    _grouped(bottom, labels, [("streamloop", [r.rss[0] for r in data.rows], STREAMLOOP),
                              ("Kafka Streams", [r.rss[1] for r in data.rows], PEER)])
    bottom.set_ylabel("peak RSS, MiB")
    bottom.set_ylim(0, max(max(r.rss) for r in data.rows) * 1.12)
    bottom.set_title("Peak resident memory", fontsize=10)
    bottom.legend(fontsize=8, loc="upper left")
    _title(fig, data.table)
    return _save(plt, fig, path)


def draw_count(data: Count, path: Path) -> Path:
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 1.6 + 1.3 * len(data.rows)), sharey=True)
    ys = range(len(data.rows))
    labels = [_wrap(r.change, 32, 5) for r in data.rows]
    height = 0.38
    for offset, name, values, color in ((-height / 2, "whole run", [r.wall for r in data.rows], STREAMLOOP),
                                        (height / 2, "steady", [r.steady for r in data.rows], "#9ecae1")):
        bars = left.barh([y + offset for y in ys], [0 if math.isnan(v) else v for v in values], height * 0.95,
                         label=name, color=color)
        left.bar_label(bars, [_fmt(v, 2) for v in values], fontsize=8, padding=2)
    left.axvline(1.0, color="#aa0000", linewidth=1, linestyle="--")
    left.set_xlim(0, max(max(r.wall, 0 if math.isnan(r.steady) else r.steady) for r in data.rows) * 1.45)
    left.set_yticks(list(ys), labels, fontsize=8)
    left.invert_yaxis()
    left.set_xlabel("wall after / before, ratio (dashed: 1.0)")
    left.set_title("Wall time, after over before", fontsize=10)
    left.legend(fontsize=8, loc="lower right")
    for offset, name, k, color in ((-height / 2, "before", 0, PEER), (height / 2, "after", 1, STREAMLOOP)):
        values = [r.cpu[k] for r in data.rows]
        bars = right.barh([y + offset for y in ys], [0 if math.isnan(v) else v for v in values], height * 0.95,
                          label=name, color=color)
        right.bar_label(bars, [_fmt(v, 2) for v in values], fontsize=8, padding=2)
    right.set_xlim(0, max(max(r.cpu) for r in data.rows) * 1.45)
    right.set_xlabel("peer CPU, s per run")
    right.set_title("CPU per run, before → after", fontsize=10)
    right.legend(fontsize=8, loc="lower right")
    _title(fig, data.table)
    return _save(plt, fig, path)


def draw_segments(data: Segments, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 5.5))
    markers = "osD^vP*X"
    for k, (label, values) in enumerate(data.rows):
        ax.plot(data.times, values, marker=markers[k % len(markers)], label=label,
                linestyle="-" if "segment" not in label else "--")
    ax.set_yscale("log")
    ax.set_xticks(data.times, [f"{t:g}" for t in data.times])
    ax.set_xlabel(f"stream time{f', {data.unit}' if data.unit else ''}")
    ax.set_ylabel("expiry CPU, µs per record (log)")
    ax.set_title("CPU spent in expiry per record as the store grows", fontsize=10)
    ax.grid(True, which="major", axis="y", alpha=0.3)
    ax.legend(fontsize=9)
    _title(fig, data.table)
    return _save(plt, fig, path)


def draw_latency(data: Latency, path: Path) -> Path:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 5.5), sharey=True)
    labels = [_wrap(r.contender, 14) for r in data.rows]
    colors = ["#9ecae1", "#3182bd", "#08306b", "#6baed6", "#c6dbef"]
    panels: list[tuple[Any, str, Callable[[LatencyRow], list[float]]]] = [
        (axes[0], "stateless", lambda r: r.stateless), (axes[1], "count", lambda r: r.count)]
    for ax, name, pick in panels:
        _grouped(ax, labels, [(q, [pick(r)[k] for r in data.rows], colors[k % len(colors)])
                              for k, q in enumerate(data.quantiles)], decimals=1)
        ax.set_yscale("log")
        ax.set_title(name, fontsize=10)
        ax.grid(True, which="major", axis="y", alpha=0.3)
    top = max(v for r in data.rows for v in (*r.stateless, *r.count) if not math.isnan(v))
    axes[0].set_ylim(top=top * 3)
    axes[0].set_ylabel(f"end-to-end latency, {data.unit} (log)")
    axes[0].legend(fontsize=8, loc="upper left")
    _title(fig, data.table, data.table.header[0])
    return _save(plt, fig, path)


def draw_in_flight(data: InFlight, path: Path) -> Path:
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 5))
    labels = [f"{r.level} in flight" for r in data.rows]
    runs = max(len(v) for r in data.rows for v in (r.ours, r.raw, r.ours_cpu, r.raw_cpu))
    shades = {"streamloop": [STREAMLOOP, "#9ecae1"], "raw": ["#555555", "#bbbbbb"]}

    def series(pick: Callable[[InFlightRow], list[float]], name: str) -> list[tuple[str, list[float], str]]:
        return [(f"{name}, run {k + 1}" if runs > 1 else name,
                 [pick(r)[k] if k < len(pick(r)) else MISSING for r in data.rows],
                 shades[name][k % 2]) for k in range(runs)]

    _grouped(left, labels, series(lambda r: r.ours, "streamloop") + series(lambda r: r.raw, "raw"))
    left.set_ylabel("records/s")
    left.set_title("Throughput", fontsize=10)
    left.legend(fontsize=8, loc="upper left")
    left.set_ylim(0, max(v for r in data.rows for v in (*r.ours, *r.raw) if not math.isnan(v)) * 1.25)
    _grouped(right, labels, series(lambda r: r.ours_cpu, "streamloop") + series(lambda r: r.raw_cpu, "raw"),
             decimals=1)
    right.set_ylabel("processing-thread CPU, µs per record")
    right.set_title("CPU per record", fontsize=10)
    right.legend(fontsize=8, loc="upper left")
    right.set_ylim(0, max(v for r in data.rows for v in (*r.ours_cpu, *r.raw_cpu) if not math.isnan(v)) * 1.3)
    _title(fig, data.table)
    return _save(plt, fig, path)


def draw_all(markdown: str, docs: Path, source: str = "benchmarks.md") -> list[Path]:
    """Parses every table first (so that a bad cell writes no figure), then draws them."""
    dsl, count, segments, latency, in_flight = parse_all(markdown, source)
    return [draw_dsl(dsl, docs / "benchmarks-dsl.png"), draw_count(count, docs / "benchmarks-count.png"),
            draw_segments(segments, docs / "benchmarks-segments.png"),
            draw_latency(latency, docs / "benchmarks-latency.png"),
            draw_in_flight(in_flight, docs / "benchmarks-in-flight.png")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=Path, default=Path(__file__).resolve().parents[1] / "docs",
                        help="the folder of benchmarks.md, where the PNGs are written (default: the repo's docs/)")
    args = parser.parse_args(argv)
    page = args.docs / "benchmarks.md"
    try:
        markdown = page.read_text(encoding="utf-8")
    except OSError as e:
        raise SystemExit(f"plots.py: cannot read {page}: {e}") from e
    try:
        written = draw_all(markdown, args.docs, str(page))
    except TableError as e:
        raise SystemExit(f"plots.py: {e}") from e
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
