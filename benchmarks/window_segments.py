"""Expiry cost of a window store as it grows: the whole-store sweep against time segments, one run.

A 1-hour hopping window count (advancing by ``--advance-min`` minutes) over ``--records`` records
through the ``TopologyTestDriver`` (the store cost is what is measured, not a broker's), on the
in-memory and the RocksDB store. Records are 18 ms of stream time apart by default (1M records: 5 h, so
windows expire from the second hour on) over a key space that grows with the run, so that the
store grows too. A commit (cache flush, expiry, RocksDB write batch) follows every 1 000 records.

Two variants of each store, in this one process: ``sweep``, the store before segments (the task's
window store built over a plain bytes store, so ``WindowStore.expire`` reads the whole store once
per window size of stream time and deletes stale windows one by one), and ``segments`` (the store
as the engine builds it: expiry drops whole segments, ``streamloop.state.segments``). Per slice of
records: the expiry time per record (time in ``expire`` plus in segment drops), the store's
entries at the slice's end, and the whole time per record. The figure to look at: expiry µs per
record flat for ``segments`` as the store grows, growing with the store for ``sweep``.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/window_segments.py            # 1M records, ~15 min
    PYTHONPATH=$PWD .venv/bin/python benchmarks/window_segments.py --records 200000
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamloop import StreamsBuilder, TimeWindows
from streamloop.serdes import StringSerde
from streamloop.state import Materialized, segments, store, task_state
from streamloop.testing import TopologyTestDriver

STR = StringSerde()
HOUR = 3_600_000
GAP_MS = 18  # the default: 1M records make 5 h of stream time
COMMIT_EVERY = 1_000


class Clock:
    """Seconds spent in expiry: ``expire`` calls, and segment drops outside them (a persistent
    store drops at its commit's write batch)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.depth = 0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.depth:
                return fn(*args, **kwargs)
            self.depth += 1
            started = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.thread_time() - started
                self.depth -= 1
        return timed


def run(records: int, advance_min: int, persistent: bool, segmented: bool, slice_size: int,
        state_dir: str, gap_ms: int = GAP_MS) -> list[tuple[int, float, int, float, float]]:
    """Per slice: (records so far, stream hours, store entries, expiry µs/record, total µs/record)."""
    clock = Clock()
    patches = [(store.WindowStore, "expire"), (segments.MemorySegments, "drop_below"),
               (segments.RocksDBSegments, "drop_below")]
    saved = [(owner, name, getattr(owner, name)) for owner, name in patches]
    saved_factory = task_state._segmented_store
    for owner, name, fn in saved:
        setattr(owner, name, clock.wrap(fn))
    if not segmented:
        task_state._segmented_store = lambda *_args: None  # type: ignore[assignment]  # the plain bytes store
    try:
        builder = StreamsBuilder()
        windows = TimeWindows.of_size_with_no_grace(HOUR).advance_by(advance_min * 60_000)
        (builder.stream("in", key_serde=STR, value_serde=STR).group_by_key().windowed_by(windows)
                .count(materialized=Materialized("counts", persistent=persistent)))
        config = {"commit.interval.ms": 30_000, "cache.max.bytes.buffering": 10 << 20, "state.dir": state_dir}
        rng = random.Random(7)
        rows = []
        with TopologyTestDriver(builder.build(), config) as driver:
            source = driver.create_input_topic("in", STR, STR)
            instance = driver.get_window_store("counts")._instances
            slice_started, slice_expiry = time.thread_time(), clock.seconds
            for i in range(records):
                source.pipe_input(f"k{rng.randrange(2_000 + i // 5)}", "x", i * gap_ms)
                if (i + 1) % COMMIT_EVERY == 0:
                    driver.advance_wall_clock_time(30_000)
                if (i + 1) % slice_size == 0:
                    now = time.thread_time()
                    entries = sum(s.inner.approximate_num_entries() for s in instance())
                    rows.append((i + 1, i * gap_ms / HOUR, entries,
                                 (clock.seconds - slice_expiry) / slice_size * 1e6,
                                 (now - slice_started) / slice_size * 1e6))
                    slice_started, slice_expiry = time.thread_time(), clock.seconds
        return rows
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)
        task_state._segmented_store = saved_factory  # type: ignore[assignment]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--advance-min", type=int, default=10,
                        help="hop of the 1-hour window in minutes (10: six windows a record)")
    parser.add_argument("--slice", type=int, default=100_000)
    parser.add_argument("--gap-ms", type=int, default=GAP_MS, help="stream time between two records")
    parser.add_argument("--stores", default="memory,rocksdb")
    parser.add_argument("--only", help=argparse.SUPPRESS)  # one configuration, in a child process
    args = parser.parse_args()
    if args.only:
        kind, variant = args.only.split("/")
        with tempfile.TemporaryDirectory() as state_dir:
            rows = run(args.records, args.advance_min, kind == "rocksdb", variant == "segments", args.slice,
                       state_dir, args.gap_ms)
        print(json.dumps({"rows": rows, "load": os.getloadavg()[0]}))
        return
    print(f"{args.records} records, 1 h window advancing {args.advance_min} min, {args.gap_ms} ms of stream time "
          f"apart; CPU time of the stream thread (the machine is shared); load average {os.getloadavg()[0]:.2f}")
    # Every configuration at once, each in its own process: side by side under the same load.
    configs = [f"{kind}/{variant}" for kind in args.stores.split(",") for variant in ("sweep", "segments")]
    children = {c: subprocess.Popen([sys.executable, __file__, "--only", c, "--records", str(args.records),
                                     "--advance-min", str(args.advance_min), "--slice", str(args.slice),
                                     "--gap-ms", str(args.gap_ms)],
                                    stdout=subprocess.PIPE, text=True) for c in configs}
    results = {}
    for config, child in children.items():
        out, _ = child.communicate()
        if child.returncode != 0:
            raise SystemExit(f"{config} failed ({child.returncode})")
        results[config] = json.loads(out.strip().splitlines()[-1])
        print(f"  {config} done, load average {results[config]['load']:.2f}", flush=True)
    for kind in args.stores.split(","):
        old_rows, new_rows = results[f"{kind}/sweep"]["rows"], results[f"{kind}/segments"]["rows"]
        print(f"\n{kind:<7} store     |  sweep: entries  expiry µs/rec  total µs/rec | segments: entries  "
              "expiry µs/rec  total µs/rec | expiry sweep/segments")
        for old, new in zip(old_rows, new_rows, strict=True):
            ratio = f"{old[3] / new[3]:>9.0f}x" if new[3] > 0 else "        -"
            print(f"{old[0]:>8} rec {old[1]:4.1f} h | {old[2]:>14} {old[3]:>14.2f} {old[4]:>13.1f} | "
                  f"{new[2]:>17} {new[3]:>14.2f} {new[4]:>13.1f} | {ratio}")
    print(flush=True)


if __name__ == "__main__":
    main()
