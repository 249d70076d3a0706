"""For drawn records of a stream (updates and deletes, some without a key), read as a table with
``to_table``, its values transformed with ``transform_values`` (with a store or without) and
regrouped and summed, the engine gives what a pure-Python model of Kafka Streams gives:

- the table at the end: each key's latest value (a None value deleted it; a record without a
  key changed nothing), transformed;
- the sums per group at the end: each group's sum over the transformed rows now in it (a group
  that emptied keeps 0), which holds only if every changed or deleted row's OLD transformed
  value was subtracted from the group it left (KTableTransformValues sending old values);
- a process_values stage before it, which keeps keys, changes nothing of the above but the values.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamloop import FixedKeyRecord, Materialized, StreamsBuilder
from streamloop.serdes import JsonSerde, LongSerde, StringSerde
from streamloop.testing import TopologyTestDriver

STR, JSON, LONG = StringSerde(), JsonSerde(), LongSerde()
CONFIG = {"cache.max.bytes.buffering": 0, "default.key.serde": STR, "default.value.serde": JSON}

records = st.lists(st.tuples(st.none() | st.sampled_from(["a", "b", "c", "d"]), st.none() | st.integers(0, 20)),
                   max_size=30)


class Scaled:
    """transform(key, value): the value times the key's rank, plus one; None stays None."""

    def init(self, context: Any) -> None:
        pass

    def transform(self, key: str, value: int | None) -> int | None:
        return None if value is None else value * (ord(key) - ord("a") + 1) + 1

    def close(self) -> None:
        pass


class Doubling:
    def init(self, context: Any) -> None:
        self.context = context

    def process(self, record: FixedKeyRecord) -> None:
        self.context.forward(record.with_value(None if record.value is None else record.value * 2))

    def close(self) -> None:
        pass


def model(inputs: list[tuple[str | None, int | None]]) -> tuple[dict[str, int], dict[str, int]]:
    table: dict[str, int] = {}
    for key, value in inputs:
        if key is None:
            continue
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value * 2
    transformed = {k: v * (ord(k) - ord("a") + 1) + 1 for k, v in table.items()}
    groups: dict[str, int] = {}
    for key, value in inputs:  # every group a row ever entered is there (an emptied one at 0)
        if key is not None and value is not None:
            groups.setdefault(group_of(value * 2 * (ord(key) - ord("a") + 1) + 1), 0)
    for value in transformed.values():
        groups[group_of(value)] += value
    return transformed, groups


def group_of(value: int) -> str:
    return "odd" if value % 2 else "even"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inputs=records, materialized=st.booleans())
def test_to_table_transform_values_and_regrouping_match_the_model(
        inputs: list[tuple[str | None, int | None]], materialized: bool) -> None:
    builder = StreamsBuilder()
    table = builder.stream("input", key_serde=STR, value_serde=JSON).process_values(Doubling) \
        .to_table(materialized=Materialized("latest", value_serde=JSON))
    shown = table.transform_values(Scaled, materialized=Materialized("scaled", value_serde=JSON)
                                   if materialized else None)
    shown.to_stream().to("scaled-out")
    shown.group_by(lambda _k, v: (group_of(v), v), key_serde=STR, value_serde=LONG) \
        .reduce(lambda a, v: a + v, lambda a, v: a - v, materialized=Materialized("sums", value_serde=LONG))
    expected, sums = model(inputs)
    with TopologyTestDriver(builder.build(), CONFIG) as driver:
        topic = driver.create_input_topic("input", STR, JSON)
        for timestamp, (key, value) in enumerate(inputs):
            topic.pipe_input(key, value, timestamp)
        latest = {k: v for k, v in driver.create_output_topic("scaled-out", STR, JSON).read_key_values()}
        assert {k: v for k, v in latest.items() if v is not None} == expected
        if materialized:
            assert dict(driver.get_key_value_store("scaled").all()) == expected
        assert dict(driver.get_key_value_store("sums").all()) == sums
