"""A measured prototype of issue 31's lead: a cycle of ``read="executors"`` through Spark's own
Kafka connector (``spark-sql-kafka-0-10``) instead of our two Python data sources.

The engine's executors' path (``streamloop.spark.kafka_reader``/``kafka_writer``) plans two Python
data sources per cycle and reads and writes with a Python Kafka client in Spark's Python workers.
This cycle keeps what the engine promises of those jobs and changes who touches Kafka:

- **read job**: Spark's Kafka batch source over the same ranges (``assign``, ``startingOffsets`` and
  ``endingOffsets`` per partition), so the JVM fetches; the records are decoded with *our* serdes
  and aligned to the stage's schema in ``mapInArrow`` (Arrow batches, not rows), a record that
  does not decode or fit becomes a side row as in ``kafka_reader.decode_range``; persisted, and the
  side rows collected (the handlers are asked before anything is written);
- **write job**: the stage's function over the good rows, each output row serialized with the
  sink's serdes in ``mapInArrow`` (key, value, partition by ``key_hash`` as the record collector
  picks it) and produced by Spark's Kafka sink, whose ``save()`` returns after the producer flushed
  and every send was acknowledged.

``read_ranges_jvm``/``write_ranges_jvm`` are the same two jobs with the JSON decode and encode in
the JVM (``from_json``/``to_json`` with the stage's schema), so the stage runs Structured
Streaming's own plan and no record reaches a Python worker. What that gives up of our serdes'
semantics (measured here, not an engine path): a value that is not JSON or does not fit the schema
is caught by Spark's PERMISSIVE parse into a corrupt-record column and becomes a side row as above,
but Spark's conversions are not ``schema.align``'s (an int where a string is declared is taken, a
float where a long is declared is not); ``to_json`` leaves null fields out and writes floats as
Java does; the partition is the Kafka producer's (murmur2 of the key, as ``key_hash``).

Used by ``benchmarks/spark_exec_cost.py --client connector`` beside the engine's cycle, in one run;
it needs pyspark and the connector of the same version (``spark_bulk.sss_environment``). Not an
engine path: what it measured, and why it is not one yet, is in docs/spark.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from streamloop.serdes import Serde
from streamloop.spark.schema import SchemaMismatch, align
from streamloop.transport.partitioner import key_hash

# Side columns of the decoded frame (a prefix no schema field may have, as in ``kafka_source``).
KIND, OFFSET, ERROR = "__sl_kind", "__sl_offset", "__sl_error"


def read_ranges(session: Any, bootstrap: str, ranges: Sequence[Any], key_serde: Serde, value_serde: Serde,
                key_column: str, schema: Any, ask_first: bool = True) -> tuple[Any, list[dict[str, Any]]]:
    """The read job: ``ranges`` (``KafkaRange``s of one topic) fetched by Spark's Kafka source,
    decoded with the serdes; returns the persisted frame and the side rows (failed records).
    ``ask_first=False`` measures one job a cycle: no read job, the frame neither persisted nor
    its side rows collected, so the write job reads and decodes (no handler is asked first)."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    raw = _raw(session, bootstrap, ranges).select("key", "value", "offset")
    out = StructType([*schema.fields, StructField(KIND, StringType()), StructField(OFFSET, LongType()),
                      StructField(ERROR, StringType())])
    names = schema.fieldNames()

    def decode(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for batch in batches:
            columns: dict[str, list[Any]] = {name: [] for name in (*names, KIND, OFFSET, ERROR)}
            for key, value, offset in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(),
                                          batch.column(2).to_pylist(), strict=True):
                try:
                    decoded = value_serde.deserialize(value)
                    row = dict(decoded) if isinstance(decoded, Mapping) else {"value": decoded}
                    row[key_column] = key_serde.deserialize(key)
                    aligned = align(row, schema)
                    side: tuple[Any, Any, Any] = (None, None, None)
                except (SchemaMismatch, ValueError, TypeError) as exc:
                    aligned = dict.fromkeys(names)
                    side = ("failed", offset, f"{type(exc).__name__}: {exc}")
                for name in names:
                    columns[name].append(aligned[name])
                for name, item in zip((KIND, OFFSET, ERROR), side, strict=True):
                    columns[name].append(item)
            yield pa.RecordBatch.from_pydict(columns, schema=_arrow(out))

    frame = raw.mapInArrow(decode, out)
    return _asked(frame, ask_first)


