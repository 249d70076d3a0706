"""MemoryAdmin: topic administration on a memory broker."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from streamloop.transport.memory.broker import MemoryBroker


class MemoryAdmin:
    """Implements :class:`streamloop.transport.base.Admin` on a :class:`MemoryBroker`."""

    def __init__(self, broker: MemoryBroker, client_id: str) -> None:
        self._broker = broker
        self._client_id = client_id

    def __repr__(self) -> str:
        return f"MemoryAdmin({self._client_id} on {self._broker!r})"

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def create_topics(self, partitions: Mapping[str, int], replication_factor: int = 1,
                            configs: Mapping[str, Mapping[str, str]] | None = None) -> None:
        """Create missing topics; existing ones are left as they are.

        The memory broker keeps one copy of each partition and every record:
        ``replication_factor`` and ``configs`` (compaction, retention) are accepted and
        ignored, which restoring tolerates (it applies updates in order, the last wins).
        Members subscribed to a created topic rebalance.
        """
        self._broker.create_topics(partitions)

    async def delete_topics(self, topics: Sequence[str]) -> None:
        """Delete topics, their records and committed offsets; missing topics are ignored."""
        self._broker.delete_topics(topics)

    async def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        return self._broker.partition_counts(topics)

    async def all_partition_counts(self) -> dict[str, int]:
        return self._broker.partition_counts(self._broker.topic_names())
