"""``BesideJob``: the poll loop's jobs run in a task of their own, one run per request, one at a time."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from streamloop.threads.beside import BesideJob

pytestmark = pytest.mark.asyncio


async def test_a_request_runs_the_job_once_and_none_is_taken_while_it_runs() -> None:
    runs: list[int] = []
    release = anyio.Event()

    async def job() -> None:
        runs.append(len(runs))
        await release.wait()

    beside = BesideJob(job)
    async with anyio.create_task_group() as group:
        group.start_soon(beside.serve)
        assert beside.request()
        with anyio.fail_after(5):
            while not runs:
                await anyio.lowlevel.checkpoint()
        assert not beside.request() and beside.busy  # one at a time
        release.set()
        with anyio.fail_after(5):
            while beside.busy:
                await anyio.lowlevel.checkpoint()
        assert runs == [0]
        release = anyio.Event()
        assert beside.request()
        with anyio.fail_after(5):
            while len(runs) < 2:
                await anyio.lowlevel.checkpoint()
        release.set()
        group.cancel_scope.cancel()
    assert runs == [0, 1]


async def test_a_job_cancelled_from_inside_fails_instead_of_cancelling_the_group_silently() -> None:
    """A library that cancels a task of its own and raises it here (streamloop.stray_cancel): the
    serving task fails with an error naming the job, which its task group then raises."""
    import asyncio

    from streamloop.stray_cancel import StrayCancellationError

    async def job() -> None:
        own = asyncio.ensure_future(asyncio.sleep(10))
        await asyncio.sleep(0)
        own.cancel()
        await asyncio.gather(own)

    beside = BesideJob(job, "lag lookups")
    with pytest.raises(BaseExceptionGroup) as failed:
        async with anyio.create_task_group() as group:
            group.start_soon(beside.serve)
            beside.request()
    error = failed.value.exceptions[0]
    assert isinstance(error, StrayCancellationError) and "lag lookups" in str(error)
    assert not beside.busy
