"""Records to a Spark ``DataFrame`` and rows back, through Arrow.

A batch's records become one row each: the key under the key column, and the value's
fields as the other columns (a value that is not a mapping goes under ``value``).
Both directions go through a ``pyarrow.Table`` (``createDataFrame(table)`` and
``DataFrame.toArrow()`` on PySpark 4; pandas with Arrow enabled on 3.5), so no row
is built one Python object at a time inside Spark.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engine.records import Record

VALUE_COLUMN = "value"


def to_frame(session: Any, records: Sequence[Record], key_column: str, schema: Any = None) -> Any:
    """A ``DataFrame`` of ``records`` (call on a worker thread)."""
    import pyarrow as pa

    rows = []
    for record in records:
        value = record.value
        row = dict(value) if isinstance(value, Mapping) else {VALUE_COLUMN: value}
        row[key_column] = record.key
        rows.append(row)
    table = pa.Table.from_pylist(rows)
    if schema is not None:
        # A declared schema decides the types (Arrow's inference from the first rows may not).
        return session.createDataFrame(table.to_pandas(), schema=schema)
    try:
        return session.createDataFrame(table)
    except TypeError:  # PySpark 3.5 takes no Arrow table: pandas, converted with Arrow
        return session.createDataFrame(table.to_pandas())


def to_rows(frame: Any, stage: str) -> list[dict[str, Any]]:
    """The rows of ``frame`` as plain dicts of Python values (call on a worker thread)."""
    if not (hasattr(frame, "toArrow") or hasattr(frame, "toPandas")):
        raise TypeError(f"Spark stage '{stage}' must return a pyspark.sql.DataFrame, got {type(frame).__name__}")
    if hasattr(frame, "toArrow"):
        table = frame.toArrow()
    else:
        import pyarrow as pa

        table = pa.Table.from_pandas(frame.toPandas(), preserve_index=False)
    return table.to_pylist()  # type: ignore[no-any-return]


def to_records(rows: list[dict[str, Any]], key_column: str, value_columns: Sequence[str] | None,
               timestamp: int) -> list[Record]:
    """One record per row: the key column as key, the value columns (default: all others) as value.

    The rows are taken over (the key is popped from each), which saves a copy per row.
    """
    records = []
    for row in rows:
        key = row.pop(key_column, None)
        value = row if value_columns is None else {c: row.get(c) for c in value_columns}
        records.append(Record(key, value, timestamp, ()))
    return records
