"""For drawn updates and deletes of two tables, with timestamps out of order, a table-table
join (inner, left, outer), and a filtered table regrouped and summed, give what a pure-Python
model of Kafka Streams' semantics gives:

- every update the join forwards, as KTableKTable{Inner,Left,Right,Outer}Join's processors do
  with old values sent (an update of one side joined with the other side's current value);
- the joined table at the end, which is the join of the two final tables by definition;
- the sums per group at the end: each group's sum over the rows now in it (a group that
  emptied keeps 0), which holds only if every moved or deleted row was subtracted from the
  group it left.

Tables without versioned stores keep the latest update by arrival, whatever its timestamp
(Kafka Streams' KTableSource), so the out-of-order timestamps must change nothing.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from streamloop import StreamsBuilder
from streamloop.serdes import JsonSerde, LongSerde, StringSerde
from streamloop.state import Materialized
from streamloop.testing import TopologyTestDriver

STR, JSON, LONG = StringSerde(), JsonSerde(), LongSerde()
CONFIG = {"cache.max.bytes.buffering": 0, "default.key.serde": STR, "default.value.serde": JSON}
KINDS = ("join", "left_join", "outer_join")

updates = st.lists(
    st.tuples(st.sampled_from(["left", "right"]), st.sampled_from(["a", "b", "c"]),
              st.none() | st.integers(0, 9), st.integers(0, 1_000)),  # side, key, value (None: delete), timestamp
    max_size=30)


def joiner(left: Any, right: Any) -> list[Any]:
    return [left, right]


def model_join(kind: str, inputs: list[tuple[str, str, int | None, int]]) -> list[tuple[str, Any]]:
    """The updates Kafka Streams' join processors forward, for updates piped in this order."""
    tables: dict[str, dict[str, int]] = {"left": {}, "right": {}}
    out: list[tuple[str, Any]] = []
    for side, key, value, _ts in inputs:
        mine, theirs = tables[side], tables["right" if side == "left" else "left"]
        old = mine.get(key)
        if value is None:
            mine.pop(key, None)
        else:
            mine[key] = value
        other = theirs.get(key)
        def join(v: Any, other: Any = other, side: str = side) -> Any:
            return joiner(v, other) if side == "left" else joiner(other, v)

        if kind == "join" or (kind == "left_join" and side == "right"):
            if other is None:
                continue  # nothing to join with
            if kind == "join":
                out.append((key, None if value is None else join(value)))
            else:  # the right side of a left join: the left row stays, with the right value or None
                out.append((key, join(value)))
        else:  # the left side of a left join, either side of an outer join
            if other is None and value is None and old is None:
                continue
            keeps = value is not None or (kind == "outer_join" and other is not None)
            out.append((key, join(value) if keeps else None))
    return out


def final_join(kind: str, left: dict[str, int], right: dict[str, int]) -> dict[str, Any]:
    keys = {"join": left.keys() & right.keys(), "left_join": left.keys(),
            "outer_join": left.keys() | right.keys()}[kind]
    return {k: joiner(left.get(k), right.get(k)) for k in keys}


def final_tables(inputs: list[tuple[str, str, int | None, int]]) -> tuple[dict[str, int], dict[str, int]]:
    tables: dict[str, dict[str, int]] = {"left": {}, "right": {}}
    for side, key, value, _ts in inputs:
        if value is None:
            tables[side].pop(key, None)
        else:
            tables[side][key] = value
    return tables["left"], tables["right"]


def model_sums(inputs: list[tuple[str, str, int | None, int]]) -> dict[str, int]:
    """Sums of the even left values per ``value % 3``; every group a row ever joined is kept."""
    seen: set[str] = set()
    rows: dict[str, int] = {}
    for side, key, value, _ts in inputs:
        if side != "left":
            continue
        if value is None or value % 2:
            rows.pop(key, None)
        else:
            rows[key] = value
            seen.add(str(value % 3))
    return {g: sum(v for v in rows.values() if str(v % 3) == g) for g in seen}


@settings(max_examples=25)
@given(inputs=updates, kind=st.sampled_from(KINDS))
def test_table_joins_and_regrouped_sums_match_the_model(inputs: list[tuple[str, str, int | None, int]],
                                                        kind: str) -> None:
    builder = StreamsBuilder()
    left = builder.table("left", key_serde=STR, value_serde=JSON)
    right = builder.table("right", key_serde=STR, value_serde=JSON)
    getattr(left, kind)(right, joiner).to_stream().to("joined")
    (left.filter(lambda _k, v: v % 2 == 0)
         .group_by(lambda _k, v: (str(v % 3), v), key_serde=STR, value_serde=LONG)
         .reduce(lambda agg, v: agg + v, lambda agg, v: agg - v, materialized=Materialized("sums", value_serde=LONG)))
    with TopologyTestDriver(builder.build(), CONFIG) as driver:
        topics = {side: driver.create_input_topic(side, STR, JSON) for side in ("left", "right")}
        for side, key, value, timestamp in inputs:
            topics[side].pipe_input(key, value, timestamp)
        forwarded = driver.create_output_topic("joined", STR, JSON).read_key_values()
        sums = dict(driver.get_key_value_store("sums").all())
    assert forwarded == model_join(kind, inputs)
    last: dict[str, Any] = {}
    for key, value in forwarded:
        last[key] = value
    assert {k: v for k, v in last.items() if v is not None} == final_join(kind, *final_tables(inputs))
    assert sums == model_sums(inputs)
