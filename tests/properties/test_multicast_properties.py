"""For random records and random multicast answers (None: default partitioning, an empty set: drop,
several partitions: a copy to each), what each partition of the sink's topic holds is what a
pure-Python model of KIP-837's ``StreamPartitioner.partitions`` says, in input order."""

from __future__ import annotations

from collections.abc import Set
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from streamloop import Produced, StreamPartitioner, StreamsBuilder
from streamloop.serdes import JsonSerde, StringSerde
from streamloop.testing import TopologyTestDriver
from streamloop.transport.partitioner import key_hash

S, JSON = StringSerde(), JsonSerde()

answers = st.one_of(st.none(), st.lists(st.integers(0, 7), max_size=5))
records_strategy = st.lists(st.tuples(st.sampled_from("abcdef"), answers), max_size=40)


class ByValue(StreamPartitioner):
    """The partitions each value names (mod the count), or the default for a value naming none."""

    def partitions(self, topic: str, key: Any, value: Any, num_partitions: int) -> Set[int] | None:
        to = value["to"]
        return None if to is None else {p % num_partitions for p in to}


def model(records: list[tuple[str, list[int] | None]], partitions: int) -> dict[int, list[tuple[str, int]]]:
    """Each record, numbered in input order, on the partitions the model's rule gives it."""
    out: dict[int, list[tuple[str, int]]] = {p: [] for p in range(partitions)}
    for n, (key, to) in enumerate(records):
        chosen = [key_hash(key.encode()) % partitions] if to is None else sorted({p % partitions for p in to})
        for p in chosen:
            out[p].append((key, n))
    return out


def run(records: list[tuple[str, list[int] | None]], partitions: int) -> dict[int, list[tuple[str, int]]]:
    builder = StreamsBuilder()
    builder.stream("in", key_serde=S, value_serde=JSON).to("out", Produced.with_(S, JSON, ByValue()))
    out: dict[int, list[tuple[str, int]]] = {p: [] for p in range(partitions)}
    with TopologyTestDriver(builder.build(), partitions={"in": 3, "out": partitions}) as driver:
        inputs = driver.create_input_topic("in", S, JSON)
        for n, (key, to) in enumerate(records):
            # All input through one partition: the model's input order is the processing order.
            inputs.pipe_input(key, {"n": n, "to": to}, partition=0)
        for record in driver.create_output_topic("out", S, JSON).read_records():
            out[record.partition].append((record.key, record.value["n"]))
    return out


@settings(max_examples=60, deadline=None)
@given(records=records_strategy, partitions=st.integers(1, 5))
def test_each_partition_holds_the_models_records_in_input_order(
        records: list[tuple[str, list[int] | None]], partitions: int) -> None:
    assert run(records, partitions) == model(records, partitions)
