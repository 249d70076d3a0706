"""``CommandChannel``: commands into a loop running in another OS thread, and from that loop itself."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import anyio.lowlevel
import pytest
from anyio.abc import TaskGroup
from anyio.from_thread import BlockingPortal, start_blocking_portal

from streamloop.threads.commands import CommandChannel, CommandRejected

DEADLINE_S = 10.0


@dataclass
class LoopThread:
    """An anyio loop running in its own OS thread, with a portal and a task group, as a stream thread has."""

    portal: BlockingPortal
    task_group: TaskGroup
    ident: int


@asynccontextmanager
async def task_group_on_loop() -> AsyncIterator[TaskGroup]:
    """A task group made and entered on the loop (it cannot be made outside one)."""
    async with anyio.create_task_group() as task_group:
        yield task_group


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    with start_blocking_portal("asyncio") as portal, \
            portal.wrap_async_context_manager(task_group_on_loop()) as task_group:
        ident = portal.call(threading.get_ident)
        yield LoopThread(portal, task_group, ident)


@pytest.fixture
def channel(loop_thread: LoopThread) -> Iterator[CommandChannel]:
    channel = CommandChannel("stream-thread [t-1]")
    # As the stream thread does: open on its own loop, inside its task group.
    loop_thread.portal.call(channel.open, loop_thread.task_group)
    yield channel
    channel.close()


async def double(value: int) -> int:
    await anyio.lowlevel.checkpoint()
    return value * 2


async def fail(message: str) -> None:
    await anyio.lowlevel.checkpoint()
    raise ValueError(message)


async def current_thread() -> int:
    return threading.get_ident()


# -- from another thread --------------------------------------------------------------------


def test_submit_from_another_thread_returns_a_future_of_the_result(channel: CommandChannel) -> None:
    future = channel.submit(double, 21)

    assert future.result(DEADLINE_S) == 42


def test_submitted_command_runs_on_the_loop_thread(channel: CommandChannel, loop_thread: LoopThread) -> None:
    assert channel.submit(current_thread).result(DEADLINE_S) == loop_thread.ident


def test_submit_from_another_thread_passes_the_exception_to_the_future(channel: CommandChannel) -> None:
    future = channel.submit(fail, "boom")

    with pytest.raises(ValueError, match="boom"):
        future.result(DEADLINE_S)


def test_call_from_another_thread_returns_the_result(channel: CommandChannel) -> None:
    assert channel.call(double, 5, timeout=DEADLINE_S) == 10


def test_call_from_another_thread_raises_the_commands_exception(channel: CommandChannel) -> None:
    with pytest.raises(ValueError, match="boom"):
        channel.call(fail, "boom", timeout=DEADLINE_S)


def test_channel_is_not_on_the_loop_thread_from_another_thread(channel: CommandChannel) -> None:
    assert channel.on_loop_thread is False


# -- from the loop thread itself ---------------------------------------------------------------


def test_channel_knows_when_it_is_called_from_its_loop_thread(
    channel: CommandChannel, loop_thread: LoopThread
) -> None:
    assert loop_thread.portal.call(lambda: channel.on_loop_thread) is True


def test_submit_from_the_loop_thread_schedules_the_command_and_returns_at_once(
    channel: CommandChannel, loop_thread: LoopThread
) -> None:
    def submit_on_loop() -> tuple[bool, object]:
        future = channel.submit(double, 4)
        return future.done(), future

    done_at_once, future = loop_thread.portal.call(submit_on_loop)

    assert done_at_once is False
    assert future.result(DEADLINE_S) == 8  # type: ignore[attr-defined]


def test_command_submitted_from_the_loop_completes_while_the_loop_awaits_it(
    channel: CommandChannel, loop_thread: LoopThread
) -> None:
    async def submit_and_await() -> int:
        future = channel.submit(double, 8)
        with anyio.fail_after(DEADLINE_S):
            return await asyncio.wrap_future(future)

    assert loop_thread.portal.call(submit_and_await) == 16


def test_command_submitted_from_the_loop_passes_its_exception_to_the_future(
    channel: CommandChannel, loop_thread: LoopThread
) -> None:
    future = loop_thread.portal.call(lambda: channel.submit(fail, "from the loop"))

    with pytest.raises(ValueError, match="from the loop"):
        future.result(DEADLINE_S)


def test_call_from_the_loop_thread_raises_runtime_error(channel: CommandChannel, loop_thread: LoopThread) -> None:
    with pytest.raises(RuntimeError, match="stream-thread \\[t-1\\]: a command cannot wait for its own loop"):
        loop_thread.portal.call(lambda: channel.call(double, 1))


# -- when the loop is not running ------------------------------------------------------------------


def test_submit_before_open_raises_command_rejected() -> None:
    with pytest.raises(CommandRejected, match="stream-thread \\[t-9\\] is not running"):
        CommandChannel("stream-thread [t-9]").submit(double, 1)


def test_call_before_open_raises_command_rejected() -> None:
    with pytest.raises(CommandRejected):
        CommandChannel("stream-thread [t-9]").call(double, 1, timeout=DEADLINE_S)


def test_submit_after_close_raises_command_rejected(channel: CommandChannel) -> None:
    channel.close()

    with pytest.raises(CommandRejected, match="is not running"):
        channel.submit(double, 1)


def test_submit_after_the_loop_stopped_raises_command_rejected() -> None:
    channel = CommandChannel("stream-thread [t-1]")
    with start_blocking_portal("asyncio") as portal, \
            portal.wrap_async_context_manager(task_group_on_loop()) as task_group:
        portal.call(channel.open, task_group)

    # The loop has ended but nobody closed the channel.
    with pytest.raises(CommandRejected, match="is not running"):
        channel.submit(double, 1)


def test_command_rejected_is_a_runtime_error() -> None:
    assert issubclass(CommandRejected, RuntimeError)


def test_submit_never_waits_for_a_blocked_loop(channel: CommandChannel, loop_thread: LoopThread) -> None:
    """The loop is stuck in a plain (blocking) step, as a stream thread in a processor or waiting
    for a lock the submitter holds: submitting returns at once, and the command runs once the
    loop is free. (anyio's portal would wait for the loop to accept the task: a deadlock.)"""
    release, stuck = _block_the_loop(loop_thread)
    started = time.monotonic()
    future = channel.submit(double, 21)
    assert time.monotonic() - started < 0.5
    with pytest.raises(concurrent.futures.TimeoutError):
        future.result(0.2)
    release.set()
    assert future.result(5) == 42
    stuck.result(5)


def test_a_command_not_started_when_the_channel_closes_is_rejected(loop_thread: LoopThread) -> None:
    channel = CommandChannel("stream-thread [t-2]")
    loop_thread.portal.call(channel.open, loop_thread.task_group)
    release, stuck = _block_the_loop(loop_thread)
    future = channel.submit(double, 1)
    channel.close()
    release.set()
    with pytest.raises(CommandRejected):
        future.result(5)
    stuck.result(5)


def _block_the_loop(loop_thread: LoopThread) -> tuple[threading.Event, concurrent.futures.Future[None]]:
    """Park the loop in a plain (blocking) step until the returned event is set."""
    blocked, release = threading.Event(), threading.Event()

    async def block() -> None:
        blocked.set()
        release.wait(10)  # on the loop itself: the loop can run nothing else meanwhile

    stuck = loop_thread.portal.start_task_soon(block)
    assert blocked.wait(5)
    return release, stuck


def test_a_command_rejected_at_close_is_not_started_later(loop_thread: LoopThread,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """The loop gets to a command submitted before close() only after close() rejected it: it is
    left alone (no second completion of its future, which concurrent.futures logs as CRITICAL)."""
    channel = CommandChannel("stream-thread [t-3]")
    loop_thread.portal.call(channel.open, loop_thread.task_group)
    release, stuck = _block_the_loop(loop_thread)
    future = channel.submit(double, 1)
    channel.close()
    release.set()
    stuck.result(5)
    loop_thread.portal.call(double, 0)  # queued after the start callback (FIFO): that one has run
    with pytest.raises(CommandRejected):
        future.result(5)
    assert [r for r in caplog.records if r.levelname == "CRITICAL"] == []
