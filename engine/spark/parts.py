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
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamloop.records import ConsumerRecord
from streamloop.serdes import Serde

from .frames import check_frame, check_names, create_frame, to_rows, to_table
from .session import LOCAL_RELATION_KEY

if TYPE_CHECKING:
    from streamloop.processors.nodes import SinkNode

    from .timing import JobClock

log = logging.getLogger(__name__)

# A batch's work on the worker thread: the batch as a DataFrame in, rows out (None for a sink).
BatchJob = Callable[[Any], "list[dict[str, Any]] | None"]


# What ``row_wise`` marks a function with.
ROW_WISE = "__streamloop_row_wise__"


def row_wise(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Mark a ``spark_batch`` function as row-wise: each row it returns comes from one row of the
    frame it is given, through projections, filters, explodes, Python UDFs and broadcast joins
    with static frames (no aggregate, sort, shuffle, limit or union of the frame).

    The bulk path then frames a job's parts as one DataFrame (a partition per Arrow batch of each
    part) and applies ``fn`` once: one analysis, one plan and one action per job instead of one
    application per task and a union. The function then sees the records of all the thread's
    tasks in the job at once, so it must not depend on which rows share a frame; each output row
    still goes back to its own task, in the order ``fn`` gives it. A job whose plan is not
    row-wise after all (checked on each job's physical plan) runs each part on its own, as
    without the mark, and a warning says so once per stage."""
    try:
        setattr(fn, ROW_WISE, True)
        return fn
    except (AttributeError, TypeError):  # a bound method, a builtin: wrap it
        @functools.wraps(fn)
        def marked(frame: Any) -> Any:
            return fn(frame)

        setattr(marked, ROW_WISE, True)
        return marked


class TransformJob:
    """The job of ``spark_batch``: ``fn(DataFrame) -> DataFrame``, its rows collected. The function
    is kept apart so that a job of several tasks' parts (``streamloop.spark.parts``) can apply it to
    each part and collect them all in one Spark job."""

    __slots__ = ("fn", "row_wise", "stage")

    def __init__(self, fn: Callable[[Any], Any], stage: str) -> None:
        self.fn = fn
        self.stage = stage
        # Cleared when a job's plan turns out not to be row-wise: from then on parts run alone.
        self.row_wise = bool(getattr(fn, ROW_WISE, False))

    def __call__(self, frame: Any, clock: JobClock | None = None) -> list[dict[str, Any]]:
        return to_rows(self.fn(frame), self.stage, clock)


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


def run_parts(job: BatchJob, frames: Sequence[Any], stage: str,
              clock: JobClock | None = None) -> list[list[dict[str, Any]] | None]:
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
        if clock is not None:
            clock.mark("execute")
        return rows
    outs = []
    for index, frame in present:
        out = job.fn(frame)
        check_frame(out, stage)
        outs.append((index, out))
    if len(outs) == 1 or not _same_columns([out for _index, out in outs]):
        for index, out in outs:
            rows[index] = to_rows(out, stage, clock)
        return rows
    from pyspark.sql import functions as F

    table = to_table(_union([out.withColumn(PART_COLUMN, F.lit(index)) for index, out in outs]), stage, clock)
    check_names([name for name in table.column_names if name != PART_COLUMN], stage)
    import pyarrow.compute as pc

    tags = table.column(PART_COLUMN)
    rest = table.drop_columns([PART_COLUMN])
    for index, _out in outs:
        rows[index] = rest.filter(pc.equal(tags, index)).to_pylist()
    if clock is not None:
        clock.mark("rows")
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


def run_combined(session: Any, job: TransformJob, tables: Sequence[Any], schema: Any, stage: str,
                 clock: JobClock | None = None) -> list[list[dict[str, Any]] | None] | None:
    """Run a row-wise ``job`` (``row_wise``) over the parts' Arrow tables (None: nothing of the
    part to run) as one frame: one ``createDataFrame``, one application of the function, one
    action; each part's rows, as ``run_parts`` gives them. None when it cannot be done that way
    (fewer than two parts, parts of different columns, a plan that is not row-wise): the caller
    then runs the parts as ``run_parts`` does.

    Each part's rows are told apart by the Spark partition they come from: the frame is made of
    an RDD with one partition per Arrow batch (``spark.sql.execution.arrow.localRelationThreshold``
    0; a local relation would be cut into partitions by row count), each part's table in batches
    of its own, and a row-wise plan keeps every row in the partition it was read from, in order.
    """
    present = [(index, table) for index, table in enumerate(tables) if table is not None]
    if len(present) < 2 or any(table.schema != present[0][1].schema for _index, table in present[1:]):
        return None
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql import functions as F

    size = _batch_size(session)
    if size is None:
        if job.row_wise:
            job.row_wise = False
            log.warning("Spark stage '%s': its function is marked row_wise but the session has %s set above 0: "
                        "each task's part runs on its own", stage, LOCAL_RELATION_KEY)
        return None
    batches: list[Any] = []
    bounds: list[tuple[int, int, int]] = []  # part index, its first partition, the one past its last
    for index, table in present:
        first = len(batches)
        batches.extend(batch for batch in table.to_batches(max_chunksize=size) if batch.num_rows)
        bounds.append((index, first, len(batches)))
    combined = pa.Table.from_batches(batches, schema=present[0][1].schema)
    if clock is not None:
        clock.mark("frame")
    frame = create_frame(session, combined, schema, clock)
    out = job.fn(frame)
    check_frame(out, stage)
    tagged = out.withColumn(PART_COLUMN, F.spark_partition_id())
    if clock is not None:
        clock.mark("analyze")
    problem = not_row_wise(tagged)
    if clock is not None:
        clock.mark("plan")
    if problem is not None:
        job.row_wise = False
        log.warning("Spark stage '%s': its function is marked row_wise but %s; each task's part now runs on "
                    "its own", stage, problem)
        return None
    table = to_table(tagged, stage, clock)
    check_names([name for name in table.column_names if name != PART_COLUMN], stage)
    tags = table.column(PART_COLUMN)
    rest = table.drop_columns([PART_COLUMN])
    rows: list[list[dict[str, Any]] | None] = [None] * len(tables)
    for index, first, end in bounds:
        rows[index] = rest.filter(pc.and_(pc.greater_equal(tags, first), pc.less(tags, end))).to_pylist()
    if clock is not None:
        clock.mark("rows")
    return rows


def _batch_size(session: Any) -> int | None:
    """Records per Arrow batch ``createDataFrame`` cuts a table into: each part is cut to that
    size beforehand, so that no batch holds records of two parts. None when the session makes
    local relations of Arrow tables (which are cut by rows, not batches). Read each job (two
    py4j calls), so a change of the session's settings takes effect."""
    conf = session.conf
    if int(conf.get(LOCAL_RELATION_KEY, "0")) > 0:
        return None
    return max(1, int(conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", "10000")))


# Physical operators that keep each row in its partition, in order, and add no rows from
# elsewhere (outside a broadcast, whose side is the static data of a join).
_ROW_WISE_NODES = ("AdaptiveSparkPlan", "Project", "Filter", "BroadcastHashJoin", "BroadcastNestedLoopJoin",
                   "Generate", "BatchEvalPython", "ArrowEvalPython", "WholeStageCodegen", "InputAdapter",
                   "ColumnarToRow", "RowToColumnar", "Scan ExistingRDD", "MapPartitions", "SerializeFromObject",
                   "DeserializeToObject", "Expand")
_SCAN = "Scan ExistingRDD"


def not_row_wise(frame: Any, scan: str = _SCAN) -> str | None:
    """Why ``frame``'s plan does not keep each of its input's rows in its partition (None: it
    does). Read from the physical plan's tree string (planning it, which its action then reuses):
    every operator outside a broadcast must be one of ``_ROW_WISE_NODES`` and the frame's scan
    (``scan``: by default the RDD scan of a partition per batch) the only leaf; a local
    relation's scan, cut by row count, is not one of them. What is below the scan (a persisted
    frame's own plan) is not looked at."""
    jdf = getattr(frame, "_jdf", None)
    if jdf is None:
        return "its plan cannot be read (Spark Connect)"
    execution = jdf.queryExecution()
    stack: list[tuple[int, bool]] = []  # (depth, inside a broadcast) of the current line's ancestors
    scans = 0
    for line in execution.executedPlan().toString().splitlines():
        text = line.lstrip(" :+-|")
        if not text:
            continue
        depth = len(line) - len(text)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        broadcast = bool(stack) and stack[-1][1]
        node = text.lstrip("*()0123456789 ")
        if node.startswith("BroadcastExchange") or node.startswith("ReusedExchange"):
            broadcast = True
        elif not broadcast:
            if node.startswith(scan):
                scans += 1
                broadcast = True  # its subtree is the scanned frame's: not part of the function's plan
            elif not node.startswith(_ROW_WISE_NODES):
                return f"its plan has {node.split(' ')[0].split('[')[0]}"
        stack.append((depth, broadcast))
    if scans != 1:
        return f"its plan reads {scans} frames outside broadcasts"
    return None
