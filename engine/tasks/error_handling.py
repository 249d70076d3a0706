"""Asks the deserialization or processing exception handler about a failed record.

Handlers decide (``FAIL``, ``CONTINUE``, ``PAUSE``, and for processing ``RETRY``); the task
acts. A handler that raises or answers something else is a fatal user error, as in Kafka Streams,
and so is a deserialization handler that answers ``RETRY`` (the same bytes read the same way again).
With ``errors.dead.letter.queue.topic.name`` set, the failed record's bytes go to that topic
whatever the final answer, through the task's own producer: not for a ``RETRY`` (the record runs
again), but once its retries are exhausted (``retries_exhausted``: the configured answer applies).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from streamloop.collector import RecordCollector
from streamloop.config import (
    DEFAULT_DESERIALIZATION_EXCEPTION_HANDLER,
    PROCESSING_EXCEPTION_HANDLER,
    PROCESSING_RETRY_EXHAUSTED_ANSWER,
)
from streamloop.errors import HandledRecordError, HandlerError, TaskError
from streamloop.handlers.context import ErrorContext
from streamloop.handlers.dead_letter import dead_letter
from streamloop.handlers.responses import Answer
from streamloop.ids import TaskId
from streamloop.records import ConsumerRecord

from .retries import RetryPolicy

log = logging.getLogger(__name__)


class ErrorHandling:
    """One per stream thread; the counters are read by the client's metrics."""

    def __init__(self, deserialization: Any, processing: Any, dlq_topic: str | None,
                 collector: RecordCollector, retry: RetryPolicy | None = None) -> None:
        self._deserialization = deserialization
        self._processing = processing
        self._dlq_topic = dlq_topic
        self._collector = collector
        # Under exactly-once a dead letter goes through the failing task's own producer, so that it
        # is part of the task's transaction (aborted with it, never duplicated).
        self.collector_of: Callable[[TaskId], RecordCollector | None] | None = None
        self.retry = retry or RetryPolicy()
        self.dropped = 0
        self.paused = 0

    @property
    def records_dropped(self) -> int:
        """Records dropped on purpose: a handler's CONTINUE, or a stream partitioner's empty set
        (as Kafka Streams' dropped-records sensor counts both)."""
        return self.dropped + self._collector.dropped

    async def on_deserialization_error(self, task_id: TaskId, raw: ConsumerRecord, error: TaskError) -> Answer:
        return await self._ask(self._deserialization, DEFAULT_DESERIALIZATION_EXCEPTION_HANDLER,
                               _context(task_id, raw, None), raw, error)

    async def on_processing_error(self, task_id: TaskId, raw: ConsumerRecord, node: str, record: Any,
                                  error: TaskError, attempt: int = 1) -> Answer:
        """The processing handler's answer about attempt ``attempt`` of ``raw``, acted on; a RETRY is
        not (the caller schedules the record, or calls ``retries_exhausted``)."""
        return await self._ask(self._processing, PROCESSING_EXCEPTION_HANDLER,
                               _context(task_id, raw, node, attempt), record, error)

    async def retries_exhausted(self, task_id: TaskId, raw: ConsumerRecord, node: str, error: TaskError,
                                attempt: int, why: str) -> Answer:
        """The handler answered RETRY about a record that may not run again (``why``):
        ``processing.retry.exhausted.answer`` applies, acted on as if the handler had answered it."""
        action = self.retry.exhausted
        log.warning("Task %s, topic %s, partition %s, offset %s: the processing handler answered RETRY on "
                    "attempt %d, but %s; %s=%s applies", task_id, raw.topic, raw.partition, raw.offset, attempt,
                    why, PROCESSING_RETRY_EXHAUSTED_ANSWER, action.value)
        if isinstance(error, HandledRecordError):
            error.answered(PROCESSING_RETRY_EXHAUSTED_ANSWER,
                           f"'{action.value}' (after {error.handler} answered RETRY on attempt {attempt})",
                           action.name)
        return await self._act(_context(task_id, raw, node, attempt), error.__cause__ or error, action)

    async def _ask(self, handler: Any, setting: str, context: ErrorContext, record: Any,
                   error: TaskError) -> Answer:
        kind = "deserialization" if setting == DEFAULT_DESERIALIZATION_EXCEPTION_HANDLER else "processing"
        cause = error.__cause__ or error
        try:
            answer = handler.handle(context, record, cause)
        except Exception as exc:
            raise HandlerError(f"Fatal user code error in {kind} error callback: {exc!r}") from exc
        if not isinstance(answer, Answer):
            expected = "DeserializationHandlerResponse" if kind == "deserialization" else "ProcessingHandlerResponse"
            raise HandlerError(f"The {kind} exception handler answered {answer!r}, "
                               f"not a {expected}") from error
        if answer is Answer.RETRY and kind == "deserialization":
            raise HandlerError("The deserialization exception handler answered RETRY, which only a processing "
                               "exception handler may answer: the same bytes fail the same way again; answer "
                               "CONTINUE, FAIL or PAUSE") from error
        if isinstance(error, HandledRecordError):
            handler_class = type(handler)
            error.answered(setting, f"{handler_class.__module__}.{handler_class.__qualname__}", answer.name)
        if answer is Answer.RETRY:
            return answer  # no dead letter: the record runs again
        return await self._act(context, cause, answer)

    async def _act(self, context: ErrorContext, cause: BaseException, action: Answer) -> Answer:
        if self._dlq_topic is not None:
            letter = dead_letter(self._dlq_topic, context, cause)
            collector = self._collector
            if self.collector_of is not None:
                collector = self.collector_of(context.task_id) or collector
            await collector.send_raw(letter.topic, letter.key, letter.value, context.timestamp,
                                           letter.headers)
        if action is Answer.CONTINUE:
            self.dropped += 1
        elif action is Answer.PAUSE:
            self.paused += 1
        return action


def _context(task_id: TaskId, raw: ConsumerRecord, node: str | None, attempt: int = 1) -> ErrorContext:
    return ErrorContext(task_id, raw.topic, raw.partition, raw.offset, raw.timestamp, tuple(raw.headers),
                        raw.key, raw.value, node, attempt)
