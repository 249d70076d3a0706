"""What the test driver reports: a call that never finishes, and topics a test left unused."""

from __future__ import annotations

from dataclasses import dataclass

from streamloop.errors import StreamsTimeoutError, TopologyError
from streamloop.ids import TaskId


class DriverTimeoutError(StreamsTimeoutError):
    """A driver call did not finish: a processor awaits something that never happens.

    Names the processor, the task and the record (``topic``/``partition``/``offset`` are
    None when it hung in a punctuation).
    """

    def __init__(self, task_id: TaskId | None, processor: str, topic: str | None, partition: int | None,
                 offset: int | None, budget_ms: int) -> None:
        where = f" on the record at {topic}-{partition} offset {offset}" if topic is not None else ""
        task = f" of task {task_id}" if task_id is not None else ""
        super().__init__(
            f"Processor '{processor}'{task} did not finish{where} within {budget_ms} ms of the driver's "
            "(virtual) time: it awaits something that never happens (or waits more than a second of "
            "real time for another thread). The driver's budget per call is "
            "task.timeout.ms + max.poll.interval.ms.")
        self.task_id = task_id
        self.processor = processor
        self.topic = topic
        self.partition = partition
        self.offset = offset


class UnusedTopicsError(TopologyError):
    """At ``close()`` with ``strict_topics=True``: a source got no input or an output was never read."""



@dataclass(frozen=True)
class UnusedTopics:
    """Source topics that got no input and output topics written to but never read."""

    sources_without_input: tuple[str, ...]
    outputs_never_read: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.sources_without_input or self.outputs_never_read)

    def describe(self) -> str:
        parts = []
        if self.sources_without_input:
            parts.append(f"source topics {list(self.sources_without_input)} got no input "
                         "(pipe records into them through create_input_topic)")
        if self.outputs_never_read:
            parts.append(f"output topics {list(self.outputs_never_read)} were written but never read "
                         "(read them through create_output_topic)")
        return "; ".join(parts)


