"""The text the console commands print, made from a ``KafkaStreams`` without touching its loops.

Each view only reads snapshots the client hands out to any thread
(``metadata_for_local_threads``, ``local_task_details``, ``metrics``), so a command
answers at once whatever the stream threads are doing. Plain aligned columns:
readable in a telnet session and easy to read back in a script.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from streamloop.client import KafkaStreams
from streamloop.config import shown
from streamloop.threads.view import TaskDetails, TaskRunState


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, two spaces apart."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=False)]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=False)).rstrip()
             for line in (headers, *rows)]
    return "\n".join(lines)


def threads_view(streams: KafkaStreams) -> str:
    rows = []
    for meta in sorted(streams.metadata_for_local_threads(), key=lambda m: m.thread_name):
        tasks = ",".join(str(t.task_id) for t in sorted(meta.active_tasks, key=lambda t: t.task_id)) or "-"
        rows.append((meta.thread_name, meta.thread_state.name, tasks, str(meta.cache_size_bytes)))
    header = f"client {streams.client_id}: {streams.state.name}, {len(rows)} stream thread(s)"
    return header + "\n" + table(("THREAD", "STATE", "TASKS", "CACHE-BYTES"), rows)


def _partitions(details: TaskDetails) -> str:
    return ",".join(str(tp) for tp in sorted(details.topic_partitions))


def _committed(details: TaskDetails) -> str:
    return ",".join(f"{tp}@{offset}" for tp, offset in sorted(details.committed.items())) or "-"


def _state(details: TaskDetails) -> str:
    if details.state is TaskRunState.RETRYING and details.timeout_deadline_in_ms is not None:
        left = details.timeout_deadline_in_ms / 1000.0
        return f"retrying (deadline in {left:.1f} s)" if left >= 0 else f"retrying (final attempt, {-left:.1f} s past)"
    return details.state.value


def tasks_view(streams: KafkaStreams) -> str:
    rows = [(str(d.task_id), d.thread_name, _partitions(d), _state(d), _committed(d),
             "-" if d.lag is None else str(d.lag), str(d.records_processed))
            for d in sorted(streams.local_task_details(), key=lambda d: d.task_id)]
    if not rows:
        return "no active tasks"
    return table(("TASK", "THREAD", "PARTITIONS", "STATE", "COMMITTED", "LAG", "PROCESSED"), rows)


def paused_view(streams: KafkaStreams) -> str:
    paused = [d for d in streams.local_task_details() if d.state is TaskRunState.PAUSED]
    if not paused:
        return "no paused tasks"
    rows = [(str(d.task_id), d.thread_name,
             f"{d.paused_at[0]} offset {d.paused_at[1]}" if d.paused_at is not None else "-",
             "-" if d.lag is None else str(d.lag))
            for d in sorted(paused, key=lambda d: d.task_id)]
    return table(("TASK", "THREAD", "PAUSED-AT", "LAG"), rows) + "\nresume with: resume <task> [--skip]"


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return str(int(value)) if value == int(value) and abs(value) < 1e15 else f"{value:.3f}"


def metrics_view(streams: KafkaStreams, name_filter: str = "") -> str:
    rows = []
    for metric in streams.metrics():
        if name_filter and name_filter not in metric.name and name_filter not in metric.group:
            continue
        tags = ",".join(f"{k}={shown(k, v)}" for k, v in sorted(metric.tags.items()))
        rows.append((metric.group, metric.name, tags, _number(metric.value)))
    if not rows:
        return f"no metric matches {name_filter!r}"
    return table(("GROUP", "NAME", "TAGS", "VALUE"), rows)


def config_view(streams: KafkaStreams, name_filter: str = "") -> str:
    """Every config key and its value, secrets shown as ``[hidden]`` (``StreamsConfig.shown_values``)."""
    rows = [(name, repr(value)) for name, value in sorted(streams.config.shown_values().items())
            if name_filter in name]
    if not rows:
        return f"no config key matches {name_filter!r}"
    return table(("KEY", "VALUE"), rows)


def topology_view(streams: KafkaStreams) -> str:
    return streams.topology.describe().rstrip("\n")
