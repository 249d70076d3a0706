"""One Spark job for several tasks' parts (``streamloop.spark.parts.run_parts``), with the session's
local Spark: the function sees each part alone, the rows come back split by part in order, parts
of different columns are collected apart, and a write of same-column parts is one write."""

from __future__ import annotations

from typing import Any

from streamloop.records import Record
from streamloop.spark.frames import to_frame
from streamloop.spark.parts import PART_COLUMN, run_parts
from streamloop.spark.stage import transform_job


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


def test_a_row_wise_function_runs_once_over_all_parts_and_each_gets_its_own_rows_in_order(spark: Any) -> None:
    from pyspark.sql import functions as F

    from streamloop.spark.frames import to_arrow
    from streamloop.spark.parts import LOCAL_RELATION_KEY, row_wise, run_combined

    calls: list[int] = []
    customers = spark.createDataFrame([(n, f"tier-{n}") for n in range(10)], "n long, tier string")

    @row_wise
    def fn(frame: Any) -> Any:
        calls.append(1)
        joined = frame.join(F.broadcast(customers), "n").where(frame.n != 5)
        return joined.select("key", "n", (F.col("n") * 2).alias("twice"), "tier")

    # Parts bigger than a batch: each is cut in several batches, told apart all the same.
    parts = [[3, 1, 4, 1, 5, 9, 2, 6], [], [5, 3, 5, 8, 9, 7, 9, 3, 2, 3]]
    tables = [to_arrow([Record(i, {"n": n}, 0) for i, n in enumerate(values)], "key")[0] if values else None
              for values in parts]
    previous = spark.conf.get(LOCAL_RELATION_KEY)
    spark.conf.set(LOCAL_RELATION_KEY, "0")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "3")
    try:
        rows = run_combined(spark, transform_job(fn, "stage"), tables, None, "stage")  # type: ignore[arg-type]
    finally:
        spark.conf.set(LOCAL_RELATION_KEY, previous)
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")

    assert calls == [1]
    assert rows is not None and rows[1] is None
    for values, part_rows in zip(parts, rows, strict=True):
        if not values:
            continue
        want = [{"key": i, "n": n, "twice": n * 2, "tier": f"tier-{n}"} for i, n in enumerate(values) if n != 5]
        assert part_rows == want


def test_a_row_wise_function_whose_plan_shuffles_runs_its_parts_alone(spark: Any) -> None:
    from streamloop.spark.frames import to_arrow
    from streamloop.spark.parts import LOCAL_RELATION_KEY, row_wise, run_combined

    job = transform_job(row_wise(lambda frame: frame.groupBy("key").count()), "stage")
    tables = [to_arrow([Record(i, {"n": i}, 0) for i in range(3)], "key")[0] for _part in range(2)]
    previous = spark.conf.get(LOCAL_RELATION_KEY)
    spark.conf.set(LOCAL_RELATION_KEY, "0")
    try:
        assert run_combined(spark, job, tables, None, "stage") is None  # type: ignore[arg-type]
    finally:
        spark.conf.set(LOCAL_RELATION_KEY, previous)
    assert job.row_wise is False  # from now on the parts run alone, each its own aggregate
