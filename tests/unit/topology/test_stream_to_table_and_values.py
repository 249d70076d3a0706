"""``KStream.to_table``, ``KStream.process_values`` and ``KStream.print``, checked against Kafka
Streams' KStreamImplTest and KStreamPrintTest for the same inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamloop import FixedKeyRecord, ForwardingError, Printed
from streamloop.errors import TopologyError
from streamloop.records import Record
from streamloop.serdes import IntegerSerde, StringSerde
from streamloop.state import Materialized, Stores
from streamloop.testing import TopologyTestDriver
from streamloop.topology.builder import StreamsBuilder

STR, INT = StringSerde(), IntegerSerde()
CONFIG = {"cache.max.bytes.buffering": 0, "default.key.serde": STR, "default.value.serde": STR}


def pipe(builder: StreamsBuilder, inputs: list[tuple[str, Any, int]], topic: str = "input",
         output: str | None = "output", key_serde: Any = STR, value_serde: Any = STR) -> list[Any]:
    with TopologyTestDriver(builder.build(), CONFIG) as driver:
        source = driver.create_input_topic(topic, STR, STR)
        for key, value, timestamp in inputs:
            source.pipe_input(key, value, timestamp)
        if output is None:
            return []
        return [(r.key, r.value, r.timestamp)
                for r in driver.create_output_topic(output, key_serde, value_serde).read_records()]


# -- to_table ---------------------------------------------------------------------------

def test_to_table_materializes_the_stream() -> None:
    """Matches KStreamImplTest.shouldMaterializeKTableFromKStream: its description, and the store
    holds each key's latest value."""
    builder = StreamsBuilder()
    builder.stream("input", key_serde=STR, value_serde=STR).to_table(materialized="store")
    topology = builder.build()
    assert topology.describe() == (
        "Topologies:\n"
        "   Sub-topology: 0\n"
        "    Source: KSTREAM-SOURCE-0000000000 (topics: [input])\n"
        "      --> KSTREAM-TOTABLE-0000000001\n"
        "    Processor: KSTREAM-TOTABLE-0000000001 (stores: [store])\n"
        "      --> none\n"
        "      <-- KSTREAM-SOURCE-0000000000\n\n")
    with TopologyTestDriver(topology, CONFIG) as driver:
        source = driver.create_input_topic("input", STR, STR)
        for key, value in [("A", "01"), ("B", "02"), ("A", "03")]:
            source.pipe_input(key, value)
        assert sorted(driver.get_key_value_store("store").all()) == [("A", "03"), ("B", "02")]


def test_to_table_after_a_key_change_repartitions() -> None:
    """Matches KStreamImplTest.shouldSupportKeyChangeKTableFromKStream: the records go through a
    repartition topic into the table's sub-topology, keyed by the new key (an int)."""
    builder = StreamsBuilder()
    builder.stream("input", key_serde=STR, value_serde=STR) \
        .map(lambda k, v: (ord(k[0]) - ord("A"), v)) \
        .to_table(materialized=Materialized(key_serde=INT)) \
        .to_stream().to("output", key_serde=INT)
    topology = builder.build()
    subs = topology.subtopologies
    assert len(subs) == 2 and any("KSTREAM-TOTABLE-0000000005" in s.node_names for s in subs[1:])
    out = pipe(builder, [("A", "01", 5), ("B", "02", 100), ("C", "03", 0), ("D", "04", 0), ("A", "05", 10),
                         ("A", "06", 8)], key_serde=INT)
    assert out == [(0, "01", 5), (1, "02", 100), (2, "03", 0), (3, "04", 0), (0, "05", 10), (0, "06", 8)]


def test_to_table_tables_join() -> None:
    """Matches KStreamImplTest.shouldSupportTableTableJoinWithKStreamToKTable (names of its stores
    and the joined values)."""
    builder = StreamsBuilder()
    left = builder.stream("left", key_serde=STR, value_serde=STR).to_table()
    right = builder.stream("right", key_serde=STR, value_serde=STR).to_table()
    left.join(right, lambda a, b: f"{a}+{b}").to_stream().to("output")
    text = builder.build().describe()
    assert "Processor: KSTREAM-TOTABLE-0000000001 (stores: [KSTREAM-TOTABLE-STATE-STORE-0000000002])" in text
    assert "Processor: KSTREAM-TOTABLE-0000000004 (stores: [KSTREAM-TOTABLE-STATE-STORE-0000000005])" in text
    with TopologyTestDriver(builder.build(), CONFIG) as driver:
        driver.create_input_topic("left", STR, STR).pipe_input("k", "l", 0)
        driver.create_input_topic("right", STR, STR).pipe_input("k", "r", 1)
        driver.create_input_topic("left", STR, STR).pipe_input("k", None, 2)
        assert driver.create_output_topic("output", STR, STR).read_key_values() == [("k", "l+r"), ("k", None)]


