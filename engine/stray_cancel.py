"""Cancellation that no cancel scope asked for: a library's own, leaking into the engine's tasks.

aiokafka runs some requests in tasks of its own and gathers them (``end_offsets`` asks each
partition's leader in one); when it cancels one of those (a connection attempt past its timeout),
``asyncio.gather`` raises that ``CancelledError`` in the task that awaited the request, although
nothing cancelled that task. Left alone it is taken for a real cancellation: anyio's task group
then cancels every sibling without recording an error, and a stream thread ends silently, with no
failure reported and no handler asked (seen in a broker bounce: the lag metric's lookup of log ends).

``stray(exc)`` tells the two apart: a real cancellation of an asyncio task comes with a pending
cancel request (``Task.cancelling()``, which every anyio cancel scope makes), a stray one does not.
anyio has no call for this, hence asyncio's own. The transports turn a stray cancellation into their
retriable error (``reraise_stray``); what still reaches a task group's child is made an error there
(``fail_stray``: a stream thread's tasks and the work beside its polls, a task's record workers and
Spark batches, an exactly-once commit's per-task steps, a command), so that no work ends without
its failure being reported.

A stray cancellation can also land in the loop step where the caller's own deadline fires (aiokafka
bounds its requests by the same request timeout the engine bounds its lookups with). The task then
has a cancel request pending when the stray ``CancelledError`` arrives, so a check inside the scope
takes it for real; the scope withdraws its request on exit and, the error not being its own, lets
it through. ``bounded`` is the deadline for a client library's call: its check sits outside the
scope, where only a cancellation of the caller itself is still pending.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import anyio

__all__ = ["StrayCancellationError", "bounded", "fail_stray", "reraise_stray", "stray"]


class StrayCancellationError(RuntimeError):
    """A ``CancelledError`` that no cancel scope asked for ended ``what``; the original is ``__cause__``."""


def stray(exc: BaseException) -> bool:
    """Whether ``exc`` is a ``CancelledError`` raised in a task that nothing asked to cancel."""
    if not isinstance(exc, asyncio.CancelledError):
        return False
    task = asyncio.current_task()  # called while a coroutine handles the error: a loop runs
    return task is not None and task.cancelling() == 0


@contextmanager
def reraise_stray(error: Callable[[BaseException], BaseException]) -> Iterator[None]:
    """Inside: a stray cancellation is raised as ``error(cancellation)``; a real one goes on."""
    try:
        yield
    except asyncio.CancelledError as exc:
        if not stray(exc):
            raise
        raise error(exc) from exc


async def fail_stray(what: str, fn: Callable[..., Awaitable[object]], *args: object) -> None:
    """``await fn(*args)`` as a task group's child: a stray cancellation fails it (and so its group)
    with ``StrayCancellationError`` instead of cancelling the group without an error."""
    with reraise_stray(lambda _exc: StrayCancellationError(f"{what} was cancelled from inside")):
        await fn(*args)


@contextmanager
def bounded(seconds: float, what: str, *, shield: bool = False) -> Iterator[anyio.CancelScope]:
    """``anyio.move_on_after(seconds, shield=shield)`` around a client library's call: a stray
    cancellation, at the deadline or not, leaves it as ``StrayCancellationError`` (an ordinary
    error the caller handles as the call's failure)."""
    with reraise_stray(lambda _exc: StrayCancellationError(f"{what} was cancelled from inside")), \
            anyio.move_on_after(seconds, shield=shield) as scope:
        yield scope
