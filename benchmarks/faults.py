"""Broker faults: how the client rides out a broker that goes away or freezes, in figures.

Each scenario runs a fresh client (fresh topics) against this script's own broker, injects its
fault and returns a dict of figures (see ``tests/support/broker_faults.py``): faults injected,
records lost, duplicates (exactly-once), stalls (output incomplete or lag not 0 within the
bound), thread deaths and seconds to recover. The table ends with one row per scenario.

Scenarios are plain ``async def scenario(broker) -> dict`` functions in ``SCENARIOS``; others
(process kills, add-thread latency) plug in by appending to the list.

Run: ``python benchmarks/faults.py`` (bounces of 10 s) or ``--long`` (30 s bounces, and a
SIGKILL bounce); ``--only NAME`` runs the scenarios whose name contains NAME.
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

from tests.support import broker_faults  # noqa: E402
from tests.support.broker_faults import AT_LEAST_ONCE, EXACTLY_ONCE  # noqa: E402
from tests.support.kafka_broker import KafkaBroker  # noqa: E402

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
    return result


SCENARIOS: list[tuple[str, Scenario]] = scenarios(long=False)

COLUMNS = ("faults", "lost", "duplicates", "stalled", "thread_deaths", "recover_s", "state", "error")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return str(value)


def print_table(rows: list[tuple[str, dict[str, Any], float]]) -> None:
    header = ("scenario", *COLUMNS, "run_s")
    cells = [[name, *(_cell(figures.get(c)) for c in COLUMNS), f"{took:.0f}"] for name, figures, took in rows]
    for line in cells:
        error = line[len(COLUMNS)]  # keep the error's type only: the table stays readable
        line[len(COLUMNS)] = error.split(":", 1)[0]
    widths = [max(len(str(x)) for x in column) for column in zip(header, *cells)]
    for line in (header, *cells):
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip())


async def run(selected: list[tuple[str, Scenario]], broker: KafkaBroker) -> list[tuple[str, dict[str, Any], float]]:
    rows = []
    for name, scenario in selected:
        print(f"... {name}", file=sys.stderr, flush=True)
        started = time.monotonic()
        try:
            figures = await scenario(broker)
        except Exception as exc:  # noqa: BLE001 - a broken scenario is a row, not the end of the table
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
