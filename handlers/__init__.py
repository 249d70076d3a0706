"""Error handlers: each decides with an answer; the engine acts on it."""

from handlers.responses import StreamThreadExceptionResponse
from handlers.uncaught import (
    StreamsUncaughtExceptionHandler,
    replace_thread,
    shutdown_application,
    shutdown_client,
)

__all__ = [
    "StreamThreadExceptionResponse",
    "StreamsUncaughtExceptionHandler",
    "replace_thread",
    "shutdown_application",
    "shutdown_client",
]
