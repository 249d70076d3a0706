"""Processing exception handlers: what to do when a user processor raises on a record.

The answers mean what they mean for deserialization errors (``FAIL``,
``CONTINUE``, ``PAUSE``). ``CONTINUE`` drops the record from the failing
processor on; what was already forwarded downstream stays (as in KIP-1033).
``RETRY``, for processing only, runs the record again from its source after a
back-off, up to ``processing.retry.max.attempts`` attempts; then
``processing.retry.exhausted.answer`` applies (``ErrorContext.attempt`` tells a
handler which attempt failed). Timeouts never reach these handlers:
``task.timeout.ms`` retries them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from streamloop.handlers.context import ErrorContext

# ``as`` re-exports the answers under their Kafka Streams name, importable from here as before.
from streamloop.handlers.responses import ProcessingHandlerResponse as ProcessingHandlerResponse

log = logging.getLogger(__name__)


@runtime_checkable
class ProcessingExceptionHandler(Protocol):
    def configure(self, config: Mapping[str, Any]) -> None: ...

    def handle(self, context: ErrorContext, record: Any, exception: BaseException) -> ProcessingHandlerResponse: ...


class _Configurable:
    def configure(self, config: Mapping[str, Any]) -> None:
        """Nothing to configure."""


class LogAndFailProcessingExceptionHandler(_Configurable):
    """The default: log the error in one line, then fail the thread (whose failure report logs the traceback)."""

    def handle(self, context: ErrorContext, record: Any, exception: BaseException) -> ProcessingHandlerResponse:
        log.error("Processor %s failed, task %s, topic %s, partition %s, offset %s; failing: %s: %s",
                  context.processor_node, context.task_id, context.topic, context.partition, context.offset,
                  type(exception).__name__, exception)
        return ProcessingHandlerResponse.FAIL


class LogAndContinueProcessingExceptionHandler(_Configurable):
    def handle(self, context: ErrorContext, record: Any, exception: BaseException) -> ProcessingHandlerResponse:
        log.warning("Processor %s failed, task %s, topic %s, partition %s, offset %s; skipping the record",
                    context.processor_node, context.task_id, context.topic, context.partition, context.offset,
                    exc_info=exception)
        return ProcessingHandlerResponse.CONTINUE


class LogAndPauseProcessingExceptionHandler(_Configurable):
    def handle(self, context: ErrorContext, record: Any, exception: BaseException) -> ProcessingHandlerResponse:
        log.error("Processor %s failed, task %s, topic %s, partition %s, offset %s; pausing the task",
                  context.processor_node, context.task_id, context.topic, context.partition, context.offset,
                  exc_info=exception)
        return ProcessingHandlerResponse.PAUSE


class LogAndRetryProcessingExceptionHandler(_Configurable):
    """Run every failed record again (a transient failure: a service down for a while); once
    ``processing.retry.max.attempts`` ran, ``processing.retry.exhausted.answer`` applies."""

    def handle(self, context: ErrorContext, record: Any, exception: BaseException) -> ProcessingHandlerResponse:
        log.warning("Processor %s failed, task %s, topic %s, partition %s, offset %s, attempt %d; retrying: %s: %s",
                    context.processor_node, context.task_id, context.topic, context.partition, context.offset,
                    context.attempt, type(exception).__name__, exception)
        return ProcessingHandlerResponse.RETRY