def test_to_table_drops_records_without_a_key_and_deletes_on_none() -> None:
    """KTableSourceTest.kTableShouldLogAndMeterOnSkippedRecords: a record without a key is dropped;
    a None value deletes the key (a tombstone downstream)."""
    builder = StreamsBuilder()
    builder.stream("input", key_serde=STR, value_serde=STR).to_table(materialized="t").to_stream().to("output")
    out = pipe(builder, [(None, "x", 0), ("A", "1", 1), ("A", None, 2)])
    assert out == [("A", "1", 1), ("A", None, 2)]


# -- process_values ---------------------------------------------------------------------

class Upper:
    def init(self, context: Any) -> None:
        self.context = context
        self.store = context.get_state_store("seen") if "seen" in getattr(self, "stores", ()) else None

    def process(self, record: FixedKeyRecord) -> None:
        self.context.forward(record.with_value(record.value.upper()).with_timestamp(record.timestamp + 1))

    def close(self) -> None:
        pass


class Counting(Upper):
    stores = ("seen",)

    def process(self, record: FixedKeyRecord) -> None:
        assert self.store is not None
        count = (self.store.get(record.key) or 0) + 1
        self.store.put(record.key, count)
        self.context.forward(record.with_value(f"{record.value}#{count}"))


def test_process_values_keeps_keys_and_needs_no_repartition() -> None:
    """The stream after process_values is still partitioned by its key: a grouping after it reads
    in the same sub-topology (no repartition topic); one whose key changed before it still is
    repartitioned (process_values does not undo a select_key)."""
    builder = StreamsBuilder()
    stream = builder.stream("input", key_serde=STR, value_serde=STR)
    stream.process_values(Upper).group_by_key().count(materialized="counts")
    stream.select_key(lambda k, _v: k).process_values(Upper).group_by_key().count(materialized="other")
    topology = builder.build()
    assert len(topology.repartition_topics()) == 1  # only the one after select_key
    assert "Processor: KSTREAM-PROCESSVALUES-0000000001 (stores: [])" in topology.describe()


def test_process_values_forwards_new_values_with_the_same_key() -> None:
    builder = StreamsBuilder()
    builder.stream("input", key_serde=STR, value_serde=STR).process_values(Upper).to("output")
    assert pipe(builder, [("a", "x", 1), ("b", "y", 2)]) == [("a", "X", 2), ("b", "Y", 3)]


def test_process_values_uses_its_stores() -> None:
    builder = StreamsBuilder()
    builder.add_state_store(Stores.key_value_store_builder(Stores.in_memory_key_value_store("seen"), STR, INT))
    builder.stream("input", key_serde=STR, value_serde=STR).process_values(Counting, stores=["seen"]).to("output")
    assert pipe(builder, [("a", "x", 1), ("a", "y", 2), ("b", "z", 3)]) == [
        ("a", "x#1", 1), ("a", "y#2", 2), ("b", "z#1", 3)]


def test_process_values_refuses_a_plain_record() -> None:
    """A FixedKeyProcessor cannot forward a record with another key: forwarding a plain Record
    fails the task (ForwardingError) instead of silently breaking its partitioning."""

    class Rekeying(Upper):
        def process(self, record: FixedKeyRecord) -> None:
            self.context.forward(Record("other", record.value, record.timestamp))

    builder = StreamsBuilder()
    builder.stream("input", key_serde=STR, value_serde=STR).process_values(Rekeying).to("output")
    with pytest.raises(ForwardingError, match="forwards FixedKeyRecords"):
        pipe(builder, [("a", "x", 1)])
    assert not hasattr(FixedKeyRecord(Record("k", "v", 0)), "with_key")


