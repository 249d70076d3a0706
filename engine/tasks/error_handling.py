"""Asks the deserialization or processing exception handler about a failed record.

Handlers decide (``FAIL``, ``CONTINUE``, ``PAUSE``); the task acts. A handler that
raises or answers something else is a fatal user error, as in Kafka Streams.
With ``errors.dead.letter.queue.topic.name`` set, the failed record's bytes go to
that topic whatever the answer, through the task's own producer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamloop.collector import RecordCollector
from streamloop.config import DEFAULT_DESERIALIZATION_EXCEPTION_HANDLER, PROCESSING_EXCEPTION_HANDLER
from streamloop.errors import HandledRecordError, HandlerError, TaskError
from streamloop.handlers.context import ErrorContext
from streamloop.handlers.dead_letter import dead_letter
from streamloop.handlers.responses import Answer
from streamloop.ids import TaskId
from streamloop.records import ConsumerRecord


class ErrorHandling:
    """One per stream thread; the counters are read by the client's metrics."""

    def __init__(self, deserialization: Any, processing: Any, dlq_topic: str | None,
                 collector: RecordCollector) -> None:
        self._deserialization = deserialization
        self._processing = processing
        self._dlq_topic = dlq_topic
        self._collector = collector
        # Under exactly-once a dead letter goes through the failing task's own producer, so that it
        # is part of the task's transaction (aborted with it, never duplicated).
        self.collector_of: Callable[[TaskId], RecordCollector | None] | None = None
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
                                  error: TaskError) -> Answer:
        return await self._ask(self._processing, PROCESSING_EXCEPTION_HANDLER,
                               _context(task_id, raw, node), record, error)

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
        if isinstance(error, HandledRecordError):
            handler_class = type(handler)
            error.answered(setting, f"{handler_class.__module__}.{handler_class.__qualname__}", answer.name)
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


def _context(task_id: TaskId, raw: ConsumerRecord, node: str | None) -> ErrorContext:
    return ErrorContext(task_id, raw.topic, raw.partition, raw.offset, raw.timestamp, tuple(raw.headers),
                        raw.key, raw.value, node)
