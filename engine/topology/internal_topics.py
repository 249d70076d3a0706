"""The internal topics a topology needs: repartition and changelog topics, with their partition
counts and topic configs (``Topology.internal_topics``).

A repartition topic gets the partition count of the sub-topology that writes it, a changelog that
of the sub-topology that owns the store. Sub-topologies are numbered upstream first, so one pass
resolves chains of repartitions. A sub-topology that reads by pattern
(``streamloop.topology.patterns``) is sized by the topics its patterns match now; with none, it
has no tasks yet, which only a stateless one may (its internal topics need a count).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from streamloop.errors import TopologyError
from streamloop.state.changelog import changelog_topic, topic_configs
from streamloop.state.stores import StoreType
from streamloop.topology.copartition import check_copartition_groups, repartition_counts

if TYPE_CHECKING:
    from streamloop.topology.specs import SubTopology
    from streamloop.topology.topology import Topology


def internal_topics(topology: Topology, source_partitions: Mapping[str, int]) -> dict[str, tuple[int, dict[str, str]]]:
    """Repartition and changelog topics to create: name -> (partitions, topic configs).

    Affects: ``topology.pattern_task_limits`` (the tasks a stateful pattern sub-topology's internal
    topics are created for)."""
    application_id = topology.application_id
    if application_id is None:
        raise TopologyError("The topology has no application id yet (it is set by KafkaStreams)")
    fixed = topology.fixed_partitions()
    # A repartition topic with a fixed count is checked for co-partitioning like a user topic.
    counts = {**source_partitions, **fixed}
    check_copartition_groups(topology, counts)
    result: dict[str, tuple[int, dict[str, str]]] = {}
    repartition = set(topology.repartition_topics())
    joined = repartition_counts(topology, counts)
    tasks: dict[int, int] = {}
    for sub in topology.subtopologies:
        known = [counts[t] for t in sub.source_topics if t in counts]
        by_pattern = _reads_by_pattern(topology, sub)
        sized = any(t in repartition for t in sub.sink_topics) or any(
            topology.spec(n).stores for n in sub.node_names)
        if not known and by_pattern:
            if sized:
                raise TopologyError(
                    f"Sub-topology {sub.id} reads by pattern but no topic matches yet, and its internal "
                    "topics (repartition, changelog) take their partition count from its topics: create a "
                    "matching topic before starting the application")
            continue  # stateless: its tasks come with the first matching topic
        if not known:
            raise TopologyError(f"Sub-topology {sub.id} reads {list(sub.source_topics)}, whose partitions "
                                "are not known")
        tasks[sub.id] = max(known)
        if by_pattern and sized:
            topology.pattern_task_limits[sub.id] = tasks[sub.id]
        for topic in sub.sink_topics:
            if topic in repartition:
                # One a join reads has the partitions of the topic it is joined with.
                counts[topic] = fixed.get(topic) or joined.get(topic) or max(counts.get(topic, 0), tasks[sub.id])
                result[topic] = (counts[topic], {"cleanup.policy": "delete"})
    for name in topology.store_names:
        builder = topology.store_builder(name)
        if not builder.logging:
            continue
        owner = topology.subtopology_of_store(name)
        windowed = builder.type in (StoreType.WINDOW, StoreType.SESSION)
        result[changelog_topic(application_id, name)] = (
            tasks[owner.id], topic_configs(windowed, builder.supplier.retention_ms))
    return result


def _reads_by_pattern(topology: Topology, sub: SubTopology) -> bool:
    return any(topology.spec(n).pattern is not None for n in sub.node_names)
