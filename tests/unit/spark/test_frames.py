"""Records to a DataFrame and rows back, through Arrow, with the session's real Spark."""

from __future__ import annotations

from typing import Any

import pytest

from streamloop.records import Record
from streamloop.spark.frames import to_frame, to_records, to_rows
from streamloop.spark.schema import resolve_schema


def test_records_round_trip_through_a_dataframe(spark: Any) -> None:
    records = [Record(i, {"name": f"n{i}", "amount": i * 1.5}, 1_000 + i) for i in range(5)]

    frame, left_out = to_frame(spark, records, "key")
    rows = to_rows(frame.orderBy("key"), "stage")

    assert sorted(frame.columns) == ["amount", "key", "name"]
    assert left_out == {}
    assert to_records(rows, "key", None, 7) == [Record(i, {"name": f"n{i}", "amount": i * 1.5}, 7)
                                                   for i in range(5)]
    first = to_rows(frame.filter("key = 0"), "stage")
    assert to_records(first, "key", ["amount"], 7) == [Record(0, {"amount": 0.0}, 7)]


def test_a_value_that_is_not_a_mapping_is_the_value_column(spark: Any) -> None:
    frame, _ = to_frame(spark, [Record("a", 3, 0), Record("b", 4, 0)], "k")

    assert sorted((r["k"], r["value"]) for r in to_rows(frame, "stage")) == [("a", 3), ("b", 4)]


def test_a_declared_schema_fixes_the_types(spark: Any) -> None:
    frame, _ = to_frame(spark, [Record(1, {"amount": 2}, 0)], "key",
                        schema=resolve_schema(spark, "key long, amount double"))

    assert dict(frame.dtypes) == {"key": "bigint", "amount": "double"}


def test_a_schema_takes_the_record_fields_by_name(spark: Any) -> None:
    records = [Record(f"k{i}", {"customer": f"c{i}", "amount": i}, 0) for i in range(3)]
    schema = resolve_schema(spark, "key string, customer string, amount long")

    frame, left_out = to_frame(spark, records, "key", schema)

    assert left_out == {}
    assert [row.asDict() for row in frame.orderBy("key").collect()] == [
        {"key": f"k{i}", "customer": f"c{i}", "amount": i} for i in range(3)]


def test_fields_of_one_type_in_another_order_are_not_swapped(spark: Any) -> None:
    frame, _ = to_frame(spark, [Record("k", {"a": "from a", "b": "from b"}, 0)], "key",
                        resolve_schema(spark, "b string, a string, key string"))

    assert frame.collect()[0].asDict() == {"b": "from b", "a": "from a", "key": "k"}


def test_a_field_a_record_lacks_is_null_and_one_the_schema_lacks_is_dropped(spark: Any) -> None:
    records = [Record(1, {"amount": 5, "note": "dropped"}, 0), Record(2, {"customer": "c2"}, 0)]

    frame, _ = to_frame(spark, records, "key", resolve_schema(spark, "key long, customer string, amount long"))

    assert frame.columns == ["key", "customer", "amount"]
    assert [row.asDict() for row in frame.orderBy("key").collect()] == [
        {"key": 1, "customer": None, "amount": 5}, {"key": 2, "customer": "c2", "amount": None}]


def test_a_record_that_does_not_fit_the_schema_is_left_out_under_its_index(spark: Any) -> None:
    records = [Record(0, {"amount": 1}, 0), Record(1, {"amount": "c0"}, 0), Record(2, {"amount": 3}, 0)]

    frame, left_out = to_frame(spark, records, "key", resolve_schema(spark, "key long, amount long"))

    assert sorted(row["key"] for row in frame.collect()) == [0, 2]
    assert list(left_out) == [1]
    assert (left_out[1].field, left_out[1].expected, left_out[1].found) == ("amount", "bigint", "str")


def test_no_frame_when_no_record_fits(spark: Any) -> None:
    frame, left_out = to_frame(spark, [Record(0, {"amount": "x"}, 0)], "key", resolve_schema(spark, "amount long"))

    assert frame is None
    assert list(left_out) == [0]


def test_a_stage_must_return_a_dataframe() -> None:
    with pytest.raises(TypeError, match=r"must return a pyspark.sql.DataFrame, got list"):
        to_rows([], "enrich")


def test_without_a_schema_a_field_the_first_record_lacks_is_still_a_column(spark: Any) -> None:
    records = [Record(1, {"a": 1}, 0), Record(2, {"b": "x", "a": 2}, 0)]

    frame, _ = to_frame(spark, records, "key")

    assert sorted(frame.columns) == ["a", "b", "key"]
    assert [row.asDict() for row in frame.orderBy("key").collect()] == [
        {"a": 1, "key": 1, "b": None}, {"a": 2, "key": 2, "b": "x"}]


def test_a_result_with_two_columns_of_one_name_is_refused_naming_them(spark: Any) -> None:
    left = spark.createDataFrame([(1, "x")], ["id", "v"])
    right = spark.createDataFrame([(1, "y")], ["id", "v"])

    with pytest.raises(ValueError, match=r"Spark stage 'enrich' returned several columns named \['id', 'v'\]"):
        to_rows(left.join(right, left.id == right.id), "enrich")
