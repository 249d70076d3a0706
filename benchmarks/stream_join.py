"""Stream-stream join throughput on the ``TopologyTestDriver`` as its window stores fill.

Both streams get one record per key (keys all distinct), with a join window wider than the run,
so every record stays in its store and each one's lookup ranges over a store of a growing number
of keys: the cost that grows with the window's content. Printed per store kind (in memory,
RocksDB) for window fills of 2k, 8k and 30k records per side, side by side; flat figures mean a
record's cost does not grow with the window. Target: flat within the machine's noise.

Run: ``python benchmarks/stream_join.py`` (no broker needed).
"""

from __future__ import annotations

import logging
import time

from streamloop import JoinWindows, StreamsBuilder
from streamloop.serdes import IntegerSerde, StringSerde
from streamloop.testing import TopologyTestDriver

INT, STR = IntegerSerde(), StringSerde()
FILLS = (2_000, 8_000, 30_000)


def records_per_second(per_side: int, store: str) -> float:
    builder = StreamsBuilder()
    left = builder.stream("left", key_serde=INT, value_serde=STR)
    right = builder.stream("right", key_serde=INT, value_serde=STR)
    left.join(right, lambda a, b: a + b, JoinWindows.of_time_difference_with_no_grace(10**9)).to(
        "out", key_serde=INT, value_serde=STR)
    with TopologyTestDriver(builder.build(), {"default.dsl.store": store}) as driver:
        left_in, right_in = driver.create_input_topic("left", INT, STR), driver.create_input_topic("right", INT, STR)
        started = time.perf_counter()
        for i in range(per_side):
            left_in.pipe_input(i, "a", i)
            right_in.pipe_input(i, "b", i)
        elapsed = time.perf_counter() - started
        assert driver.create_output_topic("out", INT, STR).queue_size() == per_side
    return 2 * per_side / elapsed


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    print(f"{'store':<10}" + "".join(f"{f'{n} per side':>16}" for n in FILLS))
    for store in ("in_memory", "rocksDB"):
        figures = [records_per_second(n, store) for n in FILLS]
        print(f"{store:<10}" + "".join(f"{f'{rate:,.0f} rec/s':>16}" for rate in figures))


if __name__ == "__main__":
    main()
