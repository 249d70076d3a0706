"""A Spark stage's ``schema=``: each record's fields aligned to it by name.

Spark gives a declared schema's fields to a frame's columns by position, and a record's
value dict holds its fields in whatever order they came. ``align`` puts every record into
the schema's order, by name, before Spark sees it; a value that does not fit its field's
type is a ``SchemaMismatch``, so that one record (not its batch) goes to the error handler.

Types are told apart by ``DataType.typeName()``, so pyspark is not imported here.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
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
    return _struct(fields, schema, "")


def _struct(fields: Mapping[str, Any], schema: StructType, prefix: str) -> dict[str, Any]:
    return {field.name: _fit(fields.get(field.name), field.dataType, field.nullable, prefix + field.name)
            for field in schema.fields}


def _fit(value: Any, data_type: DataType, nullable: bool, path: str) -> Any:
    """``value`` as ``data_type`` holds it, or a ``SchemaMismatch`` naming ``path``."""
    if value is None:
        if nullable:
            return None
        raise SchemaMismatch(path, f"{data_type.simpleString()} not null", "null")
    kind = data_type.typeName()
    if kind in _TAKEN_AS_IS:
        if isinstance(value, _TAKEN_AS_IS[kind]):
            return value
    elif kind in _INTEGRAL_BITS:
        if isinstance(value, int) and not isinstance(value, bool):
            bound = 1 << (_INTEGRAL_BITS[kind] - 1)
            if -bound <= value < bound:
                return value
            raise SchemaMismatch(path, data_type.simpleString(), "int out of range")
    elif kind in ("double", "float"):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif kind == "decimal":
        return _decimal(value, data_type, path)
    elif kind == "date":
        if isinstance(value, datetime.date):
            return value.date() if isinstance(value, datetime.datetime) else value
    elif kind == "binary":
        if isinstance(value, (bytes, bytearray)):
            return bytes(value)
    elif kind == "struct":
        if isinstance(value, Mapping):
            return _struct(value, data_type, path + ".")  # type: ignore[arg-type]  # kind names the DataType subclass
    elif kind == "array":
        if isinstance(value, (list, tuple)):
            element, nulls = data_type.elementType, data_type.containsNull  # type: ignore[attr-defined]  # kind names the DataType subclass
            return [_fit(item, element, nulls, path + "[]") for item in value]
    elif kind == "map":
        if isinstance(value, Mapping):
            keys, values = data_type.keyType, data_type.valueType  # type: ignore[attr-defined]  # kind names the DataType subclass
            nulls = data_type.valueContainsNull  # type: ignore[attr-defined]  # kind names the DataType subclass
            return {_fit(k, keys, False, path + "{key}"): _fit(v, values, nulls, path + "{value}")
                    for k, v in value.items()}
    elif kind == "void":
        pass  # NullType: only None fits
    else:
        return value  # intervals, variants, user types: Spark checks them itself
    raise SchemaMismatch(path, data_type.simpleString(), type(value).__name__)


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
