"""Stream-stream joins equal a small model of Kafka Streams' semantics, for drawn inputs with
out-of-order timestamps, duplicates, and records without key or value.

The model is Kafka Streams' ``KStreamKStreamJoin`` (4.x) over plain lists: per side, the records
kept (a window store with duplicates, retention = before + after + grace behind the side's largest
timestamp); one shared stream time per task; unmatched records of an outer side waiting, ordered
by (timestamp, right before left, key), until ``timestamp + look-ahead + grace < stream time``, and
emitted by the next record that does not go back in time (with Kafka Streams' ``minTime`` check
ahead of the sweep). The engine runs the join on the test driver: its own tasks, stores (bytes,
serdes, sequence numbers, changelogs) and processors.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from streamloop import JoinWindows, StreamsBuilder
from streamloop.serdes import IntegerSerde, StringSerde
from streamloop.testing import TopologyTestDriver

INT, STR = IntegerSerde(), StringSerde()
LEFT, RIGHT = "L", "R"


def joiner(left: Any, right: Any) -> str:
    return f"{left}+{right}"


def model(events: list[tuple[str, int | None, str | None, int]], windows: JoinWindows, left_outer: bool,
          right_outer: bool) -> list[tuple[Any, Any, int]]:
    before, after, grace = windows.before_ms, windows.after_ms, windows.grace_ms
    retention = before + after + grace
    kept: dict[str, list[tuple[int, int, str]]] = {LEFT: [], RIGHT: []}  # (key, timestamp, value), arrival order
    side_time = {LEFT: -1, RIGHT: -1}
    waiting: dict[tuple[int, int, int], list[str]] = {}  # (timestamp, 1 left / 0 right, key) -> values
    stream_time, min_time = -1, None
    out: list[tuple[Any, Any, int]] = []

    def join(side: str, mine: Any, theirs: Any) -> str:
        return joiner(mine, theirs) if side == LEFT else joiner(theirs, mine)

    for side, key, value, ts in events:
        other = RIGHT if side == LEFT else LEFT
        outer_side = left_outer if side == LEFT else right_outer
        look_back, look_ahead = (before, after) if side == LEFT else (after, before)
        stream_time = max(stream_time, ts)
        if key is None:
            if outer_side and value is not None:
                out.append((None, join(side, value, None), ts))
            continue
        if value is not None:
            if left_outer and ts == stream_time and not (
                    min_time is not None and min_time + look_ahead + grace >= stream_time):
                min_time, open_sides = None, set()
                for entry in sorted(waiting):
                    at, is_left, waiting_key = entry
                    min_time = at
                    if len(open_sides) == 2:
                        break
                    if at + (after if is_left else before) + grace >= stream_time:
                        open_sides.add(is_left)
                        continue
                    for waiting_value in waiting.pop(entry):
                        out.append((waiting_key, joiner(waiting_value, None) if is_left
                                    else joiner(None, waiting_value), at))
            low = max(0, ts - look_back, side_time[other] - retention)
            high = max(0, ts + look_ahead)
            partners = sorted(((t, v) for k, t, v in kept[other] if k == key and low <= t <= high),
                              key=lambda p: p[0])
            for t, v in partners:
                waiting.pop((t, 0 if other == RIGHT else 1, key), None)
                out.append((key, join(side, value, v), max(ts, t)))
            if outer_side and not partners:
                if high < stream_time:
                    out.append((key, join(side, value, None), ts))
                else:
                    min_time = ts if min_time is None else min(min_time, ts)
                    waiting.setdefault((ts, 1 if side == LEFT else 0, key), []).append(value)
        side_time[side] = max(side_time[side], ts)
        if value is not None and ts >= side_time[side] - retention:
            kept[side].append((key, ts, value))
    return out


@st.composite
def inputs(draw: st.DrawFn) -> tuple[list[tuple[str, int | None, str | None, int]], JoinWindows, str]:
    count = draw(st.integers(0, 30))
    events = []
    for i in range(count):
        side = draw(st.sampled_from([LEFT, RIGHT]))
        key = draw(st.one_of(st.integers(0, 2), st.none()) if draw(st.integers(0, 9)) == 0 else st.integers(0, 2))
        value = None if draw(st.integers(0, 14)) == 0 else f"{side.lower()}{i}"
        events.append((side, key, value, draw(st.integers(0, 60))))
    windows = JoinWindows(draw(st.integers(0, 12)), draw(st.integers(0, 12)), draw(st.integers(0, 12)))
    return events, windows, draw(st.sampled_from(["join", "left_join", "outer_join"]))


@settings(max_examples=100)
@given(inputs())
def test_join_results_equal_the_model_of_kafka_streams(drawn: Any) -> None:
    """KStreamKStreamJoinTest / KStreamKStreamLeftJoinTest / KStreamKStreamOuterJoinTest, generalised."""
    events, windows, kind = drawn
    builder = StreamsBuilder()
    left = builder.stream("left", key_serde=INT, value_serde=STR)
    right = builder.stream("right", key_serde=INT, value_serde=STR)
    getattr(left, kind)(right, joiner, windows).to("out", key_serde=INT, value_serde=STR)
    with TopologyTestDriver(builder.build()) as driver:
        topics = {LEFT: driver.create_input_topic("left", INT, STR),
                  RIGHT: driver.create_input_topic("right", INT, STR)}
        out = driver.create_output_topic("out", INT, STR)
        for side, key, value, ts in events:
            topics[side].pipe_input(key, value, ts)
        got = [(r.key, r.value, r.timestamp) for r in out.read_records()]
    assert got == model(events, windows, kind != "join", kind == "outer_join")
