"""Whatever the order of the fields in the records' values and in a Spark stage's ``schema=``, the
DataFrame the stage's function is given holds the same rows: each record's fields under their
own names (with the session's real local Spark)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from streamloop.records import Record
from streamloop.spark.frames import to_frame
from streamloop.spark.schema import resolve_schema

VALUES = {
    "string": st.text(max_size=6),
    "bigint": st.integers(-(1 << 63), (1 << 63) - 1),
    "double": st.floats(allow_nan=False, allow_infinity=False),
    "boolean": st.booleans(),
}


@st.composite
def batches(draw: st.DrawFn) -> tuple[dict[str, str], list[dict[str, Any]], list[list[str]], list[str]]:
    """Field types, the values of a batch, each value's field order, and the schema's field order."""
    names = draw(st.lists(st.text("abcdefgh", min_size=1, max_size=3), min_size=1, max_size=5, unique=True))
    types = {name: draw(st.sampled_from(sorted(VALUES))) for name in names}
    values = draw(st.lists(st.fixed_dictionaries({name: st.none() | VALUES[types[name]] for name in names}),
                           min_size=1, max_size=4))
    orders = [draw(st.permutations(names)) for _ in values]
    return types, values, orders, draw(st.permutations([*names, "key"]))


def frame_rows(spark: Any, types: dict[str, str], values: list[dict[str, Any]], orders: list[list[str]],
               schema_order: list[str]) -> tuple[list[str], list[dict[str, Any]]]:
    records = [Record(i, {name: value[name] for name in order}, 0)
               for i, (value, order) in enumerate(zip(values, orders, strict=True))]
    ddl = ", ".join(f"`{name}` {'bigint' if name == 'key' else types[name]}" for name in schema_order)
    frame, left_out = to_frame(spark, records, "key", resolve_schema(spark, ddl))
    assert left_out == {}
    return frame.columns, sorted((row.asDict() for row in frame.collect()), key=lambda row: row["key"])


@settings(max_examples=12)
@given(batch=batches())
def test_the_frame_a_stage_sees_does_not_depend_on_field_order(spark: Any, batch: Any) -> None:
    types, values, orders, schema_order = batch
    canonical = sorted(types)

    columns, rows = frame_rows(spark, types, values, orders, schema_order)
    _, canonical_rows = frame_rows(spark, types, values, [canonical] * len(values), [*canonical, "key"])

    assert columns == schema_order
    assert rows == canonical_rows
    assert rows == [{"key": i, **value} for i, value in enumerate(values)]
