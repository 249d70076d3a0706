"""Records to a DataFrame and rows back, through Arrow, with the session's real Spark."""

from __future__ import annotations

from typing import Any

import pytest

from engine.records import Record
from engine.spark.frames import to_frame, to_records, to_rows


def test_records_round_trip_through_a_dataframe(spark: Any) -> None:
    records = [Record(i, {"name": f"n{i}", "amount": i * 1.5}, 1_000 + i) for i in range(5)]

    frame = to_frame(spark, records, "key")
    rows = to_rows(frame.orderBy("key"), "stage")

    assert sorted(frame.columns) == ["amount", "key", "name"]
    assert to_records(rows, "key", None, 7) == [Record(i, {"name": f"n{i}", "amount": i * 1.5}, 7)
                                                   for i in range(5)]
    first = to_rows(frame.filter("key = 0"), "stage")
    assert to_records(first, "key", ["amount"], 7) == [Record(0, {"amount": 0.0}, 7)]


def test_a_value_that_is_not_a_mapping_is_the_value_column(spark: Any) -> None:
    frame = to_frame(spark, [Record("a", 3, 0), Record("b", 4, 0)], "k")

    assert sorted((r["k"], r["value"]) for r in to_rows(frame, "stage")) == [("a", 3), ("b", 4)]


def test_a_declared_schema_fixes_the_types(spark: Any) -> None:
    frame = to_frame(spark, [Record(1, {"amount": 2}, 0)], "key", schema="key long, amount double")

    assert dict(frame.dtypes) == {"key": "bigint", "amount": "double"}


def test_a_stage_must_return_a_dataframe() -> None:
    with pytest.raises(TypeError, match="must return a pyspark.sql.DataFrame, got list"):
        to_rows([], "enrich")
