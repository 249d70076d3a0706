"""Wait on a condition with a deadline, never for a fixed time."""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

T = TypeVar("T")


def eventually(condition: Callable[[], T], timeout: float = 10.0, what: str = "condition",
               interval: float = 0.01) -> T:
    """Poll ``condition`` until it returns something truthy; ``TimeoutError`` naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(f"Timed out after {timeout} s waiting for: {what}")
        time.sleep(interval)


async def eventually_async(condition: Callable[[], T | Awaitable[T]], timeout: float = 10.0,  # noqa: ASYNC109 - as eventually
                           what: str = "condition", interval: float = 0.01) -> T:
    """``eventually`` for an event loop: the condition may be a coroutine function."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(f"Timed out after {timeout} s waiting for: {what}")
        await anyio.sleep(interval)
