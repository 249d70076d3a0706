"""Loop-safe commands into a stream thread's event loop: the one place that crosses threads.

A caller on another thread (a user's thread, a service's loop, another stream
thread) goes through the thread's anyio ``BlockingPortal``. A caller on the
stream thread itself (a processor or a handler calling back into the client)
cannot wait on its own loop: the command is scheduled on the loop's task group
and the returned future completes later; waiting on it from that thread would
deadlock, so ``CommandChannel.call`` refuses to.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from anyio.abc import TaskGroup
from anyio.from_thread import BlockingPortal

T = TypeVar("T")


class CommandRejected(RuntimeError):
    """The target loop is not running (not started yet, or already stopped)."""


class CommandChannel:
    """Bound to one stream thread's loop once it runs (``open``) until it stops (``close``)."""

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._portal: BlockingPortal | None = None
        self._task_group: TaskGroup | None = None
        self._loop_thread: int | None = None
        self._lock = threading.Lock()

    def open(self, portal: BlockingPortal, task_group: TaskGroup) -> None:
        """Caller: the stream thread, on its loop, once the portal runs."""
        with self._lock:
            self._portal = portal
            self._task_group = task_group
            self._loop_thread = threading.get_ident()

    def close(self) -> None:
        with self._lock:
            self._portal = None
            self._task_group = None

    @property
    def on_loop_thread(self) -> bool:
        return threading.get_ident() == self._loop_thread

    def submit(self, fn: Callable[..., Awaitable[T]], *args: Any) -> concurrent.futures.Future[T]:
        """Run ``fn(*args)`` on the loop; never blocks. Raises ``CommandRejected`` if the loop is gone."""
        with self._lock:
            portal, group = self._portal, self._task_group
        if portal is None or group is None:
            raise CommandRejected(f"{self._owner} is not running")
        if self.on_loop_thread:
            future: concurrent.futures.Future[T] = concurrent.futures.Future()

            async def run() -> None:
                if not future.set_running_or_notify_cancel():
                    return
                try:
                    future.set_result(await fn(*args))
                except BaseException as exc:  # noqa: BLE001 - handed to the waiter
                    future.set_exception(exc)

            group.start_soon(run)
            return future
        try:
            return portal.start_task_soon(fn, *args)
        except RuntimeError as exc:
            raise CommandRejected(f"{self._owner} is not running: {exc}") from exc

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any, timeout: float | None = None) -> T:
        """Run ``fn(*args)`` on the loop and wait for its result (not from the loop itself)."""
        if self.on_loop_thread:
            raise RuntimeError(f"{self._owner}: a command cannot wait for its own loop")
        return self.submit(fn, *args).result(timeout)
