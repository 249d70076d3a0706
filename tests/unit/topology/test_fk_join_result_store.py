"""A foreign-key join's result without ``materialized`` is kept in a store only when an operation
downstream needs one, as in Kafka Streams (``KTableSource`` materializes on demand): a result
that only goes on as a stream is forwarded as it is resolved, without a store write and a
changelog record per update. Either way the output is the same, update for update."""

from __future__ import annotations

from typing import Any

import pytest

from streamloop.serdes import StringSerde
from streamloop.testing import TopologyTestDriver
from streamloop.topology.builder import StreamsBuilder

STR = StringSerde()
CONFIG = {"cache.max.bytes.buffering": 0, "default.key.serde": STR, "default.value.serde": STR,
          "application.id": "fk-store"}
OUTPUT_STORE = "KTABLE-FK-JOIN-OUTPUT-STATE-STORE"

# Subscriptions, answers, a right row's update and delete, a foreign key's change, a left delete.
STEPS: list[tuple[str, str, str | None]] = [
    ("right", "r1", "R1"), ("right", "r2", "R2"), ("left", "l1", "a|r1"), ("left", "l2", "b|r2"),
    ("left", "l3", "c|r9"), ("right", "r1", "R1b"), ("left", "l1", "a|r2"), ("right", "r2", None),
    ("left", "l2", None), ("right", "r9", "R9"), ("left", "l3", "c2|r9"), ("left", "l3", None),
]


def joiner(left: str, right: str | None) -> str:
    return f"({left},{right})"


def run(materialized: bool, left_join: bool, downstream: str) -> tuple[dict[str, list[Any]], list[str], list[str]]:
    """Every output record per topic, the topology's stores and its changelog topics."""
    builder = StreamsBuilder()
    left = builder.table("left", key_serde=STR, value_serde=STR)
    right = builder.table("right", key_serde=STR, value_serde=STR)
    method = left.left_join if left_join else left.join
    joined = method(right, lambda v: v.split("|")[1], joiner, materialized="result" if materialized else None)
    joined.to_stream().to("output")
    if downstream == "rejoin":
        joined.join(left, lambda a, b: f"rejoin({a},{b})").to_stream().to("downstream")
    elif downstream == "filter":
        joined.filter(lambda _k, v: "R1" not in v).to_stream().to("downstream")
    elif downstream == "stream-join":
        builder.stream("clicks", key_serde=STR, value_serde=STR) \
            .join(joined, lambda click, row: f"{click}:{row}").to("downstream")
    topology = builder.build()
    topics = ["output"] + ([] if downstream == "stream" else ["downstream"])
    with TopologyTestDriver(topology, CONFIG) as driver:
        sides = ("left", "right") + (("clicks",) if downstream == "stream-join" else ())
        inputs = {side: driver.create_input_topic(side, STR, STR) for side in sides}
        outputs = {topic: driver.create_output_topic(topic, STR, STR) for topic in topics}
        seen: dict[str, list[Any]] = {topic: [] for topic in topics}
        for time, (side, key, value) in enumerate(STEPS, start=1):
            inputs[side].pipe_input(key, value, time)
            if downstream == "stream-join":
                inputs["clicks"].pipe_input(key if side == "left" else "l1", f"click{time}", time)
            for topic, output in outputs.items():
                seen[topic].extend(output.read_key_values())
        changelogs = [t for t in topology.internal_topics({"left": 1, "right": 1, "clicks": 1})
                      if t.endswith("-changelog")]
        return seen, topology.store_names, changelogs


@pytest.mark.parametrize("left_join", [False, True], ids=["inner", "left"])
def test_a_result_that_only_goes_on_as_a_stream_keeps_no_store(left_join: bool) -> None:
    unstored, stores, changelogs = run(False, left_join, "stream")
    stored, materialized_stores, materialized_changelogs = run(True, left_join, "stream")
    assert unstored == stored and unstored["output"]  # the same updates, in the same order
    assert not [s for s in stores if s.startswith(OUTPUT_STORE)]
    assert not [t for t in changelogs if OUTPUT_STORE in t]
    assert "result" in materialized_stores and [t for t in materialized_changelogs if "result-changelog" in t]


@pytest.mark.parametrize("downstream", ["rejoin", "filter", "stream-join"])
@pytest.mark.parametrize("left_join", [False, True], ids=["inner", "left"])
def test_a_result_read_downstream_or_needing_old_values_is_kept_in_a_store(left_join: bool, downstream: str) -> None:
    unstored, stores, changelogs = run(False, left_join, downstream)
    stored, _stores, _changelogs = run(True, left_join, downstream)
    assert unstored == stored and unstored["downstream"]
    assert len([s for s in stores if s.startswith(OUTPUT_STORE)]) == 1
    assert len([t for t in changelogs if OUTPUT_STORE in t]) == 1
