"""Co-partitioning: the source topics of a join are read by the same tasks, so partition ``p`` of
each must hold the same keys. As Kafka Streams' ``CopartitionedTopicsEnforcer``: the user's
topics of a group must have equal partition counts, and a repartition topic in the group is
created with that count (not its writer's), so a repartitioned side meets the other side.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping

from engine.errors import TopologyError


def enforce_copartitioning(groups: Iterable[tuple[str, ...]], counts: MutableMapping[str, int],
                           repartition: set[str],
                           created: MutableMapping[str, tuple[int, dict[str, str]]]) -> None:
    """Check each group of topics and size its repartition topics in ``counts`` and ``created``.

    Caller: ``Topology.internal_topics``, for a sub-topology's groups after its upstream
    sub-topologies have sized the repartition topics it reads (which this may change).
    """
    for topics in groups:
        external = {t: counts[t] for t in topics if t not in repartition and t in counts}
        if len(set(external.values())) > 1:
            raise TopologyError(f"Topics {sorted(topics)} are joined, so they must have the same number of "
                                f"partitions (co-partitioned), got {external}: repartition one side with "
                                "the other's count first")
        if not external:
            continue
        wanted = next(iter(external.values()))
        for topic in topics:
            if topic in repartition:
                counts[topic] = wanted
                if topic in created:
                    created[topic] = (wanted, created[topic][1])
