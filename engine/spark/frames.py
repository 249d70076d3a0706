"""Records to a Spark ``DataFrame`` and rows back, through Arrow.

A batch's records become one row each: the key under the key column, and the value's
fields as the other columns (a value that is not a mapping goes under ``value``). With a
declared schema, each row is first aligned to it by name (``schema.align``).
Both directions go through a ``pyarrow.Table`` (``createDataFrame(table)`` and
``DataFrame.toArrow()`` on PySpark 4; pandas with Arrow enabled on 3.5), so no row
is built one Python object at a time inside Spark.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from streamloop.records import ConsumerRecord, Record
from streamloop.serdes import Serde

from .schema import SchemaMismatch, aligner

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from .timing import JobClock

VALUE_COLUMN = "value"


@dataclass
class Decoded:
    """A batch of fetched records decoded: the records that decoded, their indexes in the batch,
    and the ones that did not (index in the batch -> which part failed, and the serde's error)."""

    records: list[Record] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    failed: dict[int, tuple[str, Exception]] = field(default_factory=dict)


def decode(raws: Sequence[ConsumerRecord], key_serde: Serde, value_serde: Serde) -> Decoded:
    """Deserialize a batch of fetched records with the source's serdes (call on a worker thread,
    so that the stream thread's loop pays nothing per record for it)."""
    decoded = Decoded()
    records, positions = decoded.records, decoded.positions
    for index, raw in enumerate(raws):
        what = "key"
        try:
            key = key_serde.deserialize(raw.key)
            what = "value"
            value = value_serde.deserialize(raw.value)
        except Exception as exc:
            decoded.failed[index] = (what, exc)
            continue
        records.append(Record(key, value, raw.timestamp, raw.headers))
        positions.append(index)
    return decoded


def to_frame(session: Any, records: Sequence[Record], key_column: str, schema: StructType | None = None,
             clock: JobClock | None = None) -> tuple[Any, dict[int, SchemaMismatch]]:
    """A ``DataFrame`` of ``records`` and the records left out of it (call on a worker thread).

    With ``schema`` (from ``schema.resolve_schema``), each record's row is aligned to it by
    name; a record with a value that does not fit is left out, its ``SchemaMismatch`` under its
    index in ``records``. The frame is None when no record is left in it.
    """
    table, left_out = to_arrow(records, key_column, schema, clock)
    if table is None:
        return None, left_out
    return create_frame(session, table, schema, clock), left_out


def to_arrow(records: Sequence[Record], key_column: str, schema: StructType | None = None,
             clock: JobClock | None = None) -> tuple[Any, dict[int, SchemaMismatch]]:
    """The ``pyarrow.Table`` that ``to_frame`` makes its frame of (None: no record left in it),
    and the records left out, as there."""
    import pyarrow as pa

    rows = []
    left_out: dict[int, SchemaMismatch] = {}
    fit = None if schema is None else aligner(schema)
    for index, record in enumerate(records):
        value = record.value
        row = dict(value) if isinstance(value, Mapping) else {VALUE_COLUMN: value}
        row[key_column] = record.key
        if fit is not None:
            try:
                row = fit(row)
            except SchemaMismatch as mismatch:
                left_out[index] = mismatch
                continue
        rows.append(row)
    if not rows:
        if clock is not None:
            clock.mark("frame")
        return None, left_out
    # With a schema, every row has its fields in the schema's order: Spark gives the schema's
    # fields to the table's columns by position, and the schema decides the types (Arrow's
    # inference from the values may not). Without one, the columns are every field of any row
    # (``Table.from_pylist`` would take only the first row's).
    names = dict.fromkeys(name for row in rows for name in row)
    table = pa.Table.from_pydict({name: [row.get(name) for row in rows] for name in names})
    if clock is not None:
        clock.mark("frame")
    return table, left_out


def create_frame(session: Any, table: Any, schema: StructType | None = None, clock: JobClock | None = None) -> Any:
    """A ``DataFrame`` of an Arrow ``table`` from ``to_arrow`` (call on a worker thread). Spark
    Classic makes one partition of each record batch of the table."""
    try:
        frame = session.createDataFrame(table, schema=schema)
    except TypeError:  # PySpark 3.5 takes no Arrow table: pandas, converted with Arrow
        frame = session.createDataFrame(table.to_pandas(), schema=schema)
    if clock is not None:
        clock.mark("create")
    return frame


def to_rows(frame: Any, stage: str, clock: JobClock | None = None) -> list[dict[str, Any]]:
    """The rows of ``frame`` as plain dicts of Python values (call on a worker thread)."""
    table = to_table(frame, stage, clock)
    check_names(table.column_names, stage)
    rows = table.to_pylist()
    if clock is not None:
        clock.mark("rows")
    return rows  # type: ignore[no-any-return]  # pyarrow is untyped


def check_frame(frame: Any, stage: str) -> None:
    """Raise unless ``frame`` is what a Spark stage's function must give back: a DataFrame."""
    if not (hasattr(frame, "toArrow") or hasattr(frame, "toPandas")):
        raise TypeError(f"Spark stage '{stage}' must return a pyspark.sql.DataFrame, got {type(frame).__name__}")


def to_table(frame: Any, stage: str, clock: JobClock | None = None) -> Any:
    """``frame`` collected as a ``pyarrow.Table`` (call on a worker thread): one Spark job."""
    check_frame(frame, stage)
    if clock is not None:
        clock.mark("analyze")
        _plan(frame)
        clock.mark("plan")
    if hasattr(frame, "toArrow"):
        table = frame.toArrow()
    else:
        import pyarrow as pa

        table = pa.Table.from_pandas(frame.toPandas(), preserve_index=False)
    if clock is not None:
        clock.mark("execute")
    return table


def _plan(frame: Any) -> None:
    """Optimize and plan ``frame``'s action ahead of it, only to time planning apart (the
    action reuses the plan its query execution keeps, so the job costs the same)."""
    jdf = getattr(frame, "_jdf", None)
    if jdf is not None:  # Spark Classic; Spark Connect plans on the server
        jdf.queryExecution().executedPlan()


def check_names(names: Sequence[str], stage: str) -> None:
    if len(set(names)) < len(names):
        # A row becomes a dict: all but one of the columns of a name would be lost without a word.
        twice = sorted({name for name in names if names.count(name) > 1})
        raise ValueError(f"Spark stage '{stage}' returned several columns named {twice}; "
                         "rename them (alias, withColumnRenamed) or drop all but one")


def to_records(rows: list[dict[str, Any]], key_column: str, value_columns: Sequence[str] | None,
               timestamp: int) -> list[Record]:
    """One record per row: the key column as key, the value columns (default: all others) as value.

    The rows are taken over (the key is popped from each), which saves a copy per row. They are
    the rows of one frame, so all have the first one's fields: when those are the key and the
    value columns in order, each row is its record's value as it is (no dict made per row).
    """
    if value_columns is not None and rows and [n for n in rows[0] if n != key_column] == list(value_columns):
        value_columns = None
    records = []
    for row in rows:
        key = row.pop(key_column, None)
        value = row if value_columns is None else {c: row.get(c) for c in value_columns}
        records.append(Record(key, value, timestamp, ()))
    return records
