"""The fault suite in figures: broker faults, process kills, racing thread calls, thread adds.

Each scenario runs a fresh client (fresh topics) against this script's own broker, injects its
faults and returns a dict of figures: faults injected, records lost, duplicates (exactly-once),
stalls (output incomplete or lag not 0 within the bound), thread deaths, seconds to recover, and
a note. The table ends with one row per scenario.

- broker: a bounce (stopped, started again on the same data and port), a freeze (SIGSTOP), an
  outage past ``task.timeout.ms``, thread start-up during an outage (``tests/support/broker_faults.py``);
- process kills: the app SIGKILLed at random points and restarted (``benchmarks/fault_kill.py``);
- thread races: storms of add/remove/close calls and handler answers from outside and inside
  stream threads, on ``memory://`` (``tests/support/thread_races.py``): faults = calls made,
  stalled = calls that overran their timeout;
- add-thread latency: ``add_stream_thread()`` to the new thread's first record, 8 threads over
  16 partitions (``benchmarks/thread_scaling.py``);
- late coordinator: the README's application (2 threads, 4 partitions, 20 000 records) on a broker
  at Kafka's default group settings whose JoinGroup answers come 2, 10 and 25 s late and whose
  SyncGroup answers come later to followers than to the leader (``tests/support/late_coordinator.py``).

Scenarios are plain ``async def scenario(broker) -> dict`` functions in ``SCENARIOS``.

Run: ``python benchmarks/faults.py`` (bounces of 10 s, 5 kills and 50 storms) or ``--long`` (30 s
bounces, SIGKILL bounces, 20 kills, 1 000 storms); ``--only NAME`` runs the scenarios whose name
contains NAME.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.fault_kill import run_kills
from benchmarks.thread_scaling import add_remove_latency
from streamloop.transport import open_transport
from tests.support import broker_faults
from tests.support.broker_faults import AT_LEAST_ONCE, EXACTLY_ONCE
from tests.support.cluster import Cluster
from tests.support.kafka_broker import KafkaBroker
from tests.support.late_coordinator import late_coordinator
from tests.support.thread_races import random_storm, run_storm

Scenario = Callable[[KafkaBroker], Awaitable[dict[str, Any]]]
GUARANTEES = {AT_LEAST_ONCE: "alos", EXACTLY_ONCE: "eos"}


def scenarios(long: bool) -> list[tuple[str, Scenario]]:
    """The broker scenarios under both guarantees; ``long`` keeps the broker down 30 s."""
    down_s = 30.0 if long else 10.0
    result: list[tuple[str, Scenario]] = []
    for guarantee, short in GUARANTEES.items():
        result += [
            (f"bounce {down_s:.0f}s {short}", partial(broker_faults.bounce, guarantee=guarantee, down_s=down_s)),
            (f"pause 6s {short}", partial(broker_faults.pause, guarantee=guarantee)),
            (f"down > task.timeout.ms (4s) {short}",
             partial(broker_faults.outage_past_task_timeout, guarantee=guarantee, task_timeout_ms=4_000)),
        ]
        if long:
            result.append((f"SIGKILL bounce {down_s:.0f}s {short}",
                           partial(broker_faults.bounce, guarantee=guarantee, down_s=down_s, kill=True)))
    result += [
        ("thread added while down 6s", partial(broker_faults.thread_added_during_outage, down_s=6.0)),
        ("thread start-up > task.timeout.ms (3s)",
         partial(broker_faults.thread_added_during_long_outage, task_timeout_ms=3_000)),
    ]
    kills = 20 if long else 5
    for guarantee, short in GUARANTEES.items():
        result.append((f"SIGKILL app x{kills} {short}", partial(process_kills, kills=kills, guarantee=guarantee)))
    storms = 1_000 if long else 50
    result += [
        (f"thread races x{storms} (memory)", partial(thread_races, storms=storms)),
        ("add thread, 8 threads/16 partitions x20", add_thread_latency),
    ]
    result += [(f"late coordinator {delay}s", partial(late_coordinator_row, delay_s=delay)) for delay in (2, 10, 25)]
    return result


async def process_kills(broker: KafkaBroker, *, kills: int, guarantee: str) -> dict[str, Any]:
    figures = await run_kills(kills, guarantee, bootstrap=broker.bootstrap)
    return {"faults": figures["kills"], "lost": figures["lost"], "duplicates": figures["duplicates"],
            "stalled": figures["stalls"], "recover_s": round(float(figures["drain_seconds"]), 1),
            "note": f"{figures['records_in']} in, {figures['records_out']} out"}


async def thread_races(_broker: KafkaBroker, *, storms: int) -> dict[str, Any]:
    """Seeded storms on memory:// (each one its own broker): a hang or a lost record is counted."""
    import random

    calls = overruns = lost = failed = 0
    first_problem: str | None = None
    for seed in range(storms):
        try:
            figures = await asyncio.to_thread(run_storm, *random_storm(random.Random(seed)))
        except (AssertionError, TimeoutError) as exc:  # a hang, or records that never came out
            failed += 1
            first_problem = first_problem or f"storm {seed}: {exc}"
            continue
        calls += figures.calls
        overruns += len(figures.overruns)
        lost += figures.lost
        if figures.overruns or figures.errors:
            first_problem = first_problem or f"storm {seed}: {figures.overruns + figures.errors}"
    return {"faults": calls, "lost": lost, "stalled": overruns + failed, "error": first_problem,
            "note": f"{storms} storms, {calls} calls"}


