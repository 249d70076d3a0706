"""The metadata a commit carries per partition: its partition time, and offsets done above it.

Two facts travel in a committed offset's metadata string:

- the partition time: the largest record timestamp taken from the partition. Kafka Streams
  commits it (``StreamTask.encodeTimestamp``) and a task initialised from the commit starts
  from it, so stream time does not fall back to -1 after a restart or a task move;
- with records in flight, the offsets completed above the committed one (the partition's
  contiguous watermark), so that a restarted task, or a restored store, skips them instead
  of processing them again.

Formats (the prefix is the version):

- ``sl1:<d>,<d>...``: completed offsets only, as distances from the watermark (written before
  partition time was committed; still read);
- ``sl2:<partition time>`` or ``sl2:<partition time>;<d>,<d>...``: both, partition time -1 when
  unknown. Written whenever there is something to say; nothing at all is ``""``.

A later version (``sl3:``...) or metadata some other tool wrote decodes as nothing known, with a
warning for the former (Kafka Streams does the same with an unknown version byte): the task then
starts as without a commit's metadata. The format is part of the foundation because both the
task (which writes it) and the state manager (which reads it on restore) use it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

METADATA_PREFIX = "sl1:"
METADATA_PREFIX_V2 = "sl2:"
METADATA_MAX_BYTES = 4096
UNKNOWN_TIME = -1


@dataclass(frozen=True)
class CommitMetadata:
    """What one partition's committed metadata says."""

    partition_time: int = UNKNOWN_TIME
    completed: frozenset[int] = frozenset()


def encode_metadata(watermark: int, partition_time: int, completed: set[int] | frozenset[int]) -> str:
    """``partition_time`` (negative: unknown) and the offsets done above the watermark, as
    distances, cut to fit Kafka's metadata limit. The time always fits; completed offsets that
    do not are simply processed again after a restart (at-least-once)."""
    if partition_time < 0 and not completed:
        return ""
    text = f"{METADATA_PREFIX_V2}{max(partition_time, UNKNOWN_TIME)}"
    if not completed:
        return text
    text += ";"
    for offset in sorted(completed):
        item = f"{offset - watermark},"
        if len(text) + len(item) > METADATA_MAX_BYTES:
            break
        text += item
    return text.rstrip(",;")


def decode_metadata(watermark: int, metadata: str | None) -> CommitMetadata:
    """What ``encode_metadata`` (or the v1 ``encode_completed``) wrote; nothing known otherwise."""
    if not metadata:
        return CommitMetadata()
    if metadata.startswith(METADATA_PREFIX):
        return CommitMetadata(completed=_offsets(watermark, metadata[len(METADATA_PREFIX):]))
    if metadata.startswith(METADATA_PREFIX_V2):
        time_text, _, offsets = metadata[len(METADATA_PREFIX_V2):].partition(";")
        try:
            partition_time = int(time_text)
        except ValueError:
            log.warning("Unreadable partition time in the commit metadata %r: ignored", metadata[:64])
            partition_time = UNKNOWN_TIME
        return CommitMetadata(max(partition_time, UNKNOWN_TIME), _offsets(watermark, offsets))
    version, colon, _ = metadata.partition(":")
    if colon and version.startswith("sl") and version[2:].isdigit():
        log.warning("Commit metadata of an unsupported version %s (supported: sl1, sl2): ignored", version)
    return CommitMetadata()


def _offsets(watermark: int, body: str) -> frozenset[int]:
    return frozenset(watermark + int(part) for part in body.split(",") if part.strip().isdigit())


def encode_completed(watermark: int, completed: set[int]) -> str:
    """Completed offsets alone (no partition time known): ``encode_metadata`` with time -1."""
    return encode_metadata(watermark, UNKNOWN_TIME, completed)


def decode_completed(watermark: int, metadata: str) -> set[int]:
    """The completed offsets of either version; nothing for metadata this module did not write."""
    return set(decode_metadata(watermark, metadata).completed)
