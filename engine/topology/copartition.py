"""Co-partitioning of joined inputs: the topics behind both sides of a join must have as many
partitions, or a key's records on one side would be read by another task than the other
side's (Kafka Streams checks this at start-up, ``CopartitionedTopicsEnforcer``).

A join registers its two sides here; the client checks the groups once the topics'
partition counts are known, before any task runs. Repartition topics are created by the
client with their writer's partition count and are left out of the check.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from streamloop.errors import TopologyError

if TYPE_CHECKING:
    from streamloop.topology.topology import Topology


def add_copartition_group(topology: Topology, what: str, nodes: Sequence[str]) -> None:
    """The inputs of ``nodes`` must be co-partitioned (``what`` names the operation, for the error)."""
    topology.copartition_groups.append((what, tuple(nodes)))


def source_topics_of(topology: Topology, node: str) -> list[str]:
    """The user topics (and repartition topics of a fixed partition count) whose records reach ``node``."""
    internal = set(topology.repartition_topics()) - set(topology.fixed_partitions())
    return [t for t in _all_source_topics(topology, node) if t not in internal]


def check_copartition_groups(topology: Topology, partition_counts: Mapping[str, int]) -> None:
    """Raise ``TopologyError`` naming the topics of the first join whose inputs differ in partitions."""
    for what, nodes in topology.copartition_groups:
        counts = {t: partition_counts[t] for node in nodes for t in source_topics_of(topology, node)
                  if t in partition_counts}
        if len(set(counts.values())) > 1:
            listed = ", ".join(f"'{t}' ({n})" for t, n in sorted(counts.items()))
            raise TopologyError(
                f"{what} needs co-partitioned inputs, but its topics have different partition counts: {listed}. "
                "Give them the same number of partitions (or repartition one side through a topic that has it)")


def repartition_counts(topology: Topology, partition_counts: Mapping[str, int]) -> dict[str, int]:
    """Partition counts for the repartition topics a join reads: those of the user topics joined
    with them, so that a key is in the same partition on both sides (repartition topics not
    joined with a user topic take their writer's count, which ``internal_topics`` decides)."""
    internal = set(topology.repartition_topics()) - set(topology.fixed_partitions())
    forced: dict[str, int] = {}
    for _what, nodes in topology.copartition_groups:
        users = {partition_counts[t] for node in nodes for t in source_topics_of(topology, node)
                 if t in partition_counts}
        if len(users) != 1:
            continue  # none to follow, or a mismatch check_copartition_groups reports
        count = users.pop()
        for node in nodes:
            for topic in _all_source_topics(topology, node):
                if topic in internal:
                    forced[topic] = count
    return forced


def _all_source_topics(topology: Topology, node: str) -> list[str]:
    topics: list[str] = []
    pending, seen = [node], set()
    while pending:
        name = pending.pop()
        if name not in seen:
            seen.add(name)
            spec = topology.spec(name)
            topics.extend(spec.topics)
            pending.extend(spec.parents)
    return topics


def check_copartitioning(topology: Topology, partition_counts: Mapping[str, int]) -> dict[int, int]:
    """Partitions (= tasks) per sub-topology; its source topics must have equal counts."""
    result: dict[int, int] = {}
    for sub in topology.subtopologies:
        counts = {t: partition_counts[t] for t in sub.source_topics if t in partition_counts}
        if len(set(counts.values())) > 1:
            raise TopologyError(
                f"Source topics of sub-topology {sub.id} must have the same number of partitions, got {counts}"
            )
        result[sub.id] = max(counts.values(), default=0)
    return result