def write_ranges(session: Any, bootstrap: str, frame: Any, fn: Any, schema: Any, sink: str, partitions: int,
                 key_column: str, value_columns: Sequence[str], key_serde: Serde, value_serde: Serde) -> None:
    """The write job: ``fn`` over the good rows, serialized with the serdes and produced by Spark's
    Kafka sink (returns once every record is acknowledged)."""
    from pyspark.sql.types import BinaryType, IntegerType, StructField, StructType

    out = fn(frame.where(frame[KIND].isNull()).select(*schema.fieldNames()))
    names = [key_column, *value_columns]
    records = StructType([StructField("key", BinaryType()), StructField("value", BinaryType()),
                          StructField("partition", IntegerType())])

    def encode(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for batch in batches:
            keys: list[bytes | None] = []
            values: list[bytes | None] = []
            parts: list[int] = []
            rows = batch.select(names).to_pylist()
            for row in rows:
                key = key_serde.serialize(row.pop(key_column))
                keys.append(key)
                values.append(value_serde.serialize(row))
                parts.append(0 if key is None else key_hash(key) % partitions)
            yield pa.RecordBatch.from_pydict({"key": keys, "value": values, "partition": parts},
                                             schema=_arrow(records))

    (out.select(*names).mapInArrow(encode, records).write.format("kafka")
     .option("kafka.bootstrap.servers", bootstrap).option("topic", sink).save())


def _asked(frame: Any, ask_first: bool) -> tuple[Any, list[dict[str, Any]]]:
    """The read job's end: the decoded frame persisted and its side rows collected (the handlers
    are asked before the write); with ``ask_first=False`` the frame as it is, for the write job."""
    from pyspark import StorageLevel

    if not ask_first:
        return frame, []
    frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        side = [row.asDict() for row in frame.where(frame[KIND].isNotNull()).select(KIND, OFFSET, ERROR).collect()]
    except BaseException:
        frame.unpersist()
        raise
    return frame, side


def _raw(session: Any, bootstrap: str, ranges: Sequence[Any]) -> Any:
    topic = ranges[0].topic
    starts = {topic: {str(r.partition): r.start for r in ranges}}
    ends = {topic: {str(r.partition): r.end for r in ranges}}
    return (session.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
            .option("assign", json.dumps({topic: sorted(r.partition for r in ranges)}))
            .option("startingOffsets", json.dumps(starts)).option("endingOffsets", json.dumps(ends))
            .load())


def read_ranges_jvm(session: Any, bootstrap: str, ranges: Sequence[Any], key_column: str, schema: Any,
                    ask_first: bool = True) -> tuple[Any, list[dict[str, Any]]]:
    """The read job with the decode in the JVM: the key as a UTF-8 string (``StringSerde``), the
    value by ``from_json`` against ``schema``'s value fields; a value Spark cannot parse or fit
    keeps its text in a corrupt-record column and is a side row (kind, offset, error)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    value_fields = [f for f in schema.fields if f.name != key_column]
    parsed = StructType([*value_fields, StructField(ERROR, StringType())])
    raw = _raw(session, bootstrap, ranges)
    decoded = raw.select(F.col("key").cast("string").alias(key_column), F.col("offset").alias(OFFSET),
                         F.from_json(F.col("value").cast("string"), parsed,
                                     {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": ERROR}).alias("v"))
    failed = F.col(f"v.{ERROR}").isNotNull() | F.col("v").isNull()
    frame = decoded.select(*(F.col(key_column) if f.name == key_column else F.col(f"v.{f.name}").alias(f.name)
                             for f in schema.fields),
                           F.when(failed, F.lit("failed")).alias(KIND), F.col(OFFSET),
                           F.when(failed, F.lit("not JSON of the schema")).alias(ERROR))
    return _asked(frame, ask_first)


def write_ranges_jvm(bootstrap: str, frame: Any, fn: Any, schema: Any, sink: str, key_column: str,
                     value_columns: Sequence[str]) -> None:
    """The write job with the encode in the JVM: ``to_json`` of the value columns; the Kafka sink's
    producer partitions by the key (murmur2, as the record collector)."""
    from pyspark.sql import functions as F

    out = fn(frame.where(frame[KIND].isNull()).select(*schema.fieldNames()))
    (out.select(F.col(key_column).cast("binary").alias("key"),
                F.to_json(F.struct(*value_columns)).cast("binary").alias("value"))
     .write.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("topic", sink).save())


def _arrow(schema: Any) -> Any:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema)
