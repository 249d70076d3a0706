"""The parts a ``Topology`` is made of: node specs, sub-topologies, and a task's node instances.

Kept apart from ``streamloop.topology.topology`` so that the code that only reads a topology's
shape (its description) needs none of the building machinery.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from streamloop.processors.nodes import Node, SinkNode, SourceNode
from streamloop.serdes import Serde
from streamloop.timestamps import TimestampExtractor


class NodeKind(Enum):
    SOURCE = "Source"
    PROCESSOR = "Processor"
    SINK = "Sink"


@dataclass
class NodeSpec:
    name: str
    kind: NodeKind
    parents: tuple[str, ...]
    factory: Callable[[], Node]
    topics: tuple[str, ...] = ()
    sink_topic: str | Callable[..., str] | None = None
    key_serde: Serde | None = None
    value_serde: Serde | None = None
    children: list[str] = field(default_factory=list)
    concurrency: int | Callable[[Mapping[str, Any]], int] | None = None
    ordering: str | None = None
    stores: tuple[str, ...] = ()
    # Internal (repartition) topics are named relative to the application id until it is set.
    internal: bool = False
    # Sinks only. Whether key_serde/value_serde are the stream's rather than given to the sink;
    # what keys/values are known to be when no serde is known and they are never bytes; and the
    # call that takes the sink's serdes (None when none does), for the errors about them.
    inherited: tuple[bool, bool] = (False, False)
    kinds: tuple[str | None, str | None] = (None, None)
    serde_call: str | None = "add_sink()"
    # Sources only: the source's own timestamp extractor (None: default.timestamp.extractor).
    timestamp_extractor: TimestampExtractor | None = None
    # Sources of repartition topics only: a partition count fixed by ``repartition()`` (None: derived).
    partitions: int | None = None
    # Sources by pattern only (streamloop.topology.patterns): ``topics`` are those it matched at the
    # last rebalance.
    pattern: re.Pattern[str] | None = None


ORDERINGS = ("partition", "key", "unordered")  # strictest first


@dataclass(frozen=True)
class SubTopology:
    id: int
    node_names: tuple[str, ...]
    source_topics: tuple[str, ...]
    sink_topics: tuple[str, ...]


@dataclass
class TaskGraph:
    """One task's node instances: sources by topic, every node in build order."""

    sources: dict[str, SourceNode]
    nodes: list[Node]
    sinks: list[SinkNode]

    def close(self) -> None:
        for node in self.nodes:
            node.close()
