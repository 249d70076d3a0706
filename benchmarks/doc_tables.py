"""The tables of docs/benchmarks.md's issue-#34 section, parsed from its markdown.

Each subsection is found by its heading (matched exactly) under "## The stateful DSL, latency under
load, records in flight (issue #34, first round)", and its first markdown table is read cell by cell
("7,656", "1.58×", "81 / 341 (0.24×)", "2.71 → 2.56", "2.8 / 127.8 / 254.9": a note in parentheses
after the numbers is ignored, a lone dash is a figure not measured). A missing heading, a missing
table or a cell that does not parse raises ``TableError`` naming the heading and the cell.
Caller: ``benchmarks/plots.py``, which draws them; parsing needs no matplotlib.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

SECTION = "The stateful DSL, latency under load, records in flight (issue #34, first round)"
DSL = "The DSL against Kafka Streams 4.1"
COUNT = "Count with changelog against the raw loop"
SEGMENTS = "Window stores in segments"
LATENCY = "Latency under load"
IN_FLIGHT = "Records in flight at 32 and 256 per task"

MISSING = math.nan  # a cell's lone dash: not measured
_NUMBER = r"[−-]?(?:\d{1,3}(?:[,\u00a0\u202f]\d{3})+|\d+)(?:\.\d+)?"
_NUMBER_RE = re.compile(rf"({_NUMBER})\s*×?")
_DASHES = {"–", "—", "-", "−"}
_NOTE = re.compile(r"\s*\(.*\)\s*$")  # text in parentheses after the numbers
_LOAD = re.compile(r"\bload\s+(?:average\s+)?((?:about\s+|of\s+)?\d+(?:\.\d+)?(?:\s*[-–]\s*\d+(?:\.\d+)?)?)")
_SEPARATOR = re.compile(r"^\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?\s*$")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")



class TableError(ValueError):
    """A heading, a table or a cell of the page that the figures cannot be drawn from."""


# --- the page: headings, tables, cells ---------------------------------------------------------------


@dataclass(frozen=True)
class Heading:
    level: int
    text: str
    line: int


@dataclass(frozen=True)
class Table:
    """The first markdown table under a heading, and the text between the heading and it."""

    source: str
    heading: str
    header: list[str]
    rows: list[list[str]]
    before: str

    @property
    def where(self) -> str:
        return f'{self.source}, "### {self.heading}"'

    def column(self, *words: str) -> int:
        """The first column whose header holds every one of ``words`` (case-insensitive)."""
        for i, name in enumerate(self.header):
            if all(w.lower() in name.lower() for w in words):
                return i
        raise TableError(f"{self.where}: no column with {' and '.join(repr(w) for w in words)} in its header "
                         f"(the header: {' | '.join(self.header)})")

    def cell(self, row: int, column: int) -> Cell:
        return Cell(self, self.rows[row][0], self.header[column], self.rows[row][column])

    def load(self) -> str | None:
        """The machine's load as the text above the table gives it ("load 15-22"), if it does."""
        found = _LOAD.search(self.before)
        return "load " + " ".join(found.group(1).split()) if found else None


@dataclass(frozen=True)
class Cell:
    table: Table
    row: str
    column: str
    text: str

    def fail(self, expected: str) -> TableError:
        return TableError(f"{self.table.where}: cell {self.text!r} (row {self.row!r}, column {self.column!r}) "
                          f"does not parse: expected {expected}")


def _headings(lines: Sequence[str]) -> list[Heading]:
    found, fenced = [], False
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        match = None if fenced else _HEADING.match(line)
        if match:
            found.append(Heading(len(match.group(1)), match.group(2), i))
    return found


def _end(headings: Sequence[Heading], start: Heading, limit: int) -> int:
    return next((h.line for h in headings if h.line > start.line and h.level <= start.level), limit)


def _cells(line: str) -> list[str]:
    line = line.strip()
    line = line[1:] if line.startswith("|") else line
    line = line[:-1] if line.endswith("|") and not line.endswith("\\|") else line
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)]


