"""One Spark job for the batches of several tasks ("parts"): the worker-thread side.

Each part is framed on its own, exactly as a batch alone (``frames.to_frame``: its own columns,
types and schema misfits), and the stage's function is applied to each part's frame on its own,
so it sees what it saw before: one task's records. Only the collecting is shared: the results
are tagged with their part's index in a column, unioned, and collected through Arrow in one
action (one Spark job, one round of scheduling, instead of one per task), then split back by that
column, each part's rows in the order its frame gave them. Where the parts' results cannot be
unioned (their columns differ: no schema and values of different shapes), each is collected on
its own, as before.

A ``to_spark`` write is one write of the union of the parts' frames when they have the same
columns, else one write per part.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.records import ConsumerRecord
from engine.serdes import Serde

from .frames import check_frame, check_names, to_rows, to_table

if TYPE_CHECKING:
    from engine.processors.nodes import SinkNode

# A batch's work on the worker thread: the batch as a DataFrame in, rows out (None for a sink).
BatchJob = Callable[[Any], "list[dict[str, Any]] | None"]


class TransformJob:
    """The job of ``spark_batch``: ``fn(DataFrame) -> DataFrame``, its rows collected. The function
    is kept apart so that a job of several tasks' parts (``engine.spark.parts``) can apply it to
    each part and collect them all in one Spark job."""

    __slots__ = ("fn", "stage")

    def __init__(self, fn: Callable[[Any], Any], stage: str) -> None:
        self.fn = fn
        self.stage = stage

    def __call__(self, frame: Any) -> list[dict[str, Any]]:
        return to_rows(self.fn(frame), self.stage)


def transform_job(fn: Callable[[Any], Any], stage: str) -> BatchJob:
    """The job of ``spark_batch``: ``fn(DataFrame) -> DataFrame``, its rows collected."""
    return TransformJob(fn, stage)


# The column that tells the parts apart in the union; dropped before anyone sees the rows.
PART_COLUMN = "__streamloop_part__"


@dataclass(frozen=True)
class Part:
    """One task's batch in a shared job: its fetched records (one offset range), its source's
    serdes and its direct sink (``stage.direct_sink``), if any."""

    raws: Sequence[ConsumerRecord]
    key_serde: Serde
    value_serde: Serde
    sink: SinkNode | None = None


def run_parts(job: BatchJob, frames: Sequence[Any], stage: str) -> list[list[dict[str, Any]] | None]:
    """Run ``job`` over each part's frame (None: nothing of the part to run) in as few Spark jobs
    as the frames allow; each part's rows (None for a part without a frame, or a sink's job)."""
    present = [(index, frame) for index, frame in enumerate(frames) if frame is not None]
    rows: list[list[dict[str, Any]] | None] = [None] * len(frames)
    if not present:
        return rows
    if not isinstance(job, TransformJob):  # a write: nothing comes back
        if len(present) > 1 and _same_columns([frame for _index, frame in present]):
            _nothing_back(job(_union([frame for _index, frame in present])), stage)
        else:
            for _index, frame in present:
                _nothing_back(job(frame), stage)
        return rows
    outs = []
    for index, frame in present:
        out = job.fn(frame)
        check_frame(out, stage)
        outs.append((index, out))
    if len(outs) == 1 or not _same_columns([out for _index, out in outs]):
        for index, out in outs:
            rows[index] = to_rows(out, stage)
        return rows
    from pyspark.sql import functions as F

    table = to_table(_union([out.withColumn(PART_COLUMN, F.lit(index)) for index, out in outs]), stage)
    check_names([name for name in table.column_names if name != PART_COLUMN], stage)
    import pyarrow.compute as pc

    tags = table.column(PART_COLUMN)
    rest = table.drop_columns([PART_COLUMN])
    for index, _out in outs:
        rows[index] = rest.filter(pc.equal(tags, index)).to_pylist()
    return rows


def _same_columns(frames: Sequence[Any]) -> bool:
    first = frames[0].schema
    return all(frame.schema == first for frame in frames[1:])


def _union(frames: Sequence[Any]) -> Any:
    return functools.reduce(lambda left, right: left.union(right), frames)


def _nothing_back(result: Any, stage: str) -> None:
    if result is not None:
        raise TypeError(f"Spark stage '{stage}': a job of several tasks' batches gives no rows back, got "
                        f"{type(result).__name__}")
