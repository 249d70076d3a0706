"""Where a task that a handler PAUSEd stopped, and where its resume reads each partition again.

A PAUSE stops the whole task at the failed record (``StreamTask.pause``): its partition is read
again from that record, and every partition of the task from the first record the pause dropped from
the task's buffer. Records in flight finish meanwhile, and one of them may fail and be answered
PAUSE too: the task stays paused, and the point moves (``again``). Positions never pass it
(``cap``), and the resume reads from it (``resume_offsets``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from streamloop.records import ConsumerRecord, TopicPartition


class PausePoint:
    """The paused record (``at``: its partition and offset) and, per partition, the lowest offset
    the pause dropped from the task's buffer (``dropped``: read again from there)."""

    __slots__ = ("at", "dropped")

    def __init__(self, tp: TopicPartition, offset: int,
                 queues: Mapping[TopicPartition, Sequence[ConsumerRecord]]) -> None:
        self.at = (tp, offset)
        # Under processing.ordering=key a record may be taken ahead of buffered ones (behind a busy
        # key): the lowest dropped may be below the paused record, or below records taken. (The
        # paused record itself may head its queue, not taken yet: that is no record dropped below it.)
        self.dropped = {other: queue[0].offset for other, queue in queues.items()
                        if queue and (other != tp or queue[0].offset < offset)}

    def again(self, tp: TopicPartition, offset: int, position: int | None) -> int | None:
        """A record in flight failed while the task is paused, and was answered PAUSE too. Returns
        the position ``tp`` gets (before records in flight below it lower it), None: it keeps its own.
        ``position``: the one it has."""
        if self.at[0] != tp:
            # Another partition: the task stays paused, and that partition is read again from the
            # record, as from one the pause dropped (its handler is asked again if it fails again).
            self.dropped[tp] = min(self.dropped.get(tp, offset), offset)
            return offset if position is None else min(position, offset)
        if offset < self.at[1]:
            # Records in flight that failed together, a higher one asked first: pause lower.
            self.at = (tp, offset)
            return self.read_again_from(tp, offset)
        return None

    def below(self, raw: ConsumerRecord) -> bool:
        """Whether ``raw`` is above the paused record, on its partition."""
        tp, offset = self.at
        return tp == (raw.topic, raw.partition) and raw.offset > offset

    def cap(self, tp: TopicPartition) -> int | None:
        """What the position of ``tp`` must not pass: the paused offset or a lower one whose record
        the pause dropped (on another partition of the task: the lowest it dropped there)."""
        paused, offset = self.at
        if paused == tp:
            return self.read_again_from(tp, offset)
        return self.dropped.get(tp)

    def read_again_from(self, tp: TopicPartition, start: int) -> int:
        """Where a resume reads the paused partition ``tp`` again for a record at ``start`` (the
        paused one, or the one after it): lower when buffered records below it were dropped."""
        dropped = self.dropped.get(tp)
        return start if dropped is None else min(start, dropped)

    def resume_offsets(self, skip: bool) -> dict[TopicPartition, int]:
        """Where the resume reads each partition again: the paused one from the paused record (or
        past it, with ``skip``), the others from the first record the pause dropped; one that
        dropped none reads on where its consumer is (its records in flight finish as they are)."""
        tp, offset = self.at
        starts = dict(self.dropped)
        starts[tp] = self.read_again_from(tp, offset + 1 if skip else offset)
        return starts
