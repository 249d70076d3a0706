"""For drawn records over two partitions with out-of-order event times (some invalid), the order a
task processes them in and its stream time equal a small model of Kafka Streams' ``PartitionGroup``:

- the next record comes from the partition whose head has the lowest extracted timestamp;
- a record whose extracted timestamp is negative is dropped (``RecordQueue``) and moves no time;
- stream time is the largest timestamp of the records taken so far (never goes back).

Event times of valid records are distinct, so that the partition to take from is never a tie
(Kafka Streams leaves ties to its priority queue).

And a timestamped store used as an out-of-order guard keeps what a dict model keeps, across
rebalances that restore it from its changelog; a versioned store answers as a model of every
version put would.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from streamloop.serdes import JsonSerde, StringSerde
from streamloop.state.bytes_stores import InMemoryBytesStore
from streamloop.state.timestamped import ValueAndTimestamp
from streamloop.state.versioned import (
    PUT_RETURN_CODE_NOT_PUT,
    PUT_RETURN_CODE_VALID_TO_UNDEFINED,
    VersionedKeyValueStore,
    VersionedRecord,
)
from streamloop.testing import TopologyTestDriver, eventually_async
from streamloop.timestamps import ConsumedRecord
from streamloop.topology.builder import StreamsBuilder
from tests.unit.state.test_timestamped_store import latest_topology
from tests.unit.tasks.test_task import A, B, TaskRig, plain
from tests.unit.tasks.test_timestamps import Seen

Drawn = list[list[tuple[str, int]]]  # per partition: (name, event time) in offset order


class SkipNegative:
    """The value's ``t``; negative ones drop the record (as ``LogAndSkipOnInvalidTimestamp``)."""

    def extract(self, record: ConsumedRecord, partition_time: int) -> int:
        return int(record.value["t"])


def model(partitions: Drawn) -> tuple[list[tuple[str, int, int]], int]:
    """(name, timestamp, stream time before it) in processing order, and the final stream time."""
    queues = [deque(p) for p in partitions]
    stream_time, order = -1, list[tuple[str, int, int]]()
    while True:
        for queue in queues:
            while queue and queue[0][1] < 0:
                queue.popleft()  # dropped at the head: never chosen, moves nothing
        heads = [q for q in queues if q]
        if not heads:
            return order, stream_time
        name, t = min(heads, key=lambda q: q[0][1]).popleft()
        order.append((name, t, stream_time))
        stream_time = max(stream_time, t)


@st.composite
def records(draw: Any) -> Drawn:
    times = draw(st.lists(st.integers(0, 1_000), unique=True, max_size=16))
    partitions: Drawn = [[], []]
    for i, t in enumerate(times):
        invalid = draw(st.integers(0, 5)) == 0
        partitions[draw(st.integers(0, 1))].append((f"r{i}", -1 - i if invalid else t))
    return partitions


async def run(partitions: Drawn) -> tuple[list[tuple[str, int, int]], int]:
    holder: list[TaskRig] = []
    seen = Seen(holder)
    builder = StreamsBuilder()
    builder.stream(["a", "b"], value_serde=JsonSerde(), timestamp_extractor=SkipNegative()).process(
        lambda: seen, name="seen")
    rig = TaskRig(builder.build(), partitions=[A, B])
    holder.append(rig)
    for tp, drawn in zip((A, B), partitions, strict=True):
        # Log timestamps run against the event times: only the extracted ones may order records.
        rig.add(tp, *(plain(o, json.dumps({"n": n, "t": t}).encode(), timestamp=10_000 - o)
                      for o, (n, t) in enumerate(drawn)))
    total = sum(len(p) for p in partitions)
    async with rig.running():
        # Dropped records count as positions moved past, not as processed: wait on the positions.
        await eventually_async(lambda: rig.task.buffered() == 0, timeout=5, what=f"{total} records taken")
    return seen.seen, rig.task.stream_time


@settings(max_examples=60)
@given(records())
def test_processing_order_and_stream_time_match_kafka_streams_partition_group(partitions: Drawn) -> None:
    assert asyncio.run(run(partitions)) == model(partitions)


