"""One Spark job for several tasks' parts (``engine.spark.parts.run_parts``), with the session's
local Spark: the function sees each part alone, the rows come back split by part in order, parts
of different columns are collected apart, and a write of same-column parts is one write."""

from __future__ import annotations

from typing import Any

from engine.records import Record
from engine.spark.frames import to_frame
from engine.spark.parts import PART_COLUMN, run_parts
from engine.spark.stage import transform_job


def frame_of(spark: Any, values: list[dict[str, Any]]) -> Any:
    return to_frame(spark, [Record(i, v, 0) for i, v in enumerate(values)], "key")[0]


def test_each_part_is_run_alone_and_gets_its_own_rows_back_in_order(spark: Any) -> None:
    seen: list[list[int]] = []

    def fn(frame: Any) -> Any:
        seen.append([row.n for row in frame.collect()])
        assert PART_COLUMN not in frame.columns  # the function never sees the tag
        return frame.withColumn("twice", frame.n * 2).orderBy(frame.n.desc())

    frames = [frame_of(spark, [{"n": n} for n in (1, 2, 3)]), None, frame_of(spark, [{"n": n} for n in (7, 8)])]

    rows = run_parts(transform_job(fn, "stage"), frames, "stage")

    assert sorted(seen) == [[1, 2, 3], [7, 8]]
    assert rows[1] is None
    assert [(r["n"], r["twice"]) for r in rows[0] or []] == [(3, 6), (2, 4), (1, 2)]
    assert [(r["n"], r["twice"]) for r in rows[2] or []] == [(8, 16), (7, 14)]
    assert all(PART_COLUMN not in r for part in rows for r in part or [])


def test_parts_with_different_columns_are_collected_apart(spark: Any) -> None:
    frames = [frame_of(spark, [{"n": 1}]), frame_of(spark, [{"s": "x", "t": True}])]

    rows = run_parts(transform_job(lambda frame: frame, "stage"), frames, "stage")

    assert rows == [[{"n": 1, "key": 0}], [{"s": "x", "t": True, "key": 0}]]


def test_a_write_of_parts_with_the_same_columns_is_one_write(spark: Any) -> None:
    written: list[list[int]] = []

    def write(frame: Any) -> None:
        written.append(sorted(row.n for row in frame.collect()))
        return None

    frames = [frame_of(spark, [{"n": 1}, {"n": 2}]), frame_of(spark, [{"n": 3}])]

    assert run_parts(write, frames, "sink") == [None, None]
    assert written == [[1, 2, 3]]
