"""``Printed``: where and how ``KStream.print`` writes each record (Kafka Streams' ``Printed``).

Each record becomes one line ``[label]: key, value`` (Kafka Streams' format; the label defaults
to the printer's node name, ``KSTREAM-PRINTER-…``), or ``[label]: <mapper(key, value)>`` with
``with_key_value_mapper``. Keys and values are written with ``str()``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from streamloop.errors import TopologyError


def default_mapper(key: Any, value: Any) -> str:
    return f"{key}, {value}"


@dataclass(frozen=True)
class Printed:
    """Build with ``Printed.to_sys_out()`` or ``Printed.to_file(path)``; each ``with_*`` returns a copy."""

    path: Path | None = None  # None: standard output
    label: str | None = None
    mapper: Callable[[Any, Any], Any] = default_mapper
    name: str | None = None

    @staticmethod
    def to_sys_out() -> Printed:
        """Print to standard output (never closed by the printer)."""
        return Printed()

    @staticmethod
    def to_file(path: str | os.PathLike[str]) -> Printed:
        """Print to the file at ``path``, UTF-8, one flushed line per record. The file is created
        (or emptied) when the first task that prints starts, and closed when the last one closes;
        its directory must exist when ``print()`` is called."""
        text = os.fspath(path)
        if not isinstance(text, str) or not text.strip():
            raise TopologyError(f"Printed.to_file() needs a file path, got {path!r}")
        return Printed(path=Path(text))

    def with_label(self, label: str) -> Printed:
        """Begin each line with ``[label]: `` instead of ``[<node name>]: ``."""
        if not isinstance(label, str):
            raise TopologyError(f"Printed.with_label() needs a string, got {label!r}")
        return replace(self, label=label)

    def with_key_value_mapper(self, mapper: Callable[[Any, Any], Any]) -> Printed:
        """Write ``mapper(key, value)`` (made a string with ``str()``) after the label instead of ``key, value``."""
        if not callable(mapper):
            raise TopologyError(f"Printed.with_key_value_mapper() needs a callable, got {mapper!r}")
        return replace(self, mapper=mapper)

    def with_name(self, name: str) -> Printed:
        """Name the printer's node (else ``KSTREAM-PRINTER-…``)."""
        return replace(self, name=name)

    def check(self) -> None:
        """``TopologyError`` when the file cannot be created: its directory is missing."""
        if self.path is not None and not self.path.parent.is_dir():
            raise TopologyError(f"Unable to write stream to file at [{self.path}]: directory "
                                f"'{self.path.parent}' does not exist; create it or print elsewhere")
