"""A record's fields aligned to a stage's schema by name (no Spark session needed)."""

from __future__ import annotations

import datetime
from decimal import Decimal

import pytest
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    StringType,
    StructField,
    StructType,
)

from streamloop.spark.schema import SchemaMismatch, align

ORDER = StructType([StructField("key", StringType()), StructField("customer", StringType()),
                    StructField("amount", LongType())])


def test_fields_come_in_the_schema_order_whatever_the_record_order() -> None:
    aligned = align({"amount": 5, "key": "k", "customer": "c1"}, ORDER)

    assert list(aligned.items()) == [("key", "k"), ("customer", "c1"), ("amount", 5)]


def test_a_field_the_record_lacks_is_null_and_one_the_schema_lacks_is_dropped() -> None:
    assert align({"key": "k", "amount": 5, "note": "extra"}, ORDER) == {"key": "k", "customer": None, "amount": 5}


@pytest.mark.parametrize("value, found", [("c0", "str"), (True, "bool"), (2.5, "float"), (1 << 63, "int out of range")])
def test_a_value_that_does_not_fit_names_the_field_and_the_expected_type(value: object, found: str) -> None:
    with pytest.raises(SchemaMismatch) as caught:
        align({"key": "k", "customer": "c", "amount": value}, ORDER)

    assert (caught.value.field, caught.value.expected, caught.value.found) == ("amount", "bigint", found)


def test_a_null_for_a_field_declared_not_null_does_not_fit() -> None:
    schema = StructType([StructField("id", IntegerType(), nullable=False)])

    with pytest.raises(SchemaMismatch) as caught:
        align({}, schema)

    assert (caught.value.field, caught.value.expected, caught.value.found) == ("id", "int not null", "null")


def test_numbers_widen_to_a_declared_fractional_type() -> None:
    schema = StructType([StructField("ratio", DoubleType()), StructField("price", DecimalType(10, 2))])

    aligned = align({"price": 3, "ratio": 1}, schema)

    assert aligned == {"ratio": 1.0, "price": Decimal(3)}
    assert type(aligned["ratio"]) is float


def test_nested_structs_arrays_and_maps_are_aligned_and_checked_by_name() -> None:
    address = StructType([StructField("city", StringType()), StructField("zip", StringType())])
    schema = StructType([StructField("home", address), StructField("tags", ArrayType(address)),
                         StructField("seen", MapType(StringType(), DateType())), StructField("vip", BooleanType())])
    day = datetime.date(2026, 1, 2)

    aligned = align({"vip": False, "seen": {"shop": day}, "tags": [{"zip": "1", "city": "a"}],
                     "home": {"zip": "2", "city": "b", "floor": 3}}, schema)

    assert aligned == {"home": {"city": "b", "zip": "2"}, "tags": [{"city": "a", "zip": "1"}],
                       "seen": {"shop": day}, "vip": False}
    assert list(aligned["home"]) == ["city", "zip"]
    with pytest.raises(SchemaMismatch) as caught:
        align({"tags": [{"city": "a"}, {"city": 7}]}, schema)
    assert (caught.value.field, caught.value.expected, caught.value.found) == ("tags[].city", "string", "int")


@pytest.mark.parametrize("data_type, value, expected, found", [
    (DecimalType(4, 2), Decimal("123.4"), "decimal(4,2)", "Decimal out of range"),
    (DecimalType(4, 2), float("nan"), "decimal(4,2)", "float NaN"),
    (NullType(), 0, "void", "int"),
    (DateType(), "2026-01-02", "date", "str"),
])
def test_other_types_refuse_what_spark_would_not_take(data_type: object, value: object, expected: str,
                                                      found: str) -> None:
    with pytest.raises(SchemaMismatch) as caught:
        align({"x": value}, StructType([StructField("x", data_type)]))  # type: ignore[arg-type]

    assert (caught.value.expected, caught.value.found) == (expected, found)


def test_a_decimal_is_rounded_half_up_to_its_scale() -> None:
    schema = StructType([StructField("price", DecimalType(6, 2))])

    assert align({"price": 1.005}, schema) == {"price": Decimal("1.01")}
    assert align({"price": Decimal("9999.994")}, schema) == {"price": Decimal("9999.99")}
