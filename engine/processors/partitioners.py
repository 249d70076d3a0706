"""``StreamPartitioner``: which partitions of a sink's topic a record goes to (KIP-837).

A sink takes either a plain function ``fn(topic, key, value, num_partitions) -> int | None``
(Kafka Streams' older ``partition``: one partition, None for the default partitioning) or a
``StreamPartitioner`` whose ``partitions(topic, key, value, num_partitions)`` returns None (the
default partitioning), an empty set (the record is dropped: the partitioner says so) or a set
of partitions, each of which gets a copy of the record (multicast, e.g. a broadcast to every
partition). ``multicast_of`` turns either into the one form the record collector calls.

Copies leave in ascending partition order from the one ``send`` of the record, so each
partition keeps the order of its records, and under exactly-once all copies go into the task's
open transaction with the rest of its output.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Set
from typing import Any

from streamloop.errors import TopologyError

Partitions = Callable[[str, Any, Any, int], "Collection[int] | None"]
"""The collector's form: None for the default partitioning, else the partitions to write."""


class StreamPartitioner:
    """Kafka Streams' ``StreamPartitioner``: override ``partitions`` (or, the older way, ``partition``).

    ``partitions`` returns None for the default partitioning (murmur2 of the key bytes), an
    empty set to drop the record, or the set of partitions to send a copy to.
    """

    def partition(self, topic: str, key: Any, value: Any, num_partitions: int) -> int | None:
        """One partition, or None for the default partitioning (used by the default ``partitions``)."""
        return None

    def partitions(self, topic: str, key: Any, value: Any, num_partitions: int) -> Set[int] | None:
        chosen = self.partition(topic, key, value, num_partitions)
        return None if chosen is None else {chosen}


class BroadcastPartitioner(StreamPartitioner):
    """Every record to every partition of the topic."""

    def partitions(self, topic: str, key: Any, value: Any, num_partitions: int) -> Set[int] | None:
        return set(range(num_partitions))


def multicast_of(partitioner: object, owner: str) -> Partitions | None:
    """The collector's form of what ``owner`` (a sink, for errors) was given; None for none."""
    if partitioner is None:
        return None
    if isinstance(partitioner, StreamPartitioner):
        return _sorted_partitions(partitioner.partitions)
    choose = getattr(partitioner, "partitions", None)
    if callable(choose):  # duck-typed: any object with partitions() is a multicast partitioner
        return _sorted_partitions(choose)
    if callable(partitioner):
        return _single(partitioner)
    raise TopologyError(f"The stream partitioner of '{owner}' must be a StreamPartitioner or a function "
                        f"(topic, key, value, num_partitions) -> partition | None, got {partitioner!r}")


def _sorted_partitions(choose: Callable[..., Any]) -> Partitions:
    return choose  # the collector checks and sorts what it returns (streamloop.collector.checked_partitions)


def _single(choose: Callable[..., Any]) -> Partitions:
    def partitions(topic: str, key: Any, value: Any, count: int) -> Collection[int] | None:
        chosen = choose(topic, key, value, count)
        return None if chosen is None else (chosen,)
    return partitions
