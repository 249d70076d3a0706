"""For drawn records on three streams (one of them re-keyed, so it goes through a repartition
topic), with None keys and values among them, a cogroup of the three grouped streams, each with
its own aggregator, gives what a pure-Python model of Kafka Streams' CogroupedKStream gives:

- the table at the end: per key, each input's count and sum of the records it brought (a record
  without a key or a value counts for nothing), the aggregate all inputs update together;
- its updates: one per counted record (no cache), each the key's aggregate with that one record
  added, ending at the key's final aggregate.

And a windowed cogroup of two streams, whose records arrive out of order: per window, what the
records the window took give, where a record is taken by each window it falls in that is still
open by the stream time ALL inputs moved (window end plus grace after the largest timestamp seen).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamloop import StreamsBuilder
from streamloop.serdes import JsonSerde, StringSerde
from streamloop.state import TimeWindows
from streamloop.testing import TopologyTestDriver

STR, JSON = StringSerde(), JsonSerde()
CONFIG = {"cache.max.bytes.buffering": 0, "default.key.serde": STR, "default.value.serde": JSON}
INPUTS = ("one", "two", "three")

records = st.lists(
    st.tuples(st.sampled_from(INPUTS), st.none() | st.sampled_from(["a", "b", "c"]),
              st.none() | st.integers(0, 9)),  # input, key (None: no key), value (None: no value)
    max_size=30)


def adder(slot: str) -> Any:
    def add(_key: str, value: int, aggregate: dict[str, list[int]]) -> dict[str, list[int]]:
        count, total = aggregate[slot]
        return {**aggregate, slot: [count + 1, total + value]}
    return add


def initial() -> dict[str, list[int]]:
    return {slot: [0, 0] for slot in INPUTS}


def model(inputs: list[tuple[str, str | None, int | None]]) -> tuple[dict[str, Any], Counter[str]]:
    """The final aggregate per key, and how many updates each key gets."""
    table: dict[str, Any] = {}
    updates: Counter[str] = Counter()
    for slot, key, value in inputs:
        # "three" is re-keyed by its value's parity: its key is known only when its value is.
        if slot == "three":
            key = None if key is None or value is None else f"{key}{value % 2}"
        if key is None or value is None:
            continue
        table[key] = adder(slot)(key, value, table.get(key, initial()))
        updates[key] += 1
    return table, updates


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inputs=records)
def test_cogroup_matches_the_model(inputs: list[tuple[str, str | None, int | None]]) -> None:
    builder = StreamsBuilder()
    grouped = {t: builder.stream(t, key_serde=STR, value_serde=JSON) for t in INPUTS}
    three = grouped["three"].map(lambda k, v: (None if k is None or v is None else f"{k}{v % 2}", v))
    one, two, three_g = grouped["one"].group_by_key(), grouped["two"].group_by_key(), three.group_by_key()
    table = (one.cogroup(adder("one")).cogroup(two, adder("two")).cogroup(three_g, adder("three"))
             .aggregate(initial, materialized="totals"))
    table.to_stream().to("out")
    expected, counts = model(inputs)
    with TopologyTestDriver(builder.build(), CONFIG, partitions={t: 2 for t in INPUTS}) as driver:
        topics = {t: driver.create_input_topic(t, STR, JSON) for t in INPUTS}
        for timestamp, (topic, key, value) in enumerate(inputs):
            topics[topic].pipe_input(key, value, timestamp)
        assert dict(driver.get_key_value_store("totals").all()) == expected
        updates = driver.create_output_topic("out", STR, JSON).read_key_values()
    assert Counter(k for k, _ in updates) == counts
    last: dict[str, Any] = {}
    for key, aggregate in updates:
        before = last.get(key, initial())
        # Exactly one input's count went up by one: one record added, by its own input's aggregator.
        grew = [s for s in INPUTS if aggregate[s][0] != before[s][0]]
        assert len(grew) == 1 and aggregate[grew[0]][0] == before[grew[0]][0] + 1, (before, aggregate)
        last[key] = aggregate
    assert last == expected


windowed_records = st.lists(
    st.tuples(st.sampled_from(INPUTS[:2]), st.sampled_from(["a", "b"]), st.integers(0, 9), st.integers(0, 60)),
    max_size=30)  # input, key, value, timestamp (out of order)

SIZE, GRACE = 10, 5


def windowed_model(inputs: list[tuple[str, str, int, int]]) -> dict[tuple[str, int], Any]:
    """Per (key, window start): the aggregate of the records its window took."""
    windows: dict[tuple[str, int], Any] = {}
    stream_time = -1
    for slot, key, value, timestamp in inputs:
        stream_time = max(stream_time, timestamp)  # one stream time, whichever input moved it
        for start in range(timestamp - timestamp % SIZE, -1, -SIZE):
            if start + SIZE <= timestamp:
                break
            if start + SIZE + GRACE <= stream_time:
                continue  # closed: the record is late for this window
            windows[(key, start)] = adder(slot)(key, value, windows.get((key, start), initial()))
    return windows


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inputs=windowed_records)
def test_windowed_cogroup_matches_the_model(inputs: list[tuple[str, str, int, int]]) -> None:
    builder = StreamsBuilder()
    one = builder.stream("one", key_serde=STR, value_serde=JSON).group_by_key()
    two = builder.stream("two", key_serde=STR, value_serde=JSON).group_by_key()
    table = (one.cogroup(adder("one")).cogroup(two, adder("two"))
             .windowed_by(TimeWindows.of_size_and_grace(SIZE, GRACE)).aggregate(initial, materialized="w"))
    seen: dict[tuple[str, int], Any] = {}
    table.to_stream().foreach(lambda w, v: seen.__setitem__((w.key, w.start), v))
    with TopologyTestDriver(builder.build(), CONFIG) as driver:
        topics = {t: driver.create_input_topic(t, STR, JSON) for t in INPUTS[:2]}
        for topic, key, value, timestamp in inputs:
            topics[topic].pipe_input(key, value, timestamp)
    assert seen == windowed_model(inputs)
