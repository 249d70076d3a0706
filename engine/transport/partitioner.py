"""Kafka's default partitioner: which partition a keyed record goes to.

The engine picks partitions itself (the producer is handed whole batches per partition), for
the memory transport too, so that both put a key where a Java client would: murmur2 of the key
bytes (``org.apache.kafka.common.utils.Utils.murmur2``, seed ``0x9747b28c``), made non-negative,
modulo the partition count. Written here rather than borrowed from aiokafka so that the engine's
core, and an application on ``memory://``, never loads the Kafka client.
"""

from __future__ import annotations

import struct

__all__ = ["key_hash", "murmur2"]

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 of ``data``, as an unsigned int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length & ~3
    # The four-byte blocks, little-endian, read in one call rather than byte by byte.
    for (k,) in struct.iter_unpack("<I", data[:whole]):
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = length - whole
    if tail:
        if tail == 3:
            h ^= data[whole + 2] << 16
        if tail >= 2:
            h ^= data[whole + 1] << 8
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def key_hash(key: bytes) -> int:
    """The non-negative murmur2 hash of ``key``; its partition is this modulo the partition count."""
    return murmur2(key) & 0x7FFFFFFF
