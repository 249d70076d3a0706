"""A segmented window store under random puts, deletes, fetches and fetch ranges, with stream time
moving across several segments, commits, crashes and rebalances, equals a pure-Python model of
windows with a retention: every read (replays after a crash included) answers what the model holds,
and the store at the end, and restored from its changelog, holds the model's live windows.

The model knows nothing of segments: a window is kept while its start is within the retention
plus one window size of stream time (the newest window start put, deletes included). That reads
agree however the store's segments were dropped, restored or written back at a commit is the
property: a segment dropped early loses live windows, one kept too long or brought back by a write
held until a commit or a restore shows expired ones.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamloop import StreamsBuilder, TaskId
from streamloop.processors.api import BaseProcessor
from streamloop.records import Record
from streamloop.serdes import StringSerde
from streamloop.state import Stores
from streamloop.state.segments import SegmentedBytesStore, segment_interval
from streamloop.testing import AdvanceWallClock, Crash, Input, Rebalance, Step, TopologyTestDriver

STR = StringSerde()
SIZE, RETENTION = 30_000, 60_000
# Reads leave out a window once stream time is past its start by this much.
SPAN = RETENTION + SIZE - 1
EXAMPLES = int(os.environ.get("STREAMLOOP_SEGMENT_EXAMPLES", "100"))
KEYS = ["a", "b", "c"]
NEVER = 2**62


class Ops(BaseProcessor):
    """``put:i:start:v``, ``del:i:start``; ``get:i:start``, ``range:i:from:to`` and ``all:i`` forward
    ``i=<what they read>``."""

    def init(self, context: Any) -> None:
        super().init(context)
        self.store = context.get_state_store("w")

    def process(self, record: Record) -> None:
        op, index, *args = record.value.split(":")
        if op == "put":
            self.store.put(record.key, args[1], int(args[0]))
            return
        if op == "del":
            self.store.put(record.key, None, int(args[0]))
            return
        if op == "get":
            found = self.store.fetch(record.key, int(args[0]))
            answer = "none" if found is None else found
        elif op == "range":
            answer = ",".join(f"{s}/{v}" for s, v in self.store.fetch_range(record.key, int(args[0]), int(args[1])))
        else:
            answer = ",".join(sorted(f"{w.key}@{w.start}/{v}" for w, v in self.store.fetch_all(0, NEVER)))
        self.context.forward(record.with_value(f"{index}={answer}"))


def topology(persistent: bool, caching: bool) -> Any:
    supplier = (Stores.persistent_window_store("w", RETENTION, SIZE) if persistent
                else Stores.in_memory_window_store("w", RETENTION, SIZE))
    store = Stores.window_store_builder(supplier, STR, STR)
    builder = StreamsBuilder()
    builder.add_state_store(store.with_caching_enabled() if caching else store)
    builder.stream("in", key_serde=STR, value_serde=STR).process(Ops, stores=["w"]).to(
        "out", key_serde=STR, value_serde=STR)
    return builder.build()


class Model:
    def __init__(self) -> None:
        self.time = -1
        self.windows: dict[tuple[str, int], str] = {}

    def live(self) -> dict[tuple[str, int], str]:
        return {kw: v for kw, v in self.windows.items() if kw[1] >= self.time - SPAN}

    def apply(self, key: str, op: str, index: str, args: list[str]) -> str | None:
        if op in ("put", "del"):
            start = int(args[0])
            self.time = max(self.time, start)
            if op == "put":
                self.windows[(key, start)] = args[1]
            else:
                self.windows.pop((key, start), None)
            return None
        live = self.live()
        if op == "get":
            answer = live.get((key, int(args[0])), "none")
        elif op == "range":
            low, high = int(args[0]), int(args[1])
            answer = ",".join(f"{s}/{v}" for (k, s), v in sorted(live.items()) if k == key and low <= s <= high)
        else:
            answer = ",".join(sorted(f"{k}@{s}/{v}" for (k, s), v in live.items()))
        return f"{index}={answer}"


@st.composite
def scenarios(draw: st.DrawFn) -> list[Step]:
    """Window starts moving on by up to two thirds of a segment a record (so a run crosses several
    segments and a segment's drop falls between any two steps), some far behind stream time."""
    steps: list[Step] = []
    clock = 0
    step = segment_interval(RETENTION) * 2 // 3
    for index in range(draw(st.integers(1, 50))):
        kind = draw(st.sampled_from(["record"] * 10 + ["tick", "tick", "crash", "rebalance"]))
        if kind == "tick":
            steps.append(AdvanceWallClock(1_000))  # commit.interval.ms: a commit
            continue
        if kind == "crash":
            steps.append(Crash())
            continue
        if kind == "rebalance":
            steps.append(Rebalance(TaskId(0, 0)))
            continue
        key = draw(st.sampled_from(KEYS))
        op = draw(st.sampled_from(["put", "put", "put", "del", "get", "get", "range", "range", "all"]))
        clock += draw(st.integers(0, step)) // 1_000 * 1_000
        late = draw(st.sampled_from([0] * 5 + [10_000, SIZE, RETENTION, SPAN, SPAN + 1_000, 3 * RETENTION]))
        start = max(0, clock - late)
        if op == "put":
            value = f"put:{index}:{start}:v{index}"
        elif op in ("del", "get"):
            value = f"{op}:{index}:{start}"
        elif op == "range":
            value = f"range:{index}:{start}:{start + draw(st.sampled_from([0, SIZE, SPAN, 4 * RETENTION]))}"
        else:
            value = f"all:{index}"
        steps.append(Input("in", key, value, 0))
    return steps


def play(steps: list[Step], persistent: bool, caching: bool) -> None:
    config = {"commit.interval.ms": 1_000, "cache.max.bytes.buffering": (1 << 20) if caching else 0}
    model = Model()
    expected: dict[str, str] = {}
    with TopologyTestDriver(topology(persistent, caching), config) as driver:
        out = driver.create_output_topic("out", STR, STR)
        for step in steps:
            if isinstance(step, Input):
                op, index, *args = step.value.split(":")
                answer = model.apply(step.key, op, index, args)
                if answer is not None:
                    expected[index] = answer
        driver.play(steps, {"in": (STR, STR)})
        answers = out.read_values()
        assert {a.split("=")[0] for a in answers} == set(expected)
        wrong = [a for a in answers if expected[a.split("=")[0]] != a]
        assert not wrong, f"answers {wrong} differ from the model's {[expected[a.split('=')[0]] for a in wrong]}"
        store = driver.get_window_store("w")
        assert all(isinstance(s.durable, SegmentedBytesStore) for s in store._instances())
        want = {(k, s): v for (k, s), v in model.live().items()}
        assert {(w.key, w.start): v for w, v in store.all()} == want
        driver.rebalance(TaskId(0, 0))
        assert {(w.key, w.start): v for w, v in store.all()} == want, "the store restored from its changelog"


@pytest.mark.timeout(600)  # shrinking a counter-example takes minutes
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=scenarios(), persistent=st.booleans(), caching=st.booleans())
def test_a_segmented_window_store_equals_the_model_across_expiry_crashes_and_restores(
        steps: list[Step], persistent: bool, caching: bool) -> None:
    play(steps, persistent, caching)
