"""The executors' reader hands Spark Arrow batches built by columns (``streamloop.spark.arrow_rows``):
they must be the batches Spark's own worker makes of the same tuples, for every type a stage's
schema may declare and for the side columns."""

from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from streamloop.spark import arrow_rows
from streamloop.spark.kafka_source import full_schema

SCHEMA = StructType([
    StructField("key", StringType()), StructField("id", LongType(), nullable=False), StructField("n", IntegerType()),
    StructField("amount", DoubleType()), StructField("ok", BooleanType()), StructField("raw", BinaryType()),
    StructField("day", DateType()), StructField("at", TimestampType()), StructField("price", DecimalType(10, 2)),
    StructField("home", StructType([StructField("city", StringType())])),
    StructField("tags", ArrayType(StringType())), StructField("seen", MapType(StringType(), LongType())),
])


def row(i: int, nulls: bool = False) -> tuple[Any, ...]:
    stage: tuple[Any, ...]
    if nulls:
        stage = (None, i, *([None] * 10))
    else:
        stage = (f"c{i}", i, i % 7, i + 0.5, i % 2 == 0, bytes([i % 256]), datetime.date(2026, 1, 1 + i % 28),
                 datetime.datetime(2026, 1, 1, 12, 0, i % 60, 123_456), Decimal(f"{i}.25"), {"city": f"x{i}"},
                 [f"t{i}", None], {"a": i})
    side = (None,) * 9 if i % 3 else ("failed", i, i * 10, b"k", None, [("h", b"v"), ("n", None)], b"err", None, None)
    return (*stage, *side, i % 4)


def spark_batches(rows: list[tuple[Any, ...]], schema: StructType) -> list[Any]:
    worker = pytest.importorskip("pyspark.sql.worker.plan_data_source_read")

    class Source:
        def name(self) -> str:
            return "test"

    return list(worker.records_to_arrow_batches(iter(rows), arrow_rows.ROWS_PER_BATCH, schema, Source()))


def test_the_batches_are_those_spark_makes_of_the_same_tuples() -> None:
    assert arrow_rows.available()
    schema = full_schema(SCHEMA)
    rows = [row(i, nulls=i % 5 == 0) for i in range(arrow_rows.ROWS_PER_BATCH + 7)]
    ours = list(arrow_rows.batches(iter(rows), schema))
    theirs = spark_batches(rows, schema)
    assert [b.num_rows for b in ours] == [arrow_rows.ROWS_PER_BATCH, 7]
    assert len(ours) == len(theirs)
    for mine, spark in zip(ours, theirs, strict=True):
        assert mine.schema.equals(spark.schema)
        assert mine.equals(spark)


def test_a_null_in_a_field_declared_not_null_fares_as_with_spark() -> None:
    # ``align`` refuses it before any batch is made; here the batch is what Spark would make.
    schema = full_schema(SCHEMA)
    bad = list(row(1))
    bad[1] = None  # "id" is declared not null
    ours = list(arrow_rows.batches(iter([tuple(bad)]), schema))
    theirs = spark_batches([tuple(bad)], schema)
    assert [b.to_pylist() for b in ours] == [b.to_pylist() for b in theirs]


def test_no_rows_no_batch() -> None:
    assert list(arrow_rows.batches(iter([]), full_schema(SCHEMA))) == []


def test_a_writers_batches_give_the_dicts_of_sparks_rows() -> None:
    import pyarrow as pa
    from pyspark.sql.conversion import ArrowTableToRowsConversion

    stage = [row(i, nulls=i % 5 == 0)[:len(SCHEMA.fields)] for i in range(50)]
    (batch,) = spark_batches(stage, SCHEMA)
    spark_rows = ArrowTableToRowsConversion.convert(pa.Table.from_batches([batch]), SCHEMA, binary_as_bytes=True)
    expected = [r.asDict(recursive=True) for r in spark_rows]
    got = arrow_rows.dicts(batch, SCHEMA)
    assert got == expected
    assert [type(v) for v in got[1].values()] == [type(v) for v in expected[1].values()]
    assert got[1]["home"] == {"city": "x1"} and got[1]["seen"] == {"a": 1}  # nested rows and maps as dicts