def table(markdown: str, heading: str, section: str = SECTION, source: str = "benchmarks.md") -> Table:
    """The first table under the subsection ``heading`` of the section ``section``."""
    lines = markdown.splitlines()
    headings = _headings(lines)
    parent = next((h for h in headings if h.level == 2 and h.text == section), None)
    if parent is None:
        raise TableError(f'{source}: no heading "## {section}"')
    parent_end = _end(headings, parent, len(lines))
    children = [h for h in headings if parent.line < h.line < parent_end and h.level == parent.level + 1]
    child = next((h for h in children if h.text == heading), None)
    if child is None:
        raise TableError(f'{source}: no heading "### {heading}" under "## {section}" '
                         f"(its subsections: {'; '.join(h.text for h in children) or 'none'})")
    body = lines[child.line + 1:_end(headings, child, parent_end)]
    where = f'{source}, "### {heading}"'
    fenced = False
    for i, line in enumerate(body):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        if fenced or not line.lstrip().startswith("|"):
            continue
        if i + 1 >= len(body) or not _SEPARATOR.match(body[i + 1].strip()):
            raise TableError(f"{where}: the table's header {line.strip()!r} is not followed by a |---| line")
        header = _cells(line)
        rows = []
        for row_line in body[i + 2:]:
            if not row_line.lstrip().startswith("|"):
                break
            row = _cells(row_line)
            if len(row) != len(header):
                raise TableError(f"{where}: row {row_line.strip()!r} has {len(row)} cells, "
                                 f"the header {len(header)}")
            rows.append(row)
        if not rows:
            raise TableError(f"{where}: the table has no rows")
        return Table(source, heading, header, rows, "\n".join(body[:i]))
    raise TableError(f"{where}: no markdown table under the heading")


# --- cells: numbers ----------------------------------------------------------------------------------


def _number(text: str) -> float | None:
    text = text.strip()
    if text in _DASHES:
        return MISSING
    match = _NUMBER_RE.fullmatch(text)
    if not match:
        return None
    return float(re.sub(r"[,\u00a0\u202f]", "", match.group(1)).replace("−", "-"))


def number(cell: Cell) -> float:
    """One number: "7,656", "1.58×", "0.02"; a note in parentheses after it is ignored."""
    value = _number(_NOTE.sub("", cell.text))
    if value is None:
        raise cell.fail('a number such as "7,656" or "1.58×"')
    return value


def numbers(cell: Cell, count: int | None = None, separator: str = "/") -> list[float]:
    """Numbers separated by ``separator`` ("81 / 341 (0.24×)", "12,545 / 10,872"); exactly ``count`` of
    them if given. A lone dash is ``count`` figures not measured."""
    text = _NOTE.sub("", cell.text).strip()
    if text in _DASHES:
        return [MISSING] * (count or 1)
    values = [_number(part) for part in text.split(separator)]
    wanted = f"{count} numbers" if count else "numbers"
    if any(v is None for v in values) or (count is not None and len(values) != count):
        raise cell.fail(f'{wanted} separated by "{separator}"')
    return [v for v in values if v is not None]


def number_and_paren(cell: Cell) -> tuple[float, float]:
    """ "1.26 (1.37)" → (1.26, 1.37): a figure and a second one in parentheses (missing if absent); text
    after a comma or semicolon ("…, ahead in 4 of 4 pairs") is ignored."""
    match = re.fullmatch(rf"\s*({_NUMBER}\s*×?|[–—−-])\s*(?:\(\s*({_NUMBER}\s*×?|[–—−-])\s*\))?\s*(?:[,;].*)?",
                         cell.text)
    first = _number(match.group(1)) if match else None
    second = _number(match.group(2)) if match and match.group(2) else MISSING
    if first is None or second is None:
        raise cell.fail('a number and another in parentheses, such as "1.26 (1.37)"')
    return first, second


def before_after(cell: Cell) -> tuple[float, float]:
    """ "2.71 → 2.56" → (2.71, 2.56)."""
    values = numbers(Cell(cell.table, cell.row, cell.column, cell.text.replace("->", "→")), 2, "→")
    return values[0], values[1]


# --- the five tables ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DslRow:
    workload: str
    ours: float
    theirs: float
    ratio: float
    rss: list[float]  # streamloop, Kafka Streams


@dataclass(frozen=True)
class Dsl:
    table: Table
    rows: list[DslRow]


@dataclass(frozen=True)
class CountRow:
    change: str
    wall: float
    steady: float
    cpu: tuple[float, float]  # before, after


@dataclass(frozen=True)
class Count:
    table: Table
    rows: list[CountRow]


@dataclass(frozen=True)
class Segments:
    table: Table
    times: list[float]
    unit: str
    rows: list[tuple[str, list[float]]]


@dataclass(frozen=True)
class LatencyRow:
    contender: str
    stateless: list[float]
    count: list[float]


@dataclass(frozen=True)
class Latency:
    table: Table
    quantiles: list[str]
    unit: str
    rows: list[LatencyRow]


