"""A Python data source's rows to and from Spark as Arrow record batches, columns in bulk.

A reader that yields tuples has Spark's Python worker convert each value of each row with a
converter of its column's type before it builds the Arrow batch itself (about 3 µs a record for
the executors' frame of 21 columns, a third of the read's Python time). ``batches`` builds the
same batches by columns: the rows transposed at C speed, and each column made by Arrow from its
values in one call where that gives what Spark's converter would, which holds for the types that
``schema.align`` has already checked exactly (strings, integers, floats, booleans, bytes and
dates, and the side columns, which are the reader's own). Any other column (a timestamp, a
decimal, a struct, an array, a map) still goes through Spark's own converter, value by value, so
its semantics are Spark's. Without that converter (an older pyspark), the reader yields tuples
as before (``available``).

The other way, ``dicts`` gives a writer's Arrow batches as the dicts ``Row.asDict(recursive=True)``
gives of the rows Spark's worker would have made of them (about as much again per record on the
write): bulk columns by Arrow's ``to_pylist``, the others through Spark's own converter.

Runs inside Spark's Python workers, as ``kafka_reader`` does.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pyspark.sql import Row
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DateType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

# As Spark's spark.sql.execution.arrow.maxRecordsPerBatch default: the size a tuple reader's
# batches have too.
ROWS_PER_BATCH = 10_000

# Types whose values Arrow takes in bulk exactly as Spark's converter hands them on: the converter
# is the identity for these once the value has the type (which ``align`` made sure of), or
# (strings, bytes) only coerces values of other types, which ``align`` lets through for none.
_BULK = (StringType, LongType, IntegerType, ShortType, ByteType, DoubleType, FloatType, BooleanType,
         BinaryType, DateType)


def _converter_factory(name: str = "LocalDataToArrowConversion") -> Callable[..., Any] | None:
    """Spark's converter of values of one type, to Arrow (``LocalDataToArrowConversion``) or from
    it (``ArrowTableToRowsConversion``); None in a pyspark without it."""
    try:
        from pyspark.sql import conversion
    except ImportError:
        return None
    create = getattr(getattr(conversion, name, None), "_create_converter", None)
    return create if callable(create) else None


def available() -> bool:
    """Whether ``batches`` and ``dicts`` can convert here (else tuples and Rows, as Spark makes them)."""
    return _converter_factory() is not None and _converter_factory("ArrowTableToRowsConversion") is not None


def batches(rows: Iterator[Sequence[Any]], schema: StructType) -> Iterator[Any]:
    """``rows`` (tuples in ``schema``'s order) as Arrow record batches of ``schema``, each of at
    most ``ROWS_PER_BATCH`` rows, made as Spark makes a tuple reader's batches."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow = to_arrow_schema(schema, timezone="UTC")
    create = _converter_factory()
    assert create is not None, "call available() first"
    # As Spark's worker makes them: by type alone (a null in a field declared not null is
    # ``align``'s to refuse, and it does).
    converters = [None if isinstance(field.dataType, _BULK) else create(field.dataType) for field in schema.fields]
    types = [field.type for field in arrow]
    while True:
        chunk = list(itertools.islice(rows, ROWS_PER_BATCH))
        if not chunk:
            return
        columns = []
        for values, convert, kind in zip(zip(*chunk, strict=True), converters, types, strict=True):
            columns.append(pa.array(values if convert is None else [convert(value) for value in values], type=kind))
        yield pa.RecordBatch.from_arrays(columns, schema=arrow)


def dicts(batch: Any, schema: StructType) -> list[dict[str, Any]]:
    """The rows of an Arrow record batch of ``schema`` as dicts, each what ``asDict(recursive=True)``
    gives of the ``Row`` Spark's worker would make of it."""
    create = _converter_factory("ArrowTableToRowsConversion")
    assert create is not None, "call available() first"
    columns = []
    for column, field in zip(batch.columns, schema.fields, strict=True):
        values = column.to_pylist()
        if not isinstance(field.dataType, _BULK):
            convert = create(field.dataType)
            values = [_plain(convert(value)) for value in values]
        columns.append(values)
    names = schema.fieldNames()
    return [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]


def _plain(value: Any) -> Any:
    """``Row.asDict(recursive=True)``'s conversion of one value: nested rows as dicts."""
    if isinstance(value, Row):
        return value.asDict(recursive=True)
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value