# -- timestamped stores -------------------------------------------------------------------------
Op = tuple[str, str | None, int] | None  # (key, value or None to delete, timestamp); None: a rebalance


def latest_model(ops: list[Op]) -> dict[str, tuple[str, int]]:
    """Each key's value with the largest timestamp (a later one wins a tie); a None deletes."""
    held: dict[str, tuple[str, int]] = {}
    for op in ops:
        if op is None:
            continue
        key, value, t = op
        if value is None:
            held.pop(key, None)
        elif key not in held or t >= held[key][1]:
            held[key] = (value, t)
    return held


@settings(max_examples=40)
@given(st.lists(st.one_of(st.none(), st.tuples(st.sampled_from("abc"), st.one_of(st.none(), st.sampled_from("xyz")),
                                                 st.integers(0, 50))), max_size=25))
def test_a_timestamped_store_keeps_what_the_model_keeps_across_rebalances(ops: list[Op]) -> None:
    """The out-of-order guard of ``Latest`` over a timestamped store (in memory: a rebalance restores
    it from its changelog alone) keeps each key's newest value with its timestamp."""
    str_ = StringSerde()
    with TopologyTestDriver(latest_topology()) as driver:
        source = driver.create_input_topic("in", str_, str_)
        driver.create_output_topic("out", str_, str_)
        for op in ops:
            if op is None:
                if driver.task_ids:
                    driver.rebalance(driver.task_ids[0])
            else:
                source.pipe_input(op[0], op[1], timestamp=op[2])
        stored = dict(driver.get_key_value_store("latest").all())
    assert stored == {k: ValueAndTimestamp(v, t) for k, (v, t) in latest_model(ops).items()}


# -- versioned stores ---------------------------------------------------------------------------
VOp = tuple[str, str | None, int] | None  # (key, value or None: a delete, timestamp); None: reopen


class VersionedModel:
    """KIP-889 as a dict of every version ever put: what a read may see is decided at read time."""

    def __init__(self, retention: int) -> None:
        self.retention = retention
        self.versions: dict[str, dict[int, str | None]] = {}
        self.observed = -1

    def put(self, key: str, value: str | None, t: int) -> int:
        if t < self.observed - self.retention:
            return PUT_RETURN_CODE_NOT_PUT
        self.versions.setdefault(key, {})[t] = value
        self.observed = max(self.observed, t)
        newer = [u for u in self.versions[key] if u > t]
        return min(newer) if newer else PUT_RETURN_CODE_VALID_TO_UNDEFINED

    def get(self, key: str, as_of: int | None) -> VersionedRecord | None:
        if as_of is not None and as_of < self.observed - self.retention:
            return None
        times = sorted(self.versions.get(key, {}))
        older = [t for t in times if as_of is None or t <= as_of]
        if not older or self.versions[key][older[-1]] is None:
            return None
        newer = [t for t in times if t > older[-1]]
        return VersionedRecord(self.versions[key][older[-1]], older[-1], newer[0] if newer else None)


@settings(max_examples=150)
@given(st.integers(0, 20), st.lists(st.one_of(
    st.none(), st.tuples(st.sampled_from("ab"), st.one_of(st.none(), st.sampled_from("xyz")), st.integers(0, 60))),
    max_size=30))
def test_a_versioned_store_answers_as_a_model_of_every_version_would(retention: int, ops: list[VOp]) -> None:
    """``RocksDBVersionedStoreTest``'s rules for drawn out-of-order puts and deletes: the put's
    return code, and reads at every time, equal the model's; reopening the store over its bytes
    (as after a restore) changes nothing, observed stream time included."""
    inner = InMemoryBytesStore("v")

    def open_store() -> VersionedKeyValueStore:
        return VersionedKeyValueStore("v", inner, StringSerde(), StringSerde(), None, None, "0_0/v", lambda: 0,
                                      lambda: None, history_retention_ms=retention)

    store, model = open_store(), VersionedModel(retention)
    for op in ops:
        if op is None:
            store = open_store()
            continue
        key, value, t = op
        assert store.put(key, value, t) == model.put(key, value, t), op
    for key in "ab":
        for as_of in (None, *range(0, 62, 3)):
            assert store.get(key, as_of) == model.get(key, as_of), (key, as_of)
