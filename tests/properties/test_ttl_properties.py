"""A key-value store with a time to live (by record time) under random input, sweeps, commits,
crashes and rebalances equals a pure-Python model: every read of every record (replays after a
crash included) answers what the model's store held, and the store at the end (and restored
from its changelog alone) holds the model's live entries.

The model knows nothing of sweeps or commits: it keeps each key's value and stamp and leaves out
an entry once its partition's stream time reaches ``stamp + ttl``. That the engine agrees whatever
the sweep deleted, and whenever, is the property: reads must not depend on sweep timing, and a
restore must neither resurrect a live entry's predecessor nor apply a delete from after the commit
it restores to.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamloop import StreamsBuilder, TaskId
from streamloop.processors.api import BaseProcessor
from streamloop.records import Record
from streamloop.serdes import StringSerde
from streamloop.state import Stores
from streamloop.testing import AdvanceWallClock, Crash, Input, Rebalance, Step, TopologyTestDriver

STR = StringSerde()
TTL = 100
# A long search for a counter-example: STREAMLOOP_TTL_EXAMPLES=2000 (make test runs 100).
EXAMPLES = int(os.environ.get("STREAMLOOP_TTL_EXAMPLES", "100"))
KEYS = ["a", "b", "c", "d"]


class Ops(BaseProcessor):
    """``put:i`` stores ``i``, ``del:i`` deletes the key, ``get:i`` forwards ``i=<value or none>``."""

    def init(self, context: Any) -> None:
        super().init(context)
        self.store = context.get_state_store("ttl")

    def process(self, record: Record) -> None:
        op, index = record.value.split(":")
        if op == "put":
            self.store.put(record.key, index)
        elif op == "del":
            self.store.delete(record.key)
        else:
            found = self.store.get(record.key)
            self.context.forward(record.with_value(f"{index}={'none' if found is None else found}"))


def topology(persistent: bool, caching: bool, sweep_interval: int, sweep_entries: int,
             by: str = "record_time") -> Any:
    supplier = (Stores.persistent_key_value_store("ttl") if persistent
                else Stores.in_memory_key_value_store("ttl"))
    store = Stores.key_value_store_builder(supplier, STR, STR).with_ttl(
        TTL, by=by, sweep_interval=sweep_interval, sweep_entries=sweep_entries)
    builder = StreamsBuilder()
    builder.add_state_store(store.with_caching_enabled() if caching else store)
    builder.stream("in", key_serde=STR, value_serde=STR).process(Ops, stores=["ttl"]).to(
        "out", key_serde=STR, value_serde=STR)
    return builder.build()


@dataclass
class Model:
    """Per partition: stream time, and each key's (value, stamp)."""

    partitions: int

    def __post_init__(self) -> None:
        self.time = [-1] * self.partitions
        self.entries: list[dict[str, tuple[str, int]]] = [{} for _ in range(self.partitions)]

    def apply(self, partition: int, key: str, op: str, index: str, timestamp: int) -> str | None:
        """The record's answer (gets only)."""
        self.time[partition] = now = max(self.time[partition], timestamp)
        entries = self.entries[partition]
        if op == "put":
            entries[key] = (index, timestamp)
        elif op == "del":
            entries.pop(key, None)
        else:
            found = entries.get(key)
            return f"{index}={found[0] if found is not None and found[1] > now - TTL else 'none'}"
        return None

    def live(self) -> dict[str, str]:
        return {key: value for p, entries in enumerate(self.entries) for key, (value, stamp) in entries.items()
                if stamp > self.time[p] - TTL}