def test_process_values_checks_its_supplier() -> None:
    """Matches KStreamImplTest.shouldNotAllowBadProcessSupplierOnProcessValues (and the stores check)."""
    stream = StreamsBuilder().stream("input")
    processor = Upper()
    with pytest.raises(TopologyError, match="must return a new object each time"):
        stream.process_values(lambda: processor)
    with pytest.raises(TypeError, match=r"process_values\(\) needs a supplier"):
        stream.process_values(Upper())  # type: ignore[arg-type]
    with pytest.raises(TopologyError, match="state store 'missing', which is not added"):
        stream.process_values(Upper, stores=["missing"])


def test_an_async_process_values_processor_is_awaited() -> None:
    class Later(Upper):
        async def process(self, record: FixedKeyRecord) -> None:  # type: ignore[override]
            self.context.forward(record.with_value(f"late {record.value}"))

    builder = StreamsBuilder()
    builder.stream("input", key_serde=STR, value_serde=STR).process_values(Later).to("output")
    assert pipe(builder, [("a", "x", 1)]) == [("a", "late x", 1)]


# -- print ------------------------------------------------------------------------------

def test_print_with_a_key_value_mapper_and_label(tmp_path: Path) -> None:
    """Matches KStreamPrintTest.testPrintStreamWithProvidedKeyValueMapper: ``[test-stream]: 0, zero``…"""
    path = tmp_path / "out.txt"
    builder = StreamsBuilder()
    builder.stream("input", key_serde=STR, value_serde=STR).print(
        Printed.to_file(path).with_label("test-stream").with_key_value_mapper(lambda k, v: f"{int(k)}, {v}"))
    pipe(builder, [("0", "zero", 0), ("1", "one", 0), ("2", "two", 0), ("3", "three", 0)], output=None)
    assert path.read_text(encoding="utf-8").splitlines() == [
        "[test-stream]: 0, zero", "[test-stream]: 1, one", "[test-stream]: 2, two", "[test-stream]: 3, three"]


def test_print_to_sys_out_labels_with_the_node_name(capsys: pytest.CaptureFixture[str]) -> None:
    """Matches PrintedTest.shouldCreateProcessorThatPrintsToStdOut: ``[<processor name>]: key, value``."""
    builder = StreamsBuilder()
    builder.stream("input", key_serde=STR, value_serde=STR).print(Printed.to_sys_out())
    pipe(builder, [("hi", "1", 0), ("no", None, 1)], output=None)
    assert capsys.readouterr().out.splitlines() == ["[KSTREAM-PRINTER-0000000001]: hi, 1",
                                                    "[KSTREAM-PRINTER-0000000001]: no, None"]


def test_print_names_and_describes_its_node(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    builder.stream("input").print(Printed.to_file(tmp_path / "p.txt").with_name("printer"))
    assert "Processor: printer (stores: [])\n      --> none\n" in builder.build().describe()


def test_print_refuses_bad_printeds(tmp_path: Path) -> None:
    """Matches PrintedTest.shouldThrowTopologyExceptionIfFilePathIsEmpty and
    shouldThrowTopologyExceptionIfFilePathDoesntExist."""
    with pytest.raises(TopologyError, match="needs a file path"):
        Printed.to_file("")
    stream = StreamsBuilder().stream("input")
    with pytest.raises(TopologyError, match="Unable to write stream to file"):
        stream.print(Printed.to_file(tmp_path / "missing" / "out.txt"))
    with pytest.raises(TopologyError, match="needs a Printed"):
        stream.print("stdout")  # type: ignore[arg-type]
    with pytest.raises(TopologyError, match="needs a callable"):
        Printed.to_sys_out().with_key_value_mapper("k=v")  # type: ignore[arg-type]


def test_tasks_of_one_print_share_its_file(tmp_path: Path) -> None:
    """Two partitions, two tasks: both write to the one file, which stays open until the last closes."""
    path = tmp_path / "shared.txt"
    builder = StreamsBuilder()
    builder.stream("input", key_serde=STR, value_serde=STR).print(Printed.to_file(path).with_label("p"))
    with TopologyTestDriver(builder.build(), CONFIG, partitions={"input": 2}) as driver:
        source = driver.create_input_topic("input", STR, STR)
        for i in range(6):
            source.pipe_input(f"k{i}", str(i), i)
    assert sorted(path.read_text(encoding="utf-8").splitlines()) == [f"[p]: k{i}, {i}" for i in range(6)]
