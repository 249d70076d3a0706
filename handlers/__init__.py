"""Error handlers: each decides with an answer; the engine acts on it."""

from handlers.context import ErrorContext
from handlers.dead_letter import DeadLetter, dead_letter
from handlers.deserialization import (
    DeserializationExceptionHandler,
    DeserializationHandlerResponse,
    LogAndContinueExceptionHandler,
    LogAndFailExceptionHandler,
    LogAndPauseExceptionHandler,
)
from handlers.processing import (
    LogAndContinueProcessingExceptionHandler,
    LogAndFailProcessingExceptionHandler,
    LogAndPauseProcessingExceptionHandler,
    ProcessingExceptionHandler,
    ProcessingHandlerResponse,
)
from handlers.responses import Answer, StreamThreadExceptionResponse
from handlers.uncaught import (
    StreamsUncaughtExceptionHandler,
    replace_thread,
    shutdown_application,
    shutdown_client,
)

__all__ = [
    "Answer",
    "DeadLetter",
    "DeserializationExceptionHandler",
    "DeserializationHandlerResponse",
    "ErrorContext",
    "LogAndContinueExceptionHandler",
    "LogAndContinueProcessingExceptionHandler",
    "LogAndFailExceptionHandler",
    "LogAndFailProcessingExceptionHandler",
    "LogAndPauseExceptionHandler",
    "LogAndPauseProcessingExceptionHandler",
    "ProcessingExceptionHandler",
    "ProcessingHandlerResponse",
    "StreamThreadExceptionResponse",
    "StreamsUncaughtExceptionHandler",
    "dead_letter",
    "replace_thread",
    "shutdown_application",
    "shutdown_client",
]
