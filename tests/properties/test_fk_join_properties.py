"""For drawn updates and deletes of two tables (left rows moving between foreign keys, to no
foreign key and back, right rows coming and going), with timestamps out of order, topics of
drawn partition counts (the tables not co-partitioned), the record cache on or off (updates
coalesced per key before they are forwarded) and a crash at a drawn point, a
foreign-key join (inner and left) ends at what a pure-Python model of Kafka Streams' semantics
gives: each left row joined with the right row its foreign key names now (KIP-213; the
KTableKTableForeignKeyJoinIntegrationTest cases are the step-by-step version of this).

Tables without versioned stores keep the latest update by arrival whatever its timestamp
(Kafka Streams' KTableSource), so the out-of-order timestamps must change nothing; a crash
replays the records since the last commit, which must change nothing either (the subscription
and result stores are restored from their changelogs).

The foreign key comes from the value alone (``foreign_key_extractor``) or from the key and the
value (``foreign_key_from_key_and_value``, Kafka Streams 4.0's ``BiFunction`` extractor): there
rows "c" and "d" name the right row after the one their value names.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from streamloop import StreamsBuilder
from streamloop.serdes import JsonSerde, StringSerde
from streamloop.state import Materialized
from streamloop.testing import TopologyTestDriver

STR, JSON = StringSerde(), JsonSerde()
CONFIG = {"cache.max.bytes.buffering": 0, "default.key.serde": STR, "default.value.serde": JSON}

left_values = st.none() | st.tuples(st.integers(0, 9), st.none() | st.sampled_from(["x", "y", "z"]))
updates = st.lists(
    st.one_of(
        st.tuples(st.just("left"), st.sampled_from(["a", "b", "c", "d"]), left_values, st.integers(0, 1_000)),
        st.tuples(st.just("right"), st.sampled_from(["x", "y", "z"]), st.none() | st.integers(0, 9),
                  st.integers(0, 1_000))),
    min_size=10, max_size=40)


def foreign_key(value: list[Any]) -> Any:
    return value[1]


NEXT = {"x": "y", "y": "z", "z": "x"}


def foreign_key_of_key(key: str, value: list[Any]) -> Any:
    return value[1] if value[1] is None or key in ("a", "b") else NEXT[value[1]]


def joiner(left: list[Any], right: Any) -> list[Any]:
    return [left[0], right]


def model(inputs: list[tuple[str, str, Any, int]], left_join: bool, by_key: bool) -> dict[str, Any]:
    tables: dict[str, dict[str, Any]] = {"left": {}, "right": {}}
    for side, key, value, _ts in inputs:
        if value is None:
            tables[side].pop(key, None)
        else:
            tables[side][key] = list(value) if isinstance(value, tuple) else value
    result = {}
    for key, value in tables["left"].items():
        fk = foreign_key_of_key(key, value) if by_key else foreign_key(value)
        right = None if fk is None else tables["right"].get(fk)
        if right is not None or left_join:
            result[key] = joiner(value, right)
    return result


@settings(max_examples=30)
@given(inputs=updates, left_join=st.booleans(), by_key=st.booleans(), left_partitions=st.integers(1, 3),
       right_partitions=st.integers(1, 3), crash_at=st.none() | st.integers(0, 40),
       cache=st.sampled_from([0, 1 << 20]))
def test_foreign_key_join_ends_at_the_model(inputs: list[tuple[str, str, Any, int]], left_join: bool,
                                            by_key: bool, left_partitions: int, right_partitions: int,
                                            crash_at: int | None, cache: int) -> None:
    builder = StreamsBuilder()
    left = builder.table("left", key_serde=STR, value_serde=JSON)
    right = builder.table("right", key_serde=STR, value_serde=JSON)
    join = left.left_join if left_join else left.join
    materialized = Materialized("joined", value_serde=JSON)
    if by_key:
        joined = join(right, foreign_key_from_key_and_value=foreign_key_of_key, joiner=joiner,
                      materialized=materialized)
    else:
        joined = join(right, foreign_key, joiner, materialized=materialized)
    joined.to_stream().to("output")
    partitions = {"left": left_partitions, "right": right_partitions}
    config = {**CONFIG, "cache.max.bytes.buffering": cache}
    with TopologyTestDriver(builder.build(), config, partitions=partitions) as driver:
        topics = {side: driver.create_input_topic(side, STR, JSON) for side in ("left", "right")}
        for i, (side, key, value, timestamp) in enumerate(inputs):
            if i == crash_at:
                driver.crash()
            topics[side].pipe_input(key, None if value is None else list(value) if side == "left" else value,
                                    timestamp)
        stored = dict(driver.get_key_value_store("joined").all())
        forwarded: dict[str, Any] = {}
        for key, value in driver.create_output_topic("output", STR, JSON).read_key_values():
            forwarded[key] = value
    want = model(inputs, left_join, by_key)
    assert stored == want
    assert {k: v for k, v in forwarded.items() if v is not None} == want