def partition_of(key: str, partitions: int) -> int:
    return KEYS.index(key) % partitions


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[int, list[Step]]:
    """Records a TTL's fraction apart (so that an entry outlives a commit and expires before the
    next one often), some late; commits (the wall clock passing commit.interval.ms), crashes and
    rebalances between them."""
    partitions = draw(st.integers(1, 2))
    keys = KEYS[:draw(st.integers(1, len(KEYS)))]
    tasks = [TaskId(0, p) for p in range(partitions)]
    steps: list[Step] = []
    clock = 1_000
    for index in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["record"] * 10 + ["tick", "tick", "crash", "crash", "rebalance"]))
        if kind == "record":
            key = draw(st.sampled_from(keys))
            op = draw(st.sampled_from(["put", "put", "get", "get", "del"]))
            clock += draw(st.integers(0, TTL // 2))
            late = draw(st.sampled_from([0] * 7 + [30, TTL, 2 * TTL]))
            steps.append(Input("in", key, f"{op}:{index}", max(0, clock - late),
                               partition=partition_of(key, partitions)))
        elif kind == "tick":
            steps.append(AdvanceWallClock(1_000))  # commit.interval.ms: a commit
        elif kind == "crash":
            steps.append(Crash())
        else:
            steps.append(Rebalance(draw(st.sampled_from(tasks))))
    return partitions, steps


def play(partitions: int, steps: list[Step], persistent: bool, caching: bool, sweep_interval: int,
         sweep_entries: int) -> None:
    config = {"commit.interval.ms": 1_000, "cache.max.bytes.buffering": (1 << 20) if caching else 0}
    model = Model(partitions)
    expected: dict[str, str] = {}
    with TopologyTestDriver(topology(persistent, caching, sweep_interval, sweep_entries), config,
                            partitions={"in": partitions, "out": partitions}) as driver:
        out = driver.create_output_topic("out", STR, STR)
        for step in steps:
            if isinstance(step, Input):
                op, index = step.value.split(":")
                answer = model.apply(step.partition or 0, step.key, op, index, step.timestamp)
                if answer is not None:
                    expected[index] = answer
        driver.play(steps, {"in": (STR, STR)})
        answers = out.read_values()
        # Replays after a crash answer again: each answer, every time, is the model's.
        assert {a.split("=")[0] for a in answers} == set(expected)
        wrong = [a for a in answers if expected[a.split("=")[0]] != a]
        assert not wrong, f"answers {wrong} differ from the model's {[expected[a.split('=')[0]] for a in wrong]}"
        store = driver.get_key_value_store("ttl")
        assert dict(store.all()) == model.live()
        for task in driver.task_ids:
            driver.rebalance(task)
        assert dict(store.all()) == model.live(), "the store restored from its changelog"


@pytest.mark.timeout(600)  # shrinking a counter-example takes minutes
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios(), persistent=st.booleans(), caching=st.booleans(),
       sweep_interval=st.sampled_from([1, 10, TTL]), sweep_entries=st.sampled_from([1, 2, 100]))
def test_reads_and_restores_of_a_ttl_store_equal_the_model(scenario: tuple[int, list[Step]], persistent: bool,
                                                           caching: bool, sweep_interval: int,
                                                           sweep_entries: int) -> None:
    partitions, steps = scenario
    play(partitions, steps, persistent, caching, sweep_interval, sweep_entries)


@st.composite
def wall_clock_scenarios(draw: st.DrawFn) -> list[Step]:
    """Records (their timestamps play no part), the wall clock moving by up to 1.5 TTL, crashes and
    rebalances."""
    keys = KEYS[:draw(st.integers(1, len(KEYS)))]
    steps: list[Step] = []
    for index in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["record"] * 6 + ["tick", "tick", "crash", "rebalance"]))
        if kind == "record":
            op = draw(st.sampled_from(["put", "put", "get", "get", "del"]))
            steps.append(Input("in", draw(st.sampled_from(keys)), f"{op}:{index}", draw(st.integers(0, 10**6)),
                               partition=0))
        elif kind == "tick":
            steps.append(AdvanceWallClock(draw(st.integers(0, 3 * TTL // 2))))
        elif kind == "crash":
            steps.append(Crash())
        else:
            steps.append(Rebalance(TaskId(0, 0)))
    return steps


@pytest.mark.timeout(600)
@settings(max_examples=EXAMPLES // 2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=wall_clock_scenarios(), persistent=st.booleans(), caching=st.booleans(),
       sweep_interval=st.sampled_from([1, 10, TTL]), sweep_entries=st.sampled_from([1, 2, 100]))
def test_a_wall_clock_ttl_store_equals_the_model_across_crashes_and_restores(
        steps: list[Step], persistent: bool, caching: bool, sweep_interval: int, sweep_entries: int) -> None:
    """By wall clock, committing after every record (so that a crash replays nothing and each write's
    stamp is the wall clock when it was first made): what each read answers, the store at the end and
    the store restored from its changelog alone are the model's, sweeps and restores in between."""
    config = {"commit.interval.ms": 0, "cache.max.bytes.buffering": (1 << 20) if caching else 0}
    entries: dict[str, tuple[str, int]] = {}
    expected: list[str] = []
    wall = 0
    for step in steps:
        if isinstance(step, AdvanceWallClock):
            wall += step.ms
        elif isinstance(step, Input):
            op, index = step.value.split(":")
            if op == "put":
                entries[step.key] = (index, wall)
            elif op == "del":
                entries.pop(step.key, None)
            else:
                found = entries.get(step.key)
                expected.append(f"{index}={found[0] if found is not None and found[1] > wall - TTL else 'none'}")
    live = {key: value for key, (value, stamp) in entries.items() if stamp > wall - TTL}
    ttl_topology = topology(persistent, caching, sweep_interval, sweep_entries, "wall_clock")
    with TopologyTestDriver(ttl_topology, config) as driver:
        out = driver.create_output_topic("out", STR, STR)
        driver.play(steps, {"in": (STR, STR)})
        assert out.read_values() == expected
        store = driver.get_key_value_store("ttl")
        assert dict(store.all()) == live
        driver.rebalance(driver.task_ids[0])
        assert dict(store.all()) == live, "the store restored from its changelog"
