"""Loop-safe commands into a stream thread's event loop: the one place that crosses threads.

Submitting never waits for the target loop. anyio's ``BlockingPortal`` waits until the
loop has accepted a task (``start_task_soon`` blocks on the loop's callback): a loop busy
in a plain processor, or blocked on a lock the caller holds (a handler adding a thread
while another thread removes it), would stall or deadlock the caller. So the command is
handed over with the loop's thread-safe callback, which only enqueues, and the caller
gets a future; ``call`` waits on that future for at most its timeout. A caller on the
stream thread itself (a processor or a handler calling back into the client) cannot wait
on its own loop: ``call`` refuses to.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from anyio.abc import TaskGroup

from streamloop.stray_cancel import fail_stray

T = TypeVar("T")


class CommandRejected(RuntimeError):
    """The target loop is not running (not started yet, or already stopped)."""


class CommandChannel:
    """Bound to one stream thread's loop once it runs (``open``) until it stops (``close``)."""

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._loop: asyncio.AbstractEventLoop | None = None  # for call_soon_threadsafe (module docstring)
        self._task_group: TaskGroup | None = None
        self._loop_thread: int | None = None
        self._lock = threading.Lock()
        # Submitted but not started yet: rejected at close, so no caller waits on a dead loop.
        self._pending: set[concurrent.futures.Future[Any]] = set()

    def open(self, task_group: TaskGroup) -> None:
        """Caller: the stream thread, on its loop, inside ``task_group``."""
        with self._lock:
            self._loop = asyncio.get_running_loop()  # the loop object: its non-blocking call_soon_threadsafe
            self._task_group = task_group
            self._loop_thread = threading.get_ident()

    def close(self) -> None:
        """Caller: the stream thread, on its loop, when it stops taking commands."""
        with self._lock:
            self._loop = None
            self._task_group = None
            pending, self._pending = self._pending, set()
        for future in pending:
            if future.set_running_or_notify_cancel():
                future.set_exception(CommandRejected(f"{self._owner} stopped before running the command"))

    @property
    def on_loop_thread(self) -> bool:
        return threading.get_ident() == self._loop_thread

    def submit(self, fn: Callable[..., Awaitable[T]], *args: Any) -> concurrent.futures.Future[T]:
        """Run ``fn(*args)`` on the loop; never blocks. Raises ``CommandRejected`` if the loop is gone."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        async def run() -> None:
            try:
                future.set_result(await fn(*args))
            except BaseException as exc:  # handed to the waiter
                future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise  # cancellation (the loop is stopping) goes on up

        def start() -> None:  # on the loop
            with self._lock:
                if future not in self._pending:
                    return  # rejected by close() before the loop got to it
                self._pending.discard(future)
                group = self._task_group
            if not future.set_running_or_notify_cancel():
                return
            if group is None:
                future.set_exception(CommandRejected(f"{self._owner} stopped before running the command"))
                return
            group.start_soon(fail_stray, f"a command on {self._owner}", run)

        with self._lock:
            loop = self._loop
            if loop is None:
                raise CommandRejected(f"{self._owner} is not running")
            self._pending.add(future)
        if self.on_loop_thread:
            start()
            return future
        try:
            loop.call_soon_threadsafe(start)
        except RuntimeError as exc:  # the loop closed meanwhile
            with self._lock:
                self._pending.discard(future)
            raise CommandRejected(f"{self._owner} is not running: {exc}") from exc
        return future

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any, timeout: float | None = None) -> T:
        """Run ``fn(*args)`` on the loop and wait for its result (not from the loop itself).

        Raises ``TimeoutError`` if it is not done within ``timeout`` s.
        """
        if self.on_loop_thread:
            raise RuntimeError(f"{self._owner}: a command cannot wait for its own loop")
        return self.submit(fn, *args).result(timeout)
