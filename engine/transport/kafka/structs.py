"""The engine's partitions and offsets as aiokafka's, and back.

Both sides use named tuples of ``(topic, partition)``; converting costs a tuple per call, so
an aiokafka ``TopicPartition`` passes through as it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka.structs import OffsetAndMetadata as AioOffsetAndMetadata
from aiokafka.structs import TopicPartition as AioTopicPartition

from streamloop.records import TopicPartition
from streamloop.transport.base import OffsetAndMetadata

__all__ = ["aio_offsets", "aio_tp", "our_tps"]


def aio_tp(tp: tuple[str, int]) -> Any:
    """An aiokafka ``TopicPartition`` (typed ``Any``: aiokafka ships no types)."""
    return tp if type(tp) is AioTopicPartition else AioTopicPartition(tp[0], tp[1])


def our_tps(tps: Iterable[tuple[str, int]]) -> set[TopicPartition]:
    return {TopicPartition(tp[0], tp[1]) for tp in tps}


def aio_offsets(offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> dict[Any, Any]:
    """Offsets to commit, as aiokafka's commit calls take them."""
    return {aio_tp(tp): AioOffsetAndMetadata(om.offset, om.metadata) for tp, om in offsets.items()}
