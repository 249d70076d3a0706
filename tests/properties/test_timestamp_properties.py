"""For drawn records over two partitions with out-of-order event times (some invalid), the order a
task processes them in and its stream time equal a small model of Kafka Streams' ``PartitionGroup``:

- the next record comes from the partition whose head has the lowest extracted timestamp;
- a record whose extracted timestamp is negative is dropped (``RecordQueue``) and moves no time;
- stream time is the largest timestamp of the records taken so far (never goes back).

Event times of valid records are distinct, so that the partition to take from is never a tie
(Kafka Streams leaves ties to its priority queue).

And a timestamped store used as an out-of-order guard keeps what a dict model keeps, across
rebalances that restore it from its changelog.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.processors.api import BaseProcessor
from engine.records import Record
from engine.serdes import JsonSerde, StringSerde
from engine.state.timestamped import ValueAndTimestamp
from engine.testing import TopologyTestDriver, eventually_async
from engine.timestamps import ConsumedRecord
from engine.topology.builder import StreamsBuilder
from tests.unit.state.test_timestamped_store import latest_topology
from tests.unit.tasks.test_task import A, B, TaskRig, plain

Drawn = list[list[tuple[str, int]]]  # per partition: (name, event time) in offset order


class SkipNegative:
    """The value's ``t``; negative ones drop the record (as ``LogAndSkipOnInvalidTimestamp``)."""

    def extract(self, record: ConsumedRecord, partition_time: int) -> int:
        return int(record.value["t"])


class Seen(BaseProcessor):
    def __init__(self, rig: list[TaskRig]) -> None:
        self.rig = rig
        self.seen: list[tuple[str, int, int]] = []

    def process(self, record: Record) -> None:
        self.seen.append((record.value["n"], record.timestamp, self.rig[0].task.stream_time))


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
