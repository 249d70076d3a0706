"""``TaskId``: printed and parsed as ``<subtopology>_<partition>``, like Kafka Streams."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamloop.ids import TaskId


def test_task_id_prints_as_subtopology_underscore_partition() -> None:
    assert str(TaskId(0, 3)) == "0_3"


def test_parse_reads_the_printed_form() -> None:
    assert TaskId.parse("12_7") == TaskId(12, 7)


@given(st.integers(min_value=0, max_value=10_000), st.integers(min_value=0, max_value=10_000))
def test_parse_inverts_str(subtopology: int, partition: int) -> None:
    task = TaskId(subtopology, partition)

    assert TaskId.parse(str(task)) == task


def test_task_ids_order_by_subtopology_then_partition() -> None:
    assert sorted([TaskId(1, 0), TaskId(0, 10), TaskId(0, 2)]) == [TaskId(0, 2), TaskId(0, 10), TaskId(1, 0)]


@pytest.mark.parametrize("text", ["", "0", "03", "0_", "_3", "0_3_1", "a_3", "0_b", "-1_3", "0_-3", "0-3", " 0_3"])
def test_parse_rejects_anything_else_with_a_value_error_quoting_the_text(text: str) -> None:
    with pytest.raises(ValueError, match="Task id must look like '<subtopology>_<partition>', got ") as caught:
        TaskId.parse(text)

    assert repr(text) in str(caught.value)


@pytest.mark.parametrize("text", ["0_²", "0_٣"])
def test_parse_rejects_non_ascii_digits_with_the_clear_message(text: str) -> None:
    with pytest.raises(ValueError, match="Task id must look like"):
        TaskId.parse(text)
