"""Back-pressure: a partition is fetched only while its task's buffer has room.

A partition whose task buffers ``buffered.records.per.partition`` records (``limit``) is paused in
the consumer, and resumed once the task has worked its buffer down to half of it. Whether
back-pressure holds a partition follows from its buffered count alone; this is the one record of
which partitions it paused (a PAUSE answer of a handler pauses through the task instead, and a
partition of a closed task is released by the task manager, which knows whether it stays assigned).
Caller: the stream thread's task manager (``streamloop.tasks.manager``), on its loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from streamloop.records import ConsumerRecord, TopicPartition
from streamloop.transport.base import Consumer

if TYPE_CHECKING:
    from .task import StreamTask


class BackPressure:
    def __init__(self, consumer: Consumer, limit: int, task_of: Callable[[TopicPartition], StreamTask | None]) -> None:
        self._consumer = consumer
        self._limit = limit
        self._task_of = task_of
        self._paused: set[TopicPartition] = set()

    def add(self, tp: TopicPartition, task: StreamTask, records: Sequence[ConsumerRecord]) -> int:
        """Give ``records`` of ``tp`` to ``task``, pausing ``tp`` once its buffer is full; how many it got."""
        added = len(records)
        if task.add_records(tp, records) >= self._limit and tp not in self._paused:
            # Pausing may discard what the consumer fetched ahead for tp (aiokafka does), and
            # the broker would send it again while this thread waits: keep it (one fetch more).
            ahead = self._consumer.take_fetched(tp)
            if ahead:
                added += len(ahead)
                task.add_records(tp, ahead)
            self._paused.add(tp)
            self._consumer.pause(tp)
        return added

    def release_ready(self) -> None:
        """Resume every paused partition whose buffer is down to half the limit (after each chunk)."""
        if self._paused:  # every chunk comes here: nothing to do in the common case
            for tp in list(self._paused):
                self.release(tp)

    def release(self, tp: TopicPartition) -> None:
        """Resume fetching ``tp`` if back-pressure paused it and its buffer is down to half the limit.

        Caller: every path that shrinks a buffer: a processed chunk and the records dropped at a
        seek. A partition without a task here holds nothing.
        """
        if tp not in self._paused:
            return
        task = self._task_of(tp)
        if task is not None and task.buffered(tp) > self._limit // 2:
            return
        self._paused.discard(tp)
        self._consumer.resume(tp)

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        """``partitions`` are paused by a PAUSE answer now: their resumption is the task's."""
        self._paused.difference_update(partitions)

    def drop(self, tp: TopicPartition) -> bool:
        """``tp``'s task closed: whether back-pressure had paused it (the caller resumes it if it stays)."""
        if tp in self._paused:
            self._paused.discard(tp)
            return True
        return False
