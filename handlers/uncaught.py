"""The streams uncaught-exception handler (KIP-671)."""

from __future__ import annotations

from collections.abc import Callable

from streamloop.handlers.responses import StreamThreadExceptionResponse

StreamsUncaughtExceptionHandler = Callable[[BaseException], StreamThreadExceptionResponse]
"""Called on the failing stream thread, while it is still alive, with the exception."""


def replace_thread(_exc: BaseException) -> StreamThreadExceptionResponse:
    return StreamThreadExceptionResponse.REPLACE_THREAD


def shutdown_client(_exc: BaseException) -> StreamThreadExceptionResponse:
    return StreamThreadExceptionResponse.SHUTDOWN_CLIENT


def shutdown_application(_exc: BaseException) -> StreamThreadExceptionResponse:
    return StreamThreadExceptionResponse.SHUTDOWN_APPLICATION
