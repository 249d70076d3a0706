"""A Spark stage's ``schema=``: each record's fields aligned to it by name.

Spark gives a declared schema's fields to a frame's columns by position, and a record's
value dict holds its fields in whatever order they came. ``align`` puts every record into
the schema's order, by name, before Spark sees it; a value that does not fit its field's
type is a ``SchemaMismatch``, so that one record (not its batch) goes to the error handler.

Types are told apart by ``DataType.typeName()``, so pyspark is not imported here.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from decimal import ROUND_HALF_UP, Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType

_INTEGRAL_BITS = {"byte": 8, "short": 16, "integer": 32, "long": 64}
_TAKEN_AS_IS: dict[str, tuple[type, ...]] = {
    "string": (str,), "char": (str,), "varchar": (str,), "boolean": (bool,),
    "timestamp": (datetime.datetime,), "timestamp_ntz": (datetime.datetime,),
}


class SchemaMismatch(ValueError):
    """A value that does not fit its field's declared type. ``field`` is the field's path
    (``home.city``, ``tags[].city``, ``seen{key}``, ``seen{value}``), ``expected`` the declared
    type as Spark prints it, ``found`` the value's Python type (``null`` for None)."""

    def __init__(self, field: str, expected: str, found: str) -> None:
        super().__init__(f"field '{field}' is {found}, but the schema declares {expected}")
        self.field = field
        self.expected = expected
        self.found = found


def resolve_schema(session: Any, schema: Any) -> StructType:
    """``schema=`` (a DDL string such as ``"key long, amount double"``, or a ``StructType``) as a
    ``StructType``. Call on a worker thread: Spark parses a DDL string in the JVM."""
    resolved: StructType = session.createDataFrame([], schema).schema
    return resolved


def align(fields: Mapping[str, Any], schema: StructType) -> dict[str, Any]:
    """The row of ``schema`` that ``fields`` make, matched by name.

    The row has the schema's fields in the schema's order; each is the value of the field of
    the same name (names match exactly), or None when ``fields`` lacks it. Fields that the
    schema does not name are dropped. Structs nested in the value, also inside arrays and maps,
    are aligned the same way. Each value must fit its declared type (an int also fits a
    fractional type and is widened); the first that does not raises ``SchemaMismatch``.
    """
    return aligner(schema)(fields)


Fit = Callable[[Any], Any]


def aligner(schema: StructType) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """``align`` against ``schema``, with each field's check chosen once: a loop over a batch's
    records calls this once and the result per record (the per-record cost was in asking each
    field's type its name again for every record)."""
    fits = [(field.name, _fitter(field.dataType, field.nullable, field.name)) for field in schema.fields]

    def aligned(fields: Mapping[str, Any]) -> dict[str, Any]:
        get = fields.get
        return {name: fit(get(name)) for name, fit in fits}

    return aligned


def _fitter(data_type: DataType, nullable: bool, path: str) -> Fit:
    """The function that gives a value as ``data_type`` holds it, or raises a ``SchemaMismatch``
    naming ``path``. Each checks for None first itself: one call per field and record."""
    kind = data_type.typeName()

    def null() -> None:
        if not nullable:
            raise SchemaMismatch(path, f"{data_type.simpleString()} not null", "null")

    def mismatch(value: Any) -> SchemaMismatch:
        return SchemaMismatch(path, data_type.simpleString(), type(value).__name__)

    if kind in _TAKEN_AS_IS:
        types = _TAKEN_AS_IS[kind]

        def as_is(value: Any) -> Any:
            if value is None:
                return null()
            if isinstance(value, types):
                return value
            raise mismatch(value)

        return as_is
    if kind in _INTEGRAL_BITS:
        bound = 1 << (_INTEGRAL_BITS[kind] - 1)

        def integral(value: Any) -> Any:
            if value is None:
                return null()
            if isinstance(value, int) and not isinstance(value, bool):
                if -bound <= value < bound:
                    return value
                raise SchemaMismatch(path, data_type.simpleString(), "int out of range")
            raise mismatch(value)

        return integral
    if kind in ("double", "float"):
        def fractional(value: Any) -> Any:
            if value is None:
                return null()
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
            raise mismatch(value)

        return fractional
    if kind == "decimal":
        return lambda value: null() if value is None else _decimal(value, data_type, path)
    if kind == "date":
        def date(value: Any) -> Any:
            if value is None:
                return null()
            if isinstance(value, datetime.date):
                return value.date() if isinstance(value, datetime.datetime) else value
            raise mismatch(value)

        return date
    if kind == "binary":
        def binary(value: Any) -> Any:
            if value is None:
                return null()
            if isinstance(value, (bytes, bytearray)):
                return bytes(value)
            raise mismatch(value)

        return binary
    if kind == "struct":
        fits = [(field.name, _fitter(field.dataType, field.nullable, f"{path}.{field.name}"))
                for field in data_type.fields]  # type: ignore[attr-defined]  # kind names the DataType subclass

        def struct(value: Any) -> Any:
            if value is None:
                return null()
            if isinstance(value, Mapping):
                get = value.get
                return {name: fit(get(name)) for name, fit in fits}
            raise mismatch(value)

        return struct
    if kind == "array":
        element = _fitter(data_type.elementType, data_type.containsNull, path + "[]")  # type: ignore[attr-defined]  # kind names the DataType subclass

        def array(value: Any) -> Any:
            if value is None:
                return null()
            if isinstance(value, (list, tuple)):
                return [element(item) for item in value]
            raise mismatch(value)

        return array
    if kind == "map":
        key = _fitter(data_type.keyType, False, path + "{key}")  # type: ignore[attr-defined]  # kind names the DataType subclass
        item = _fitter(data_type.valueType, data_type.valueContainsNull,  # type: ignore[attr-defined]  # kind names the DataType subclass
                       path + "{value}")

        def mapping(value: Any) -> Any:
            if value is None:
                return null()
            if isinstance(value, Mapping):
                return {key(k): item(v) for k, v in value.items()}
            raise mismatch(value)

        return mapping
    if kind == "void":
        def void(value: Any) -> Any:
            if value is None:
                return null()
            raise mismatch(value)  # NullType: only None fits

        return void
    # Intervals, variants, user types: Spark checks them itself.
    return lambda value: null() if value is None else value


def _decimal(value: Any, data_type: Any, path: str) -> Decimal:
    """A number rounded half up to the declared scale (as Spark rounds), if its digits fit."""
    if isinstance(value, bool) or not isinstance(value, (Decimal, int, float)):
        raise SchemaMismatch(path, data_type.simpleString(), type(value).__name__)
    number = value if isinstance(value, Decimal) else Decimal(repr(value) if isinstance(value, float) else value)
    if not number.is_finite():
        raise SchemaMismatch(path, data_type.simpleString(), f"{type(value).__name__} {number}")
    rounded = number.quantize(Decimal(1).scaleb(-data_type.scale), rounding=ROUND_HALF_UP)
    if rounded and rounded.adjusted() >= data_type.precision - data_type.scale:
        raise SchemaMismatch(path, data_type.simpleString(), f"{type(value).__name__} out of range")
    return rounded
