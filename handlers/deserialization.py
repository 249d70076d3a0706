"""Deserialization exception handlers: what to do with a record whose bytes cannot be read.

``FAIL`` fails the stream thread (its uncaught-exception handler decides next; the
thread's failure report logs the traceback, so a handler that answers ``FAIL`` need not);
``CONTINUE`` drops the record, logs it, counts it, and its offset is committed past;
``PAUSE`` stops only that task: it stays assigned, nothing of it is fetched or
processed, its last good position is committed (so the committed offset is the
failed record's), and ``KafkaStreams.resume(task_id)`` starts it again from the
failed record (or past it with ``skip=True``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from streamloop.handlers.context import ErrorContext

# ``as`` re-exports the answers under their Kafka Streams name, importable from here as before.
from streamloop.handlers.responses import DeserializationHandlerResponse as DeserializationHandlerResponse

log = logging.getLogger(__name__)


@runtime_checkable
class DeserializationExceptionHandler(Protocol):
    def configure(self, config: Mapping[str, Any]) -> None: ...

    def handle(self, context: ErrorContext, record: Any, exception: BaseException) -> DeserializationHandlerResponse:
        """``record`` is the fetched record (raw bytes); the answer says what the engine does."""


class _Configurable:
    def configure(self, config: Mapping[str, Any]) -> None:
        """Nothing to configure."""


class LogAndFailExceptionHandler(_Configurable):
    """The default: log the error in one line, then fail the thread (whose failure report logs the traceback)."""

    def handle(self, context: ErrorContext, record: Any, exception: BaseException) -> DeserializationHandlerResponse:
        log.error("Exception caught during deserialization, task %s, topic %s, partition %s, offset %s; "
                  "failing: %s: %s", context.task_id, context.topic, context.partition, context.offset,
                  type(exception).__name__, exception)
        return DeserializationHandlerResponse.FAIL


class LogAndContinueExceptionHandler(_Configurable):
    """Log the error and drop the record."""

    def handle(self, context: ErrorContext, record: Any, exception: BaseException) -> DeserializationHandlerResponse:
        log.warning("Exception caught during deserialization, task %s, topic %s, partition %s, offset %s; "
                    "skipping the record", context.task_id, context.topic, context.partition, context.offset,
                    exc_info=exception)
        return DeserializationHandlerResponse.CONTINUE


class LogAndPauseExceptionHandler(_Configurable):
    """Log the error and pause the task until ``KafkaStreams.resume(task_id)``."""

    def handle(self, context: ErrorContext, record: Any, exception: BaseException) -> DeserializationHandlerResponse:
        log.error("Exception caught during deserialization, task %s, topic %s, partition %s, offset %s; "
                  "pausing the task", context.task_id, context.topic, context.partition, context.offset,
                  exc_info=exception)
        return DeserializationHandlerResponse.PAUSE
