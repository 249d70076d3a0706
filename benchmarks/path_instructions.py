"""Instructions per record on the per-record path, counted by valgrind: an A/B that noise does not move.

Wall-clock and CPU-time A/B runs of a change to the per-record path move by 10-40% between runs on
the shared two-core machines (a min of seven runs of the same tree moved by a quarter), more than
most single changes give. Instructions executed are deterministic to about 0.5%, so this script
counts them: for each ``--tree`` (a checkout of this repository, e.g. ``git worktree add ../before
REV``), a child process builds the workload's topology in that tree's ``TopologyTestDriver``, warms
its task on ``--records`` records, and calls the task's own record path (the function the stream
thread's sequential loop calls per record) on them ``passes`` more times. Its instructions are
counted by ``valgrind --tool=callgrind``, once with 0 passes and once with 2; the difference over
the records is the path's instructions per record: decode, processors, store, changelog, collector,
the producer's append (the driver's in-memory one). Fetching, commits and the network are outside it.

Workloads (``benchmarks/workloads.py``'s orders): ``count``, as the compare.py peer's (string keys,
a RocksDB store with its changelog, record cache off, every update to the sink as JSON),
``stateless`` (JSON filter + map_values), and compare.py's session-window count (``session``) and
suppressed windowed count (``suppress``) as ``benchmarks/peers/streamloop.py`` builds them (records
2 ms apart, so that a key's next record falls about a session gap after its last and sessions
both merge and start; each pass later than the one before).
Needs ``valgrind`` on PATH. Reads two private attributes of the driver and the task (``_manager``,
``loop._path``): a tree from before they existed cannot be measured.

Run: ``python benchmarks/path_instructions.py --tree ../before --tree .`` (takes a minute or two
per tree and workload).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(tree: str, workload: str, records: int, passes: int) -> None:
    sys.path.insert(0, tree)
    sys.path.insert(1, str(ROOT))
    from benchmarks.workloads import enrich, keep, make_inputs
    from streamloop import StreamsBuilder
    from streamloop.records import FetchedRecord
    from streamloop.serdes import BytesSerde, JsonSerde, StringSerde
    from streamloop.state import Materialized
    from streamloop.testing import TopologyTestDriver

    builder = StreamsBuilder()
    if workload in ("session", "suppress"):
        from benchmarks.peers.process import PeerRun
        from benchmarks.peers.streamloop import dsl_topology

        dsl_topology(builder, PeerRun(workload, "", "path-instructions", "in", "out", ""))
    elif workload == "count":
        (builder.stream("in", key_serde=StringSerde(), value_serde=BytesSerde())
                .group_by_key()
                .count(materialized=Materialized("counts", persistent=True))
                .to_stream()
                .to("out", key_serde=StringSerde(), value_serde=JsonSerde()))
    else:
        (builder.stream("in", key_serde=BytesSerde(), value_serde=JsonSerde())
                .filter(lambda _key, order: keep(order))
                .map_values(enrich)
                .to("out", key_serde=BytesSerde(), value_serde=JsonSerde()))
    driver = TopologyTestDriver(builder.build(), {"application.id": "path-instructions",
                                                  "cache.max.bytes.buffering": 0, "commit.interval.ms": 10**9})
    inputs = make_inputs(records)
    driver.pipe_raw("in", inputs[0][0], inputs[0][1], 1)
    task = next(iter(driver._manager.tasks.values()))
    process = task.loop._path.process
    if workload in ("session", "suppress"):  # each pass later than the one before: its own windows
        step, span = 2, 2 * records + 10_000
        runs = [[FetchedRecord("in", 0, n * records + i + 2, 10_000 + n * span + i * step, key, value)
                 for i, (key, value) in enumerate(inputs)] for n in range(1 + passes)]
    else:
        raws = [FetchedRecord("in", 0, i + 2, 1_000 + i, key, value) for i, (key, value) in enumerate(inputs)]
        runs = [raws] * (1 + passes)
    for raws in runs:  # the first pass warms the store (every key in it) and the caches
        for raw in raws:
            process(raw)
    os._exit(0)  # not the driver's close: only the passes differ between the two counted runs


def instructions(tree: str, workload: str, records: int, passes: int) -> int:
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__,
               "--child", tree, "--workload", workload, "--records", str(records), "--passes", str(passes)]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"},
                          check=False)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"valgrind run of {tree} failed ({done.returncode}): {done.stderr[-800:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tree", action="append", help="a checkout to measure (repeatable; default: this one)")
    parser.add_argument("--workload", default="count,stateless",
                        help="comma-separated, of: count, stateless, session, suppress")
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--passes", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.workload, args.records, args.passes)
        return
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not on PATH: install it (Debian: apt-get install valgrind)")
    trees = args.tree or [str(ROOT)]
    print(f"instructions per record on the record path ({args.records:,} records x {args.passes} passes, valgrind)")
    for workload in (w.strip() for w in args.workload.split(",") if w.strip()):
        baseline = None
        for tree in trees:
            per_record = (instructions(tree, workload, args.records, args.passes)
                          - instructions(tree, workload, args.records, 0)) / (args.records * args.passes)
            ratio = "" if baseline is None else f"  ({per_record / baseline:.3f}x the first)"
            baseline = baseline or per_record
            print(f"  {workload:<10} {tree:<40} {per_record:>10,.0f}{ratio}", flush=True)


if __name__ == "__main__":
    main()