async def late_coordinator_row(_broker: KafkaBroker, *, delay_s: float) -> dict[str, Any]:
    """The README's application on its own broker, whose JoinGroup answers come ``delay_s`` late."""
    return await late_coordinator(delay_s)


async def add_thread_latency(broker: KafkaBroker) -> dict[str, Any]:
    """20 adds (each removed again) on 8 threads over 16 partitions, Kafka's heartbeat.interval.ms."""
    cluster = Cluster(open_transport({"bootstrap.servers": broker.bootstrap}), broker.bootstrap)
    times = await add_remove_latency(cluster, 16, 20, base=8, heartbeat_ms=3_000)
    first = sorted(times["first_record"])
    p50, p99 = first[len(first) // 2], first[min(len(first) - 1, round(0.99 * (len(first) - 1)))]
    return {"faults": len(first), "lost": 0, "stalled": 0, "thread_deaths": 0, "recover_s": round(p99, 2),
            "note": f"first record p50 {p50:.2f} s, p99 {p99:.2f} s"}


SCENARIOS: list[tuple[str, Scenario]] = scenarios(long=False)

COLUMNS = ("faults", "lost", "duplicates", "stalled", "thread_deaths", "recover_s", "state", "error", "note")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return str(value)


def print_table(rows: list[tuple[str, dict[str, Any], float]]) -> None:
    header = ("scenario", *COLUMNS, "run_s")
    cells = [[name, *(_cell(figures.get(c)) for c in COLUMNS), f"{took:.0f}"] for name, figures, took in rows]
    error_at = 1 + COLUMNS.index("error")
    for line in cells:
        line[error_at] = line[error_at].split(":", 1)[0]  # the error's type only: the table stays readable
    widths = [max(len(str(x)) for x in column) for column in zip(header, *cells, strict=True)]
    for line in (header, *cells):
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)).rstrip())


async def run(selected: list[tuple[str, Scenario]], broker: KafkaBroker) -> list[tuple[str, dict[str, Any], float]]:
    rows = []
    for name, scenario in selected:
        print(f"... {name}", file=sys.stderr, flush=True)
        started = time.monotonic()
        try:
            figures = await scenario(broker)
        except Exception as exc:  # a broken scenario is a row, not the end of the table
            figures = {"error": f"scenario failed: {type(exc).__name__}: {exc}"}
        rows.append((name, figures, time.monotonic() - started))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--long", action="store_true", help="30 s bounces, plus SIGKILL bounces")
    parser.add_argument("--only", help="run only scenarios whose name contains this text")
    args = parser.parse_args()
    # The expected retry warnings and aiokafka's connection errors would drown the table.
    logging.basicConfig(level=logging.CRITICAL)
    selected = scenarios(args.long)
    if args.only:
        selected = [s for s in selected if args.only in s[0]]
    with KafkaBroker() as broker:
        rows = asyncio.run(run(selected, broker))
    print()
    print_table(rows)
    errors = [(name, figures["error"]) for name, figures, _ in rows if figures.get("error")]
    if errors:
        print()
        for name, error in errors:
            print(f"{name}: {error}")


if __name__ == "__main__":
    main()
