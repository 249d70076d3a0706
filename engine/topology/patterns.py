"""Sources that read every topic a regular expression matches, as Kafka Streams'
``StreamsBuilder#stream(Pattern)``.

A pattern source's topics are not known when the topology is built: they are the topics of the
cluster the pattern matches *in full* (Java's ``Matcher#matches``), resolved whenever the group
rebalances. The stream threads subscribe with one pattern for all their sources
(``subscription_pattern``: the named topics, escaped, and every source pattern), so that the
consumer sees new matching topics on its metadata refresh (Kafka: ``metadata.max.age.ms``; the
memory broker: at once) and the group rebalances. The leader's assignor then resolves each
pattern source against the subscribed topics (``resolve``), makes the tasks for their partitions
and sends the resolved topics with the assignment, so that every member's topology agrees.

Rules, as Kafka Streams': a topic a source names is never matched by a pattern; a topic two
patterns match is an error (``TopologyError``); a pattern source cannot feed a join, whose inputs
must be co-partitioned, which cannot be known of topics that come and go (checked at ``build()``);
the application's own internal topics and the global tables' topics are never matched.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from streamloop.errors import TopologyError
from streamloop.topology.specs import NodeKind

if TYPE_CHECKING:
    from streamloop.topology.topology import Topology

_INLINE_FLAGS = ((re.IGNORECASE, "i"), (re.MULTILINE, "m"), (re.DOTALL, "s"), (re.VERBOSE, "x"))
_INTERNAL_SUFFIXES = ("-repartition", "-changelog")


def as_pattern(topics: object) -> re.Pattern[str] | None:
    """``topics`` if it is a compiled pattern of str (a source by pattern), else None."""
    if isinstance(topics, re.Pattern):
        if not isinstance(topics.pattern, str):
            raise TopologyError(f"A source pattern must be a pattern of str, got {topics!r}")
        return topics
    return None


def subscription_pattern(named: Iterable[str], patterns: Iterable[re.Pattern[str]]) -> re.Pattern[str]:
    """One pattern whose ``match`` accepts exactly the ``named`` topics and those a pattern matches in full.

    Each alternative ends in ``\\Z`` so that ``match`` (what aiokafka calls) is a full match;
    each pattern keeps its flags as a scoped inline group."""
    alternatives = [f"{re.escape(topic)}\\Z" for topic in named]
    for pattern in patterns:
        flags = "".join(letter for flag, letter in _INLINE_FLAGS if pattern.flags & flag)
        alternatives.append(f"(?{flags}:{pattern.pattern})\\Z" if flags else f"(?:{pattern.pattern})\\Z")
    return re.compile("|".join(alternatives))


def resolve(topology: Topology, available: Iterable[str]) -> bool:
    """Set each pattern source's topics to those of ``available`` it matches; True if any changed.

    Raises ``TopologyError`` for a topic two pattern sources match."""
    sources = [topology.spec(n) for n in topology.node_names() if topology.spec(n).pattern is not None]
    if not sources:
        return False
    named = {t for n in topology.node_names() if topology.spec(n).pattern is None for t in topology.spec(n).topics}
    excluded = named | set(topology.global_topics)
    prefix = f"{topology.application_id}-" if topology.application_id is not None else None
    matched_by: dict[str, str] = {}
    resolved: dict[str, tuple[str, ...]] = {}
    for spec in sources:
        assert spec.pattern is not None
        topics = []
        for topic in sorted(set(available)):
            if topic in excluded or _internal(topic, prefix) or not spec.pattern.fullmatch(topic):
                continue
            other = matched_by.setdefault(topic, spec.name)
            if other != spec.name:
                raise TopologyError(
                    f"Topic '{topic}' is matched by the patterns of sources '{other}' and '{spec.name}'; "
                    "a topic can be read by one source only: make the patterns exclusive")
            topics.append(topic)
        resolved[spec.name] = tuple(topics)
    changed = False
    for spec in sources:
        if spec.topics != resolved[spec.name]:
            spec.topics = resolved[spec.name]
            changed = True
    if changed:
        topology.topics_changed()
    return changed


def check_task_limits(topology: Topology, partition_counts: Mapping[str, int]) -> None:
    """Raise ``TopologyError`` if a topic a stateful pattern sub-topology matched has more partitions
    than the tasks its changelog and repartition topics were created for (at start-up)."""
    for sub in topology.subtopologies:
        limit = topology.pattern_task_limits.get(sub.id)
        if limit is None:
            continue
        wider = {t: partition_counts[t] for t in sub.source_topics if partition_counts.get(t, 0) > limit}
        if wider:
            listed = ", ".join(f"'{t}' ({n})" for t, n in sorted(wider.items()))
            raise TopologyError(
                f"Sub-topology {sub.id} reads by pattern topics with more partitions than its internal topics "
                f"(changelog, repartition) were created for ({limit}): {listed}. Create matching topics with at "
                f"most {limit} partitions (Kafka Streams cannot grow a stateful sub-topology's partitions either)")


def pattern_topics(topology: Topology) -> list[str]:
    """The topics the pattern sources read now (resolved at the last rebalance)."""
    return sorted(t for n in topology.node_names() if topology.spec(n).pattern is not None
                  for t in topology.spec(n).topics)


def check_not_joined(topology: Topology) -> None:
    """Raise ``TopologyError`` for a join fed by a pattern source (Kafka Streams refuses it too:
    the co-partitioning of topics that come and go cannot be checked)."""
    for what, nodes in topology.copartition_groups:
        for node in nodes:
            refuse_join(topology, what, node)


def refuse_join(topology: Topology, what: str, node: str) -> None:
    """Raise ``TopologyError`` if ``node``, one side of the join ``what``, reads from a pattern source
    in its sub-topology. Caller: ``check_not_joined``, and the stream-table join (whose sides share a
    task through the table's store, not through a co-partition group)."""
    source = _pattern_source_above(topology, node)
    if source is not None:
        pattern = topology.spec(source).pattern
        assert pattern is not None
        raise TopologyError(
            f"{what} reads source '{source}', which reads topics by the pattern {pattern.pattern!r}: "
            "joined inputs must be co-partitioned, which topics a pattern matches cannot be known to be. "
            "Read the topics by name, or repartition the stream first (KStream.repartition())")


def _pattern_source_above(topology: Topology, node: str) -> str | None:
    pending, seen = [node], set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        spec = topology.spec(name)
        if spec.kind is NodeKind.SOURCE and spec.pattern is not None:
            return name
        pending.extend(spec.parents)
    return None


def _internal(topic: str, prefix: str | None) -> bool:
    return prefix is not None and topic.startswith(prefix) and topic.endswith(_INTERNAL_SUFFIXES)
