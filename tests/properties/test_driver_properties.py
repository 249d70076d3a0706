"""The ``TopologyTestDriver`` under hypothesis: deterministic, and exact under every fault schedule.

Hypothesis runs these with ``derandomize`` off (its default), so each run draws new inputs.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from streamloop import StreamsBuilder, TaskId, Topology
from streamloop.serdes import IntegerSerde, StringSerde
from streamloop.testing import Input, Step, TopologyTestDriver, by_key
from streamloop.testing.strategies import faults, inputs, partitioned, records, scenarios, task_ids

STR, INT = StringSerde(), IntegerSerde()
KEYS = st.text(alphabet="abcd", max_size=2)
SERDES = {"in": (STR, INT)}
CONTINUE = {"default.deserialization.exception.handler": "streamloop.handlers.LogAndContinueExceptionHandler"}


async def jittery_double(value: int) -> int:
    # An async processor whose wait depends on the input: the driver still gives one order.
    await asyncio.sleep((value % 7) / 10)
    return value * 2


def topology() -> Topology:
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=INT)
            .filter(lambda key, value: value % 3 != 0)
            .map_values(jittery_double)
            .flat_map(lambda key, value: [(key, value), (key + "!", value + 1)])
            .to("out", key_serde=STR, value_serde=INT))
    return builder.build()


def model(records: list[Input]) -> list[tuple[str, int]]:
    out = []
    for r in records:
        if r.value % 3 != 0:
            out += [(r.key, r.value * 2), (r.key + "!", r.value * 2 + 1)]
    return out


def run(scenario: list[Step], partitions: int) -> list[tuple[Any, ...]]:
    counts = {"in": partitions, "out": partitions}
    with TopologyTestDriver(topology(), CONTINUE, partitions=counts) as driver:
        out = driver.create_output_topic("out", STR, INT)
        driver.play(scenario, SERDES)
        return [(r.key, r.value, r.timestamp, r.partition, r.offset) for r in out.read_records()]


PARTITIONS = 3
SCENARIOS = scenarios(
    partitioned("in", PARTITIONS, KEYS, st.integers(-1000, 1000), out_of_order_ms=500, with_headers=True),
    faults=faults(task_ids(1, PARTITIONS), bad_record_topics=["in"]),
)


@settings(max_examples=60, deadline=None, derandomize=False)
@given(scenario=SCENARIOS)
def test_the_same_scenario_gives_the_same_output_in_the_same_order(scenario: list[Step]) -> None:
    assert run(scenario, PARTITIONS) == run(scenario, PARTITIONS)


@settings(max_examples=100, deadline=None)
@given(scenario=SCENARIOS)
def test_under_any_fault_schedule_the_output_is_the_model_output_per_key_in_order(scenario: list[Step]) -> None:
    output = run(scenario, PARTITIONS)
    assert by_key([(k, v) for k, v, *_ in output]) == by_key(model(inputs(scenario)))


@given(records("in", KEYS, st.integers(), out_of_order_ms=300, start_ms=1_000))
def test_records_are_late_by_at_most_the_bound(drawn: list[Input]) -> None:
    latest = 0
    for record in drawn:
        assert record.timestamp >= latest - 300
        latest = max(latest, record.timestamp)


@given(partitioned("in", 4, KEYS, st.integers()), st.data())
def test_partitioned_records_name_a_partition_in_range(drawn: list[Input], data: st.DataObject) -> None:
    assert all(r.partition is not None and 0 <= r.partition < 4 for r in drawn)


def test_task_ids_cover_every_subtopology_and_partition() -> None:
    assert task_ids(2, 2) == [TaskId(0, 0), TaskId(0, 1), TaskId(1, 0), TaskId(1, 1)]
