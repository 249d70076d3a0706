"""The executors' side of ``read="executors"`` (``streamloop.spark.kafka_source``): a PySpark Python
data source whose reader fetches one offset range per Spark partition
(``streamloop.transport.kafka.range_fetch``).

This module runs inside Spark's Python workers (it is imported there by the data source's class
path), so it imports pyspark at the top and keeps to what an executor has: aiokafka, the
stage's serdes (shipped pickled in the ``spec`` option) and ``streamloop.spark.schema.align``.
Its rows go to Spark as Arrow batches built by columns (``arrow_rows``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from streamloop.transport.kafka.range_fetch import fetch_range

from . import arrow_rows
from .frames import VALUE_COLUMN
from .kafka_source import (
    CARRIER,
    KEY_FAILED,
    KIND,
    MISFIT,
    OFFSET,
    PART,
    RAW,
    SIDE_COLUMNS,
    SOURCE_NAME,
    VALUE_FAILED,
    KafkaRange,
    RangeOutcome,
    ReadSpec,
    full_schema,
    pack_error,
    register_source,
)
from .schema import SchemaMismatch, aligner


def register(session: Any) -> None:
    """Register the data source with ``session`` (once per session; safe from any thread)."""
    register_source(session, KafkaRangeSource)


class RangePartition(InputPartition):
    def __init__(self, index: int, kafka_range: KafkaRange) -> None:
        super().__init__(index)
        self.range = kafka_range


class KafkaRangeSource(DataSource):
    """``spark.read.format("streamloop_kafka_range").option("spec", ReadSpec.encode()).load()``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def _spec(self) -> ReadSpec:
        return ReadSpec.decode(self.options["spec"])

    def schema(self) -> StructType:
        return full_schema(self._spec().schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaRangeReader(self.options["spec"])


class KafkaRangeReader(DataSourceReader):
    def __init__(self, spec: str) -> None:
        # Kept encoded: Spark pickles the reader with its own pickler, which does not know how
        # the spec's serdes travel (``ReadSpec.encode``).
        self.spec = spec

    def partitions(self) -> Sequence[InputPartition]:
        # One Spark partition per range: one reader reads a range in offset order, which keeps
        # the frame's rows in offset order (as the driver path's frame is).
        return [RangePartition(index, r) for index, r in enumerate(ReadSpec.decode(self.spec).ranges)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        spec = ReadSpec.decode(self.spec)
        fields = len(spec.schema.fields)
        assert isinstance(partition, RangePartition)
        kafka_range = partition.range
        records = fetch_range(spec.kafka, kafka_range.topic, kafka_range.partition, kafka_range.start,
                              kafka_range.end, spec.stall_ms)
        index = partition.value
        if spec.mode == RAW:
            empty = (None,) * fields
            rows: Iterator[tuple[Any, ...]] = (
                (*empty, RAW, raw.offset, raw.timestamp, raw.key, raw.value, _headers(raw.headers), None, None, None,
                 index) for raw in records)
        else:
            rows = ((*row, index) for row in decode_range(records, spec, fields))
        if arrow_rows.available():
            yield from arrow_rows.batches(rows, full_schema(spec.schema))
        else:
            yield from rows


def decode_range(records: Iterator[Any], spec: ReadSpec, fields: int) -> Iterator[tuple[Any, ...]]:
    """The rows of a range: each record decoded with the stage's serdes and aligned to its schema,
    as ``frames.decode`` and ``frames.to_frame`` do on the driver; a record that does not decode
    or fit is a side row, and the range's summary comes last."""
    key_serde, value_serde, key_column = spec.key_serde, spec.value_serde, spec.key_column
    fit = aligner(spec.schema)
    empty = (None,) * fields
    nothing = (None,) * 9
    count, max_timestamp = 0, -1
    last_good: Any = None
    carrier: Any = None  # the last good record before the first failed one (``stage.carrier_of``)
    failed = False
    for raw in records:
        count += 1
        if raw.timestamp > max_timestamp:
            max_timestamp = raw.timestamp
        what = KEY_FAILED
        try:
            key = key_serde.deserialize(raw.key)
            what = VALUE_FAILED
            value = value_serde.deserialize(raw.value)
            what = MISFIT
            row = dict(value) if isinstance(value, Mapping) else {VALUE_COLUMN: value}
            row[key_column] = key
            aligned = fit(row)
        except SchemaMismatch as mismatch:
            if not failed:
                failed, carrier = True, last_good
            yield (*empty, MISFIT, raw.offset, raw.timestamp, raw.key, raw.value, _headers(raw.headers),
                   pack_error(_Misfit(mismatch.field, mismatch.expected, mismatch.found)), None, None)
            continue
        except Exception as exc:
            if what == MISFIT:
                raise  # not a misfit: align itself failed, the job's error
            if not failed:
                failed, carrier = True, last_good
            yield (*empty, what, raw.offset, raw.timestamp, raw.key, raw.value, _headers(raw.headers),
                   pack_error(exc), None, None)
            continue
        last_good = raw
        yield (*aligned.values(), *nothing)
    if not failed or carrier is None:
        carrier = last_good
    yield (*empty, CARRIER, -1 if carrier is None else carrier.offset, -1 if carrier is None else carrier.timestamp,
           None, None, None, None, count, max_timestamp)


class _Misfit(Exception):
    """A ``SchemaMismatch`` as it travels back (its ``__init__`` takes three arguments, which a
    plain pickle of the exception would not give back)."""

    def __init__(self, field: str, expected: str, found: str) -> None:
        super().__init__(field, expected, found)

    def mismatch(self) -> SchemaMismatch:
        return SchemaMismatch(*self.args)


def _headers(headers: Any) -> list[tuple[str, bytes | None]] | None:
    return [(k, bytes(v) if v is not None else None) for k, v in headers] if headers else None


# -- the driver's side: the jobs over a range (worker threads of the engine) -------------------------
def source_frame(session: Any, spec: ReadSpec) -> Any:
    """The ranges of ``spec`` as a DataFrame: the schema's columns, then the side columns."""
    register(session)
    return session.read.format(SOURCE_NAME).option("spec", spec.encode()).load()


def run_range_job(session: Any, job: Any, spec: ReadSpec, stage: str) -> RangeOutcome:
    """One Spark job over ``spec``'s ranges (call on a worker thread): ``job`` (the stage's
    ``TransformJob`` or write) over the records that decoded and fit, and the side rows back.

    The source is persisted for the two actions (the function's and the side rows' collect), so
    the executors read each range from Kafka once; a lost executor's blocks are read again from
    the same fixed offsets, which give the same records."""
    from pyspark import StorageLevel

    frame = source_frame(session, spec).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        rows = job(good_rows(frame, spec))
        side = side_rows(frame)
    finally:
        frame.unpersist()
    return RangeOutcome(rows, side)


def good_rows(frame: Any, spec: ReadSpec) -> Any:
    """The records of a range's frame that decoded and fit: the stage function's input."""
    from pyspark.sql import functions as F

    return frame.where(F.col(KIND).isNull()).select(*[F.col(f"`{name}`") for name in spec.schema.fieldNames()])


def side_rows(frame: Any) -> list[dict[str, Any]]:
    from pyspark.sql import functions as F

    return [row.asDict(recursive=True) for row in frame.where(F.col(KIND).isNotNull()).select(*SIDE_COLUMNS).collect()]


def read_ranges(session: Any, spec: ReadSpec) -> tuple[Any, list[RangeOutcome]]:
    """The first of a direct write's two jobs (call on a worker thread): the ranges read into a
    persisted frame, and each range's side rows back (in the order of ``spec.ranges``), so that
    the handlers are asked about the failed records before anything is written (as the driver path
    asks before it forwards). One Spark partition per range; each row carries its range's index
    (``PART``), so a job may read the ranges of several tasks (``streamloop.tasks.range_jobs``).
    The caller writes with ``write_ranges`` and unpersists the frame."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    frame = source_frame(session, spec).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        outcomes = [RangeOutcome(None, []) for _range in spec.ranges]
        for row in frame.where(F.col(KIND).isNotNull()).select(*SIDE_COLUMNS, PART).collect():
            side = row.asDict(recursive=True)
            outcomes[side.pop(PART)].side.append(side)
        return frame, outcomes
    except BaseException:
        frame.unpersist()
        raise


def write_ranges(session: Any, frame: Any, fn: Any, spec: ReadSpec, write: Any, ranges: Sequence[int]) -> str | None:
    """The second job (call on a worker thread): the stage's function ``fn`` over the records of
    the ranges at ``ranges`` of a frame ``read_ranges`` made (indexes into ``spec.ranges``: those
    whose output may leave), written to the sink topic by the executors (``kafka_writer``). With
    ``write.timestamps`` (a job shared by the ranges, ``fn`` row-wise: ``streamloop.spark.row_wise``)
    each output row is written with the timestamp of its own range, by the Spark partition it
    leaves from; then the result is why the plan is not row-wise (nothing written: the caller
    writes each range on its own), else None.
    Returns once every record is acknowledged."""
    from pyspark.sql import functions as F

    from .kafka_writer import write_frame
    from .parts import not_row_wise

    if len(ranges) < len(spec.ranges):
        frame = frame.where(F.col(PART).isin(list(ranges)))
    out = fn(good_rows(frame, spec))
    if write.timestamps:
        out = out.withColumn(PART, F.spark_partition_id())
        problem = not_row_wise(out, scan="InMemoryTableScan")
        if problem is not None:
            return problem
    write_frame(session, out, write)
    return None


def run_raw_job(session: Any, spec: ReadSpec) -> RangeOutcome:
    """Every record of ``spec``'s ranges as fetched (call on a worker thread): after a job that
    raised, each record goes to the processing handler, as on the driver path."""
    from pyspark.sql import functions as F

    raw = ReadSpec(spec.kafka, spec.ranges, spec.key_serde, spec.value_serde, spec.key_column, spec.schema,
                   mode=RAW, stall_ms=spec.stall_ms)
    frame = source_frame(session, raw)
    side = [row.asDict(recursive=True) for row in frame.where(F.col(KIND) == RAW).select(*SIDE_COLUMNS).collect()]
    return RangeOutcome(None, sorted(side, key=lambda row: row[OFFSET]))
