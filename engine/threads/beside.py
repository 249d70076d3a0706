"""Work a stream thread's poll loop hands to a task beside it: a commit, the lag metric's lookup.

The poll loop must never wait on the broker for these (a commit waits for acks and the group, a
ListOffsets request for the fetch in flight on its connection): records arriving meanwhile would
wait with it. So each kind of job has one task of its own for the thread's life, started with the
poll loop, which the loop only signals. One task, not one per run: a run is one at a time anyway,
and a task spawned as the thread's loop shuts down may never start (its coroutine is then never
awaited).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from streamloop.stray_cancel import StrayCancellationError, reraise_stray

__all__ = ["BesideJob"]


class BesideJob:
    """Runs ``job`` each time the poll loop asks for it, one run at a time (this loop only)."""

    def __init__(self, job: Callable[[], Awaitable[None]], what: str = "a job beside the polls") -> None:
        self._job = job
        self.what = what
        self._wanted = anyio.Event()
        self.busy = False
        """Asked for and not finished: the poll loop asks again only after it."""

    def request(self) -> bool:
        """Ask for a run; False while one is asked for or running."""
        if self.busy:
            return False
        self.busy = True
        self._wanted.set()
        return True

    async def serve(self) -> None:
        """The job's task: until cancelled with the thread's task group."""
        while True:
            await self._wanted.wait()
            self._wanted = anyio.Event()
            try:
                # A cancellation no scope asked for would end the thread's whole task group
                # silently: it fails the thread instead (streamloop.stray_cancel).
                with reraise_stray(lambda exc: StrayCancellationError(f"{self.what} was cancelled from inside")):
                    await self._job()
            finally:
                self.busy = False
