"""For drawn updates and deletes of a global table interleaved with stream records, with
timestamps out of order, ``stream.join``/``left_join(global_table, key_selector, joiner)``
give what a pure-Python model of Kafka Streams' semantics gives:

- a global table without a versioned store keeps the latest update by arrival, whatever its
  timestamp (Kafka Streams' global KTableSource), and a None value deletes the row;
- each stream record is joined with the table's current row for ``key_selector(key, value)``
  (KStreamKTableJoinProcessor with a key mapper, KIP-962): no value, no output; an inner join
  emits only when the row exists; a left join always, with None for a missing row or a None
  lookup key; the output keeps the record's key and timestamp;
- the partition counts of the stream's topic and the table's topic differ: nothing is
  co-partitioned, yet every lookup sees the whole table.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamloop import StreamsBuilder
from streamloop.records import TopicPartition
from streamloop.serdes import JsonSerde, StringSerde
from streamloop.testing import TopologyTestDriver, eventually_async
from streamloop.transport import open_transport
from tests.support.apps import make_streams
from tests.support.cluster import Cluster, committed_offset

STR, JSON = StringSerde(), JsonSerde()
LOOKUPS = ["a", "b", "c", "d"]

# ("table", row key, value or None (delete), ts) or ("stream", record key, [lookup or None, n] or None, ts)
events = st.lists(
    st.one_of(
        st.tuples(st.just("table"), st.sampled_from(LOOKUPS), st.none() | st.integers(0, 9), st.integers(0, 1_000)),
        st.tuples(st.just("stream"), st.sampled_from(["x", "y", "z"]),
                  st.none() | st.tuples(st.none() | st.sampled_from(LOOKUPS), st.integers(0, 9)),
                  st.integers(0, 1_000))),
    max_size=40)


def selector(_key: str, value: list[Any]) -> Any:
    return value[0]


def joiner(value: list[Any], row: Any) -> list[Any]:
    return [value[1], row]


def model(left: bool, inputs: list[tuple[str, str, Any, int]]) -> tuple[list[tuple[str, Any, int]], dict[str, int]]:
    """The records Kafka Streams' join forwards, and the global table at the end."""
    table: dict[str, int] = {}
    out: list[tuple[str, Any, int]] = []
    for kind, key, value, ts in inputs:
        if kind == "table":
            if value is None:
                table.pop(key, None)
            else:
                table[key] = value
            continue
        if value is None:
            continue  # no value: nothing to join
        lookup, n = value
        row = None if lookup is None else table.get(lookup)
        if row is not None or left:
            out.append((key, [n, row], ts))
    return out, table


@settings(max_examples=60)
@given(inputs=events, left=st.booleans())
def test_global_table_joins_equal_the_model(inputs: list[tuple[str, str, Any, int]], left: bool) -> None:
    builder = StreamsBuilder()
    table = builder.global_table("rows", key_serde=STR, value_serde=JSON, materialized="rows-store")
    stream = builder.stream("in", key_serde=STR, value_serde=JSON)
    (stream.left_join if left else stream.join)(table, selector, joiner).to("out", key_serde=STR, value_serde=JSON)
    with TopologyTestDriver(builder.build(), {"default.dsl.store": "in_memory"},
                            partitions={"in": 2, "rows": 3}) as driver:
        rows = driver.create_input_topic("rows", STR, JSON)
        records = driver.create_input_topic("in", STR, JSON)
        out = driver.create_output_topic("out", STR, JSON)
        for kind, key, value, ts in inputs:
            if kind == "table":
                rows.pipe_input(key, value, timestamp=ts)
            else:
                records.pipe_input(key, None if value is None else list(value), timestamp=ts)
        got = [(r.key, r.value, r.timestamp) for r in out.read_records()]
        want, final = model(left, inputs)
        assert got == want
        assert dict(driver.get_key_value_store("rows-store").all()) == final


async def _client_run(rows: list[tuple[str, int | None, int]], records: list[tuple[str, Any, int]], left: bool,
                      state_dir: str) -> list[tuple[str, Any]]:
    bootstrap = f"memory://global-prop-{uuid.uuid4().hex[:8]}"
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    await cluster.create_topics({"rows": 3, "in": 2, "out": 1})
    for key, value, ts in rows:  # one by one: each with its own (out-of-order) timestamp
        await cluster.produce("rows", [(key, value)], STR, JSON, partitions=3, timestamp=ts)
    for key, value, ts in records:
        await cluster.produce("in", [(key, value)], STR, JSON, partitions=2, timestamp=ts)
    builder = StreamsBuilder()
    table = builder.global_table("rows", key_serde=STR, value_serde=JSON, materialized="rows-store")
    stream = builder.stream("in", key_serde=STR, value_serde=JSON)
    (stream.left_join if left else stream.join)(table, selector, joiner).to("out", key_serde=STR, value_serde=JSON)
    inputs = [TopicPartition("in", p) for p in range(2)]
    ends = await cluster.end_offsets(inputs)

    async def all_processed() -> bool:
        # Output is written before the offsets past it are committed (at-least-once).
        committed = [await committed_offset(cluster, "global-prop", tp) or 0 for tp in inputs]
        return all(c >= ends[tp] for c, tp in zip(committed, inputs, strict=True))

    async with make_streams(builder.build(), bootstrap, "global-prop", state_dir=state_dir,
                            default_dsl_store="in_memory"):
        await eventually_async(all_processed, timeout=30, what="every record processed")
        got = await cluster.read_all("out")
    return [(STR.deserialize(r.key), JSON.deserialize(r.value)) for r in got]


@settings(max_examples=10, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.sampled_from(LOOKUPS), st.none() | st.integers(0, 9), st.integers(0, 1_000)),
                     max_size=12),
       records=st.lists(st.tuples(st.sampled_from(["x", "y", "z"]),
                                  st.tuples(st.none() | st.sampled_from(LOOKUPS), st.integers(0, 9)).map(list),
                                  st.integers(0, 1_000)), min_size=1, max_size=12),
       left=st.booleans())
def test_a_client_joins_records_produced_before_start_with_the_whole_table(
        rows: list[tuple[str, int | None, int]], records: list[tuple[str, Any, int]], left: bool, tmp_path) -> None:
    """Every record produced before start sees every row produced before it (the bootstrap):
    the client's output, per stream partition, is the model's with all rows first."""
    got = asyncio.run(_client_run(rows, records, left, str(tmp_path / uuid.uuid4().hex)))
    want, _ = model(left, [("table", k, v, ts) for k, v, ts in rows] + [("stream", k, v, ts) for k, v, ts in records])
    # Records of one key share a partition: their order holds; across keys it depends on the threads.
    assert sorted(got, key=lambda kv: kv[0]) == sorted([(k, v) for k, v, _ in want], key=lambda kv: kv[0])
