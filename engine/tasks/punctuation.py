"""A task's punctuations: the scheduled callbacks of its processors, fired between records."""

from __future__ import annotations

from collections.abc import Callable

from streamloop.errors import ProcessingError, StreamsError
from streamloop.ids import TaskId
from streamloop.processors.context import TaskContext
from streamloop.processors.punctuation import Schedule


class Punctuations:
    """Caller: the task's run loop (stream time after a record, wall-clock time when due) and the test driver."""

    def __init__(self, task_id: TaskId, context: TaskContext, clock_ms: Callable[[], int]) -> None:
        self._task_id = task_id
        self._ctx = context
        self._clock_ms = clock_ms

    async def maybe_wall_clock(self) -> None:
        schedules = self._ctx.wall_clock_schedules
        if schedules.next_due() is not None:
            now = self._clock_ms()
            await self.run(schedules.due(now), now)

    async def run(self, fired: list[Schedule], timestamp: int) -> None:
        ctx = self._ctx
        for entry in fired:
            # A punctuation runs outside any record: no topic, partition, offset or headers.
            ctx.topic = ctx.partition = ctx.offset = None
            ctx.headers = ()
            ctx.timestamp = timestamp
            try:
                result = entry.callback(ctx.timestamp)
                if result is not None and hasattr(result, "__await__"):
                    await result
                if ctx.forwarder.pending:
                    await ctx.forwarder.drain()
            except StreamsError:
                ctx.forwarder.reset()
                raise
            except Exception as exc:
                ctx.forwarder.reset()
                raise ProcessingError(self._task_id, entry.node_name, None, None, None, exc) from exc
