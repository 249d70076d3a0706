"""The ids of the foundation: ``TaskId``, a sub-topology and a partition number, printed ``0_3``
like Kafka Streams (below the machinery, so that errors and records can name a task)."""

from __future__ import annotations

from typing import NamedTuple


class TaskId(NamedTuple):
    subtopology: int
    partition: int

    def __str__(self) -> str:
        return f"{self.subtopology}_{self.partition}"

    @classmethod
    def parse(cls, text: str) -> TaskId:
        """``"0_3"`` → ``TaskId(0, 3)``; a clear ValueError for anything else."""
        parts = text.split("_")
        if len(parts) != 2 or not all(p.isascii() and p.isdigit() for p in parts):
            raise ValueError(f"Task id must look like '<subtopology>_<partition>', got {text!r}")
        return cls(int(parts[0]), int(parts[1]))
