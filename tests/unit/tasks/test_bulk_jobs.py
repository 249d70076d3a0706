"""A Spark job shared by several tasks (``streamloop.tasks.bulk_jobs``) past ``spark.batch.shared.max.ms``:
a job that only computes rows is given up, each part then runs alone; a ``to_spark`` job, which writes
as it runs, is waited for (given up, its write could still land beside the parts' own)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import pytest

from streamloop.tasks.bulk_jobs import JobSplit, StageJobs
from streamloop.testing import eventually_async

pytestmark = pytest.mark.asyncio


class HeldStage:
    """The stage side ``StageJobs`` uses; each job runs until ``release`` is set."""

    name = "held"
    max_bytes = 0
    eager = False

    def __init__(self, writes: bool) -> None:
        self.writes = writes
        self.max_shared_ms = 1
        self.release = anyio.Event()
        self.ran = 0

    def batching(self) -> tuple[int, float, int]:
        return 2, 0.0, 2  # a job seals at two records

    async def run_parts(self, parts: Sequence[Any]) -> list[Any]:
        self.ran += 1
        await self.release.wait()
        return [f"rows of part {i}" for i in range(len(parts))]


async def shared_job_outcomes(stage: HeldStage) -> tuple[list[Any], StageJobs]:
    jobs = StageJobs(stage)  # type: ignore[arg-type]  # the part of a SparkBatchStage it uses
    parts = [jobs.part_for(owner, lambda: None, None, None, None) for owner in ("task a", "task b")]  # type: ignore[arg-type]
    outcomes: list[Any] = [None, None]
    assert parts[0] is not None and parts[1] is not None and parts[0].job is parts[1].job
    jobs.added(parts[0].job, 2, 0)  # full: sealed

    async def settle(index: int) -> None:
        part = parts[index]
        assert part is not None
        outcomes[index] = await jobs.settle(part)

    async with anyio.create_task_group() as group:
        for index in (0, 1):
            group.start_soon(settle, index)
        # Past shared.max.ms the job stops holding a slot of the stage: only then is it let go.
        await eventually_async(lambda: jobs._in_flight == 0, 10, "the job past spark.batch.shared.max.ms")
        stage.release.set()
    return outcomes, jobs


async def test_a_shared_job_that_only_computes_rows_is_given_up_past_shared_max_ms() -> None:
    outcomes, _ = await shared_job_outcomes(HeldStage(writes=False))
    assert all(isinstance(outcome, JobSplit) for outcome in outcomes)  # each part runs alone next


async def test_a_shared_job_that_writes_is_waited_for_past_shared_max_ms() -> None:
    stage = HeldStage(writes=True)
    outcomes, _ = await shared_job_outcomes(stage)
    assert outcomes == ["rows of part 0", "rows of part 1"]
    assert stage.ran == 1
