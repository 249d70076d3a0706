"""The figures of the benchmark page's issue-#34 section are read from its markdown tables."""

from __future__ import annotations

import pytest

from benchmarks.doc_tables import SECTION, TableError, parse_in_flight, parse_latency

PAGE = f"""# Benchmarks

## {SECTION}

### Latency under load

A run at load 3-5:

| at 50% of its own peak | stateless p50 / p99 / max ms | count p50 / p99 / max ms |
|---|---|---|
| streamloop | 2.5 / 40.0 / 1,250.5 | 7 / 60 / 90 |
| Kafka Streams | 8,324 / 12,108 / 12,399 (a backlog it never cleared) | 11 / 14 / 15 |

Text after the table | with a pipe.

### Records in flight at 32 and 256 per task

| in flight per task | streamloop rec/s | raw rec/s | × raw | streamloop CPU µs/record | raw CPU µs/record |
|---|---|---|---|---|---|
| 32 | 12,545 / 10,872 | 12,427 | 1.01× | 33.2 / 33.9 | 25.2 |

## Another section

### Latency under load

| at 50% of its own peak | stateless p50 / p99 / max ms | count p50 / p99 / max ms |
|---|---|---|
| elsewhere | 1 / 2 / 3 | 4 / 5 / 6 |
"""


def test_the_latency_table_is_read_from_its_own_section_notes_in_parentheses_ignored() -> None:
    latency = parse_latency(PAGE)

    assert latency.quantiles == ["p50", "p99", "max"] and latency.unit == "ms"
    assert [r.contender for r in latency.rows] == ["streamloop", "Kafka Streams"]
    assert latency.rows[0].stateless == [2.5, 40.0, 1250.5] and latency.rows[0].count == [7, 60, 90]
    assert latency.rows[1].stateless == [8324, 12108, 12399]
    assert latency.table.load() == "load 3-5"


def test_a_cell_may_hold_one_run_or_two() -> None:
    (row,) = parse_in_flight(PAGE).rows

    assert (row.level, row.ours, row.raw, row.ours_cpu, row.raw_cpu) == ("32", [12545, 10872], [12427],
                                                                          [33.2, 33.9], [25.2])


def test_a_cell_that_does_not_parse_names_its_heading_and_cell() -> None:
    broken = PAGE.replace("7 / 60 / 90", "7 / sixty / 90")

    with pytest.raises(TableError) as error:
        parse_latency(broken)

    message = str(error.value)
    assert '"### Latency under load"' in message and "'7 / sixty / 90'" in message
    assert "row 'streamloop'" in message and "column 'count p50 / p99 / max ms'" in message


def test_a_cell_with_too_few_numbers_is_an_error() -> None:
    with pytest.raises(TableError, match=r"'11 / 14' .* expected 3 numbers"):
        parse_latency(PAGE.replace("11 / 14 / 15", "11 / 14"))


def test_a_missing_heading_or_table_is_an_error_naming_it() -> None:
    with pytest.raises(TableError, match=r'no heading "### Latency under load" under "## The stateful DSL'):
        parse_latency(PAGE.replace("### Latency under load\n\nA run", "### Latency\n\nA run"))
    no_table = PAGE.split("| at 50%")[0] + "\n### Records in flight at 32 and 256 per task\n\nNo table yet.\n"
    with pytest.raises(TableError, match=r'"### Records in flight at 32 and 256 per task": no markdown table'):
        parse_in_flight(no_table)
