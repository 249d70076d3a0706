"""A topology as text, in Kafka Streams' ``TopologyDescription`` form (``Topology.describe``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from streamloop.topology.global_tables import describe_global_store
from streamloop.topology.specs import NodeKind, SubTopology

if TYPE_CHECKING:
    from streamloop.topology.topology import Topology


def describe(topology: Topology) -> str:
    """The topology in Kafka Streams' ``TopologyDescription`` text form.

    As in Kafka Streams, the nodes of a sub-topology, and the names after ``-->`` and
    ``<--``, are listed largest sub-tree first (a node's size is one plus its
    successors' sizes), then by name; every sub-topology ends with a blank line.
    """
    lines = ["Topologies:"]
    for sub in topology.subtopologies:
        size = _subtree_sizes(topology, sub)

        def order(names: Iterable[str], size: dict[str, int] = size) -> list[str]:
            return sorted(names, key=lambda n: (-size[n], n))

        def listed(names: Iterable[str]) -> str:
            return ", ".join(order(names)) or "none"

        lines.append(f"   Sub-topology: {sub.id}")
        for name in order(sub.node_names):
            spec = topology.spec(name)
            if spec.kind is NodeKind.SOURCE:
                # As Kafka Streams' Source#toString: a pattern source shows its pattern.
                topics = spec.pattern.pattern if spec.pattern is not None else ", ".join(spec.topics)
                lines.append(f"    Source: {name} (topics: [{topics}])")
                lines.append(f"      --> {listed(spec.children)}")
            elif spec.kind is NodeKind.SINK:
                if isinstance(spec.sink_topic, str):
                    lines.append(f"    Sink: {name} (topic: {spec.sink_topic})")
                else:
                    lines.append(f"    Sink: {name} (extractor class: {callable_name(spec.sink_topic)})")
                lines.append(f"      <-- {listed(spec.parents)}")
            else:
                lines.append(f"    Processor: {name} (stores: [{', '.join(spec.stores)}])")
                lines.append(f"      --> {listed(spec.children)}")
                lines.append(f"      <-- {listed(spec.parents)}")
        lines.append("")
    # Global tables after the task sub-topologies, numbered on (no task has their ids).
    for number, global_spec in enumerate(topology.global_stores.values(), len(topology.subtopologies)):
        lines.extend(describe_global_store(global_spec, number))
    return "\n".join(lines) + "\n"


def _subtree_sizes(topology: Topology, sub: SubTopology) -> dict[str, int]:
    size: dict[str, int] = {}

    def measure(name: str) -> int:
        if name not in size:
            size[name] = 1 + sum(measure(child) for child in topology.spec(name).children)
        return size[name]

    for name in sub.node_names:
        measure(name)
    return size


def callable_name(fn: object) -> str:
    """``module.qualname`` of a function or object (a sink's topic extractor, in texts and errors)."""
    module = getattr(fn, "__module__", None) or type(fn).__module__
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}.{name}"
