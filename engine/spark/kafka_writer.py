"""The executors write a stage's output to its sink topic themselves (``read="executors"`` with a
direct sink): a PySpark Python data source whose writer, on each executor, turns the rows of its
Spark partition into records exactly as the driver path does (``frames.to_records``: the key
column as key, the value columns as a dict, the range's carrier timestamp), serializes them with
the sink's serdes, picks each one's partition by Kafka's default rule (``key_hash`` of the key
bytes, as the record collector does; records without key round-robin) and produces them with
``acks=all`` (``streamloop.transport.kafka.range_write``).

Spark's ``save()`` returns only after every writer returned, and a writer returns only after the
broker acknowledged each of its records: when the driver's job returns, the range's output is
safe and its offsets may be committed. A writer that fails is run again by Spark (its records
may then be written twice: at-least-once, which is all the executors' path promises).

Runs inside Spark's Python workers (imported there by the data source's class path), so it
imports pyspark at the top, as ``kafka_reader`` does.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from streamloop.serdes import Serde
from streamloop.transport.kafka.range_write import write_records
from streamloop.transport.partitioner import key_hash

from . import arrow_rows
from .frames import to_records
from .kafka_source import PART, decode_option, encode_option, register_source

WRITE_SOURCE_NAME = "streamloop_kafka_write"


@dataclass(frozen=True)
class WriteSpec:
    """What the executors need to write a range's output (picklable, shipped as an option).
    ``kafka``: aiokafka client keyword arguments; ``partitions``: the sink topic's partition count."""

    kafka: Mapping[str, Any]
    topic: str
    partitions: int
    key_column: str
    value_columns: Sequence[str] | None
    key_serde: Serde
    value_serde: Serde
    timestamp: int
    # A write of several ranges (``kafka_reader.write_ranges``): each row's range index is in its
    # ``PART`` column, and its records take that range's timestamp from here.
    timestamps: tuple[int, ...] = ()

    def encode(self) -> str:
        return encode_option(self)

    @staticmethod
    def decode(text: str) -> WriteSpec:
        spec = decode_option(text)
        assert isinstance(spec, WriteSpec)
        return spec


@dataclass
class Written(WriterCommitMessage):
    records: int


def register(session: Any) -> None:
    """Register the data source with ``session`` (once per session; safe from any thread)."""
    register_source(session, KafkaTopicSink)


class KafkaTopicSink(DataSource):
    """``frame.write.format("streamloop_kafka_write").option("spec", WriteSpec.encode()).mode("append").save()``."""

    @classmethod
    def name(cls) -> str:
        return WRITE_SOURCE_NAME

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if arrow_rows.available():
            return KafkaTopicArrowWriter(self.options["spec"], schema)
        return KafkaTopicWriter(self.options["spec"])


class _Acknowledged:
    """What both writers do at a job's end: nothing. Each writer returns only after the broker
    acknowledged its records, and a failed job leaves its range uncommitted, to be read (and
    written) again."""

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass


class KafkaTopicWriter(_Acknowledged, DataSourceWriter):
    """Takes Spark's rows (a pyspark without the converters ``arrow_rows`` uses)."""

    def __init__(self, spec: str) -> None:
        self.spec = spec  # kept encoded: Spark pickles the writer with its own pickler

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        spec = WriteSpec.decode(self.spec)
        rows = [row.asDict(recursive=True) for row in iterator]
        return Written(write_records(spec.kafka, spec.topic, keyed(spec, rows)))


class KafkaTopicArrowWriter(_Acknowledged, DataSourceArrowWriter):
    """Takes Spark's Arrow batches and makes their rows' dicts by columns (``arrow_rows.dicts``)."""

    def __init__(self, spec: str, schema: StructType) -> None:
        self.spec = spec
        self.schema = schema

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        spec = WriteSpec.decode(self.spec)
        rows = [row for batch in iterator for row in arrow_rows.dicts(batch, self.schema)]
        return Written(write_records(spec.kafka, spec.topic, keyed(spec, rows)))


def keyed(spec: WriteSpec, dicts: list[dict[str, Any]]) -> Iterator[tuple[int, bytes | None, bytes | None, int]]:
    """``(partition, key bytes, value bytes, timestamp)`` of each row (as ``Row.asDict(recursive=True)``
    gives it), as the driver path's collector would send the row's record."""
    key_serde, value_serde, count = spec.key_serde, spec.value_serde, spec.partitions
    round_robin = itertools.count()
    if spec.timestamps:
        runs: Iterable[tuple[int, list[dict[str, Any]]]] = (
            (spec.timestamps[part], list(run)) for part, run in itertools.groupby(dicts, key=_pop_part))
    else:
        runs = ((spec.timestamp, dicts),)
    # murmur2 in pure Python costs microseconds and keys repeat, as in the record collector.
    partitions: dict[bytes, int] = {}
    for timestamp, run in runs:
        for record in to_records(run, spec.key_column, spec.value_columns, timestamp):
            key = key_serde.serialize(record.key)
            if key is None:
                partition = next(round_robin) % count
            else:
                partition = partitions.get(key, -1)
                if partition < 0:
                    partition = partitions[key] = key_hash(key) % count
            yield partition, key, value_serde.serialize(record.value), record.timestamp


def _pop_part(row: dict[str, Any]) -> int:
    part: int = row.pop(PART)
    return part


def write_frame(session: Any, frame: Any, spec: WriteSpec) -> None:
    """Write ``frame`` (a stage's output) to ``spec.topic`` on the executors; returns once every
    record is acknowledged (call on a worker thread)."""
    register(session)
    frame.write.format(WRITE_SOURCE_NAME).option("spec", spec.encode()).mode("append").save()
