"""Process kills: the application killed with SIGKILL at random points and restarted, again and
again, under at_least_once and exactly_once_v2 (issue #19's process-kill faults).

Each kill lands either while the restarted tasks initialise or a random time into processing (no
commit, no leave-group, no abort); after the last one the application runs until the group's
committed offsets reach the end of the input. An independent reader (``read_committed`` under
exactly-once) counts the output. The campaign is ``tests.support.process_kills``; the figures:

    kills          SIGKILLs injected
    records_in     input records produced (a batch before each start)
    records_out    output records read
    lost           inputs missing from the output at the end (a stalled run leaves its backlog missing)
    duplicates     output records beyond one per input (0 expected under exactly_once_v2)
    stalls         runs that made no progress (or did not drain) within the bound
    drain_seconds  from the last start until the committed offsets were at the end and every input out

Run: ``python benchmarks/fault_kill.py [--kills 20] [--bootstrap HOST:PORT]`` (a broker is started
here unless one is given). ``benchmarks/faults.py`` imports ``run_kills``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

import anyio.to_thread

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.process_kills import GUARANTEES, kill_and_restart

DEFAULT_KILLS = int(os.environ.get("STREAMLOOP_KILLS", "10"))


async def run_kills(kills: int, guarantee: str, *, bootstrap: str | None = None,
                    seed: int = 0) -> dict[str, float | int]:
    """Kill and restart the application ``kills`` times under ``guarantee`` ("at_least_once" or
    "exactly_once_v2") and return the figures (see the module docstring).

    Without ``bootstrap`` a Kafka test broker is started for the run and stopped after it.
    """
    if bootstrap is not None:
        report = await kill_and_restart(bootstrap, kills, guarantee, seed=seed)
        return report.figures()
    from tests.support.kafka_broker import KafkaBroker

    broker = KafkaBroker()
    await anyio.to_thread.run_sync(broker.start)
    try:
        report = await kill_and_restart(broker.bootstrap, kills, guarantee, seed=seed)
    finally:
        await anyio.to_thread.run_sync(broker.stop)
    return report.figures()


async def main_async(bootstrap: str, kills: int, seed: int) -> None:
    print(f"{kills} SIGKILLs per guarantee, seed {seed}, broker {bootstrap}")
    columns = ("kills", "records_in", "records_out", "lost", "duplicates", "stalls", "drain_seconds")
    print(f"{'guarantee':<17}" + "".join(f"{c:>14}" for c in columns))
    for guarantee in GUARANTEES:
        figures = await run_kills(kills, guarantee, bootstrap=bootstrap, seed=seed)
        print(f"{guarantee:<17}" + "".join(f"{figures[c]:>14}" for c in columns), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", help="an existing broker; default: start the test broker")
    parser.add_argument("--kills", type=int, default=DEFAULT_KILLS, help="default: $STREAMLOOP_KILLS or 10")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill points")
    args = parser.parse_args()
    if args.bootstrap:
        asyncio.run(main_async(args.bootstrap, args.kills, args.seed))
        return
    from tests.support.kafka_broker import KafkaBroker

    with KafkaBroker() as broker:
        asyncio.run(main_async(broker.bootstrap, args.kills, args.seed))


if __name__ == "__main__":
    main()
