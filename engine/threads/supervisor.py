"""Applies the uncaught-exception handler's answer when a stream thread dies (KIP-671).

Runs on the dying thread, after its loop has ended and before it is DEAD, so
the thread still holds its name: a replacement gets another index.
A thread that fails again and again (a poison record) is replaced after a
growing back-off instead of in a tight loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from streamloop.handlers.responses import StreamThreadExceptionResponse

if TYPE_CHECKING:
    from streamloop.threads.stream_thread import StreamThread

log = logging.getLogger(__name__)

Response = StreamThreadExceptionResponse


class ClosingSignal(Protocol):
    """The client's closing, as the supervisor waits for it (a ``threading.Event`` fits)."""

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` s; True once the client is closing."""
        ...


class ReplacementBackoff:
    """Delay before the n-th replacement in a row: none for the first, then doubling to a cap.

    A run of failures ends when a thread lived longer than ``reset_after_s``.
    """

    def __init__(self, base_s: float, cap_s: float, reset_after_s: float = 60.0) -> None:
        self._base = base_s
        self._cap = cap_s
        self._reset_after = reset_after_s
        self._streak = 0
        self._last_failure: float | None = None
        self._lock = threading.Lock()

    def next_delay(self, now: float) -> float:
        with self._lock:
            if self._last_failure is not None and now - self._last_failure > self._reset_after:
                self._streak = 0
            self._last_failure = now
            self._streak += 1
            if self._streak == 1:
                return 0.0
            return float(min(self._cap, self._base * 2 ** (self._streak - 2)))


class Supervisor:
    """Caller: ``StreamThread._main`` through the client's failure callback."""

    def __init__(
        self,
        handler: Callable[[BaseException], Response] | None,
        replace: Callable[[StreamThread], str | None],
        shutdown_thread: Callable[[StreamThread], None],
        shutdown_client: Callable[[], None],
        shutdown_application: Callable[[StreamThread], None],
        closing: ClosingSignal,
        backoff: ReplacementBackoff,
    ) -> None:
        self.handler = handler
        self._replace = replace
        self._shutdown_thread = shutdown_thread
        self._shutdown_client = shutdown_client
        self._shutdown_application = shutdown_application
        self._closing = closing
        self._backoff = backoff

    def decide(self, thread: StreamThread, exc: BaseException) -> Response:
        if self.handler is None:
            return Response.SHUTDOWN_CLIENT
        try:
            response = self.handler(exc)
        except Exception as handler_exc:  # a broken handler means shut the client
            log.error("stream-thread [%s] The uncaught exception handler raised %r while handling %r; "
                      "shutting down the client", thread.name, handler_exc, exc, exc_info=handler_exc)
            return Response.SHUTDOWN_CLIENT
        if not isinstance(response, Response):
            log.error("stream-thread [%s] The uncaught exception handler returned %r, not a "
                      "StreamThreadExceptionResponse; shutting down the client", thread.name, response)
            return Response.SHUTDOWN_CLIENT
        return response

    def on_failure(self, thread: StreamThread, exc: BaseException) -> Response:
        response = self.decide(thread, exc)
        # The thread's failure report logged the error and its traceback just before.
        log.error("stream-thread [%s] Thread failed with %s; the uncaught exception handler answered %s",
                  thread.name, type(exc).__name__, response.name)
        if response is Response.REPLACE_THREAD:
            delay = self._backoff.next_delay(time.monotonic())
            if delay > 0:
                log.warning("stream-thread [%s] Threads keep failing; replacing this one in %.1f s",
                            thread.name, delay)
                if self._closing.wait(delay):
                    return response
            replacement = self._replace(thread)
            if replacement is not None:
                log.info("stream-thread [%s] Replaced by %s", thread.name, replacement)
        elif response is Response.SHUTDOWN_THREAD:
            self._shutdown_thread(thread)
        elif response is Response.SHUTDOWN_CLIENT:
            self._shutdown_client()
        else:
            self._shutdown_application(thread)
        return response
