"""Kafka's default partitioner: which partition a keyed record goes to.

The engine picks partitions itself (the producer is handed whole batches per partition), for
the memory transport too, so that both put a key where a Java client would: murmur2 of the
key bytes, made non-negative, modulo the partition count.
"""

from __future__ import annotations

from aiokafka.partitioner import murmur2

__all__ = ["key_hash"]


def key_hash(key: bytes) -> int:
    """The non-negative murmur2 hash of ``key``; its partition is this modulo the partition count."""
    return int(murmur2(key)) & 0x7FFFFFFF
