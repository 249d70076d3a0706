"""What the windowed metrics cost the hot path.

A task pays two ``perf_counter_ns`` calls and one ``ProcessMeter.add`` per chunk of
up to 512 records; its stream thread pays one ``ThreadSensors.sample`` per poll-loop
iteration (one poll of up to ``max.poll.records``). This prints both costs and their
share of a record's budget at 75k records/s per thread (13.3 µs). Run:
``.venv/bin/python benchmarks/metrics_overhead.py``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamloop.metrics import ProcessMeter, SensorSettings, ThreadSensors

ROUNDS = 200_000
CHUNK = 512
POLL_RECORDS = 1000
BUDGET_NS = 1e9 / 75_000


def per_chunk_ns() -> float:
    meter = ProcessMeter()
    clock = time.perf_counter_ns
    began = clock()
    for _ in range(ROUNDS):
        start = clock()
        meter.add(CHUNK, clock() - start)
    return (clock() - began) / ROUNDS


def per_sample_ns() -> float:
    meter = ProcessMeter()
    now = [0]
    sensors = ThreadSensors(SensorSettings(30_000, 2), lambda: now[0])
    began = time.perf_counter_ns()
    for i in range(ROUNDS):
        now[0] = i  # one poll-loop iteration a millisecond: windows advance as in a run
        meter.add(POLL_RECORDS, 1_000_000)
        sensors.sample(meter, i, i // 100)
    return (time.perf_counter_ns() - began) / ROUNDS


def per_read_us() -> float:
    sensors = ThreadSensors(SensorSettings(30_000, 2), lambda: 0)
    began = time.perf_counter_ns()
    for _ in range(10_000):
        sensors.values()
    return (time.perf_counter_ns() - began) / 10_000 / 1000


def main() -> None:
    chunk = min(per_chunk_ns() for _ in range(3))
    sample = min(per_sample_ns() for _ in range(3))
    read = per_read_us()
    per_record = chunk / CHUNK + sample / POLL_RECORDS
    print(f"  per chunk of {CHUNK} (2 clock reads + meter add): {chunk:8.0f} ns")
    print(f"  per poll-loop iteration (sensors.sample):         {sample:8.0f} ns")
    print(f"  per record, at full chunks and polls of {POLL_RECORDS}:      {per_record:8.2f} ns "
          f"= {100 * per_record / BUDGET_NS:.3f}% of a record's budget at 75k records/s")
    print(f"  one read of a thread's windowed values (reader's thread): {read:.1f} µs")


if __name__ == "__main__":
    main()