@dataclass(frozen=True)
class InFlightRow:
    level: str
    ours: list[float]
    raw: list[float]
    ours_cpu: list[float]
    raw_cpu: list[float]


@dataclass(frozen=True)
class InFlight:
    table: Table
    rows: list[InFlightRow]


def parse_dsl(markdown: str, source: str = "benchmarks.md") -> Dsl:
    t = table(markdown, DSL, source=source)
    ours, theirs = t.column("streamloop", "rec/s"), t.column("kafka streams", "rec/s")
    ratio, rss = t.column("× kafka streams"), t.column("rss")
    rows = [DslRow(_label(row[0]), number(t.cell(i, ours)), number(t.cell(i, theirs)), number(t.cell(i, ratio)),
                   numbers(t.cell(i, rss), 2)) for i, row in enumerate(t.rows)]
    return Dsl(t, rows)


def parse_count(markdown: str, source: str = "benchmarks.md") -> Count:
    t = table(markdown, COUNT, source=source)
    wall, cpu = t.column("wall", "after/before"), t.column("cpu")
    rows = []
    for i, row in enumerate(t.rows):
        after_before, steady = number_and_paren(t.cell(i, wall))
        rows.append(CountRow(_label(row[0]), after_before, steady, before_after(t.cell(i, cpu))))
    return Count(t, rows)


def parse_segments(markdown: str, source: str = "benchmarks.md") -> Segments:
    t = table(markdown, SEGMENTS, source=source)
    times, units = [], set()
    for j, name in enumerate(t.header[1:], start=1):
        match = re.fullmatch(rf"({_NUMBER})\s*(\w*)", name)
        if not match:
            raise TableError(f"{t.where}: header cell {name!r} (column {j + 1}) does not parse: "
                             'expected a stream time such as "1.5 h"')
        times.append(float(match.group(1).replace(",", "")))
        units.add(match.group(2))
    if len(units) > 1:
        raise TableError(f"{t.where}: the header's stream times have different units ({', '.join(sorted(units))})")
    rows = [(_label(row[0]), [number(t.cell(i, j)) for j in range(1, len(t.header))]) for i, row in enumerate(t.rows)]
    return Segments(t, times, units.pop(), rows)


def parse_latency(markdown: str, source: str = "benchmarks.md") -> Latency:
    t = table(markdown, LATENCY, source=source)
    stateless, count = t.column("stateless"), t.column("count")
    quantiles, unit = _quantiles(t, stateless)
    if _quantiles(t, count) != (quantiles, unit):
        raise TableError(f"{t.where}: the columns {t.header[stateless]!r} and {t.header[count]!r} differ "
                         "in their quantiles or unit")
    rows = [LatencyRow(_label(row[0]), numbers(t.cell(i, stateless), len(quantiles)),
                       numbers(t.cell(i, count), len(quantiles))) for i, row in enumerate(t.rows)]
    return Latency(t, quantiles, unit, rows)


def _quantiles(t: Table, column: int) -> tuple[list[str], str]:
    """ "stateless p50 / p99 / max ms" → (["p50", "p99", "max"], "ms")."""
    parts = [p.split() for p in t.header[column].split("/")]
    if len(parts) < 2 or not all(parts) or len(parts[-1]) != 2:
        raise TableError(f"{t.where}: header cell {t.header[column]!r} does not parse: "
                         'expected quantiles and a unit such as "stateless p50 / p99 / max ms"')
    return [parts[0][-1], *(" ".join(p) for p in parts[1:-1]), parts[-1][0]], parts[-1][1]


def parse_in_flight(markdown: str, source: str = "benchmarks.md") -> InFlight:
    t = table(markdown, IN_FLIGHT, source=source)
    ours, raw = t.column("streamloop", "rec/s"), t.column("raw", "rec/s")
    ours_cpu, raw_cpu = t.column("streamloop", "cpu"), t.column("raw", "cpu")
    rows = [InFlightRow(_label(row[0]), numbers(t.cell(i, ours)), numbers(t.cell(i, raw)),
                        numbers(t.cell(i, ours_cpu)), numbers(t.cell(i, raw_cpu))) for i, row in enumerate(t.rows)]
    return InFlight(t, rows)


def parse_all(markdown: str, source: str = "benchmarks.md") -> tuple[Dsl, Count, Segments, Latency, InFlight]:
    return (parse_dsl(markdown, source), parse_count(markdown, source), parse_segments(markdown, source),
            parse_latency(markdown, source), parse_in_flight(markdown, source))


def _label(text: str) -> str:
    return text.replace("`", "").replace("**", "").strip()
