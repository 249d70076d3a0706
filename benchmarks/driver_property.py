"""How long a hypothesis property over a small topology takes on the ``TopologyTestDriver``.

The property is the ten-line one of docs/testing.md: a filter + map topology, inputs drawn by
``streamloop.testing.strategies.records`` (up to 50 records) with a fault schedule (processor
timeouts, crashes, rebalances, bad records), played on a fresh driver and compared with a model.
It runs 100 examples per round, 5 rounds, and prints the median seconds per 100 examples, plus
the driver's rate for a plain stream of records (no hypothesis) for scale. Target: under a second
per hundred examples.

Run: ``python benchmarks/driver_property.py`` (no broker needed).
"""

from __future__ import annotations

import logging
import statistics
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamloop import StreamsBuilder, Topology
from streamloop.serdes import IntegerSerde, StringSerde
from streamloop.testing import TopologyTestDriver, by_key, inputs
from streamloop.testing.strategies import faults, records, scenarios

STR, INT = StringSerde(), IntegerSerde()
CONFIG = {"default.deserialization.exception.handler": "streamloop.handlers.LogAndContinueExceptionHandler"}
ROUNDS = 5
EXAMPLES = 100


def build() -> Topology:
    builder = StreamsBuilder()
    (builder.stream("orders", key_serde=STR, value_serde=INT)
            .filter(lambda customer, amount: amount > 0)
            .map_values(lambda amount: amount * 2)
            .to("doubled", key_serde=STR, value_serde=INT))
    return builder.build()


@settings(max_examples=EXAMPLES, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(scenarios(records("orders", st.text(max_size=3), st.integers(-99, 99)),
                 faults=faults(bad_record_topics=["orders"])))
def doubled_orders_match_the_model(scenario: list) -> None:
    with TopologyTestDriver(build(), CONFIG) as driver:
        doubled = driver.create_output_topic("doubled", STR, INT)
        driver.play(scenario, {"orders": (STR, INT)})
        expected = by_key((r.key, r.value * 2) for r in inputs(scenario) if r.value > 0)
        assert by_key(doubled.read_key_values()) == expected


def plain_rate(count: int = 20_000) -> float:
    with TopologyTestDriver(build()) as driver:
        orders = driver.create_input_topic("orders", STR, INT)
        driver.create_output_topic("doubled", STR, INT)
        started = time.perf_counter()
        for n in range(count):
            orders.pipe_input(f"c{n % 10}", n)
        return count / (time.perf_counter() - started)


def main() -> None:
    # Handlers' log records are made (as under pytest) but not printed.
    logging.basicConfig(handlers=[logging.NullHandler()])
    rounds, cpu = [], []
    for _ in range(ROUNDS):
        started, started_cpu = time.perf_counter(), time.process_time()
        doubled_orders_match_the_model()
        rounds.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    # CPU time too: on a shared machine the wall time also counts other processes' turns.
    print(f"hypothesis property, {EXAMPLES} examples: median {statistics.median(rounds):.2f} s wall, "
          f"{statistics.median(cpu):.2f} s CPU (wall rounds: {', '.join(f'{r:.2f}' for r in rounds)})")
    print(f"driver, one record per pipe_input call: {plain_rate():,.0f} records/s")


if __name__ == "__main__":
    main()
