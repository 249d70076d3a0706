"""Error handlers: each decides with an answer; the engine acts on it."""

from streamloop.handlers.context import ErrorContext
from streamloop.handlers.dead_letter import DeadLetter, dead_letter
from streamloop.handlers.deserialization import (
    DeserializationExceptionHandler,
    DeserializationHandlerResponse,
    LogAndContinueExceptionHandler,
    LogAndFailExceptionHandler,
    LogAndPauseExceptionHandler,
)
from streamloop.handlers.processing import (
    LogAndContinueProcessingExceptionHandler,
    LogAndFailProcessingExceptionHandler,
    LogAndPauseProcessingExceptionHandler,
    LogAndRetryProcessingExceptionHandler,
    ProcessingExceptionHandler,
    ProcessingHandlerResponse,
)
from streamloop.handlers.responses import Answer, StreamThreadExceptionResponse
from streamloop.handlers.uncaught import (
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
    "LogAndRetryProcessingExceptionHandler",
    "ProcessingExceptionHandler",
    "ProcessingHandlerResponse",
    "StreamThreadExceptionResponse",
    "StreamsUncaughtExceptionHandler",
    "dead_letter",
    "replace_thread",
    "shutdown_application",
    "shutdown_client",
]
