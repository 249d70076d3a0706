"""The commit metadata that names offsets already done above a partition's committed one.

With records in flight, a partition's committed position is its contiguous watermark;
offsets completed above it are written into the commit's metadata (``sl1:`` and their
distances from the watermark) so that a restarted task, or a restored store, skips them
instead of processing them again. The format is part of the foundation because both the
task (which writes it) and the state manager (which reads it on restore) use it.
"""

from __future__ import annotations

METADATA_PREFIX = "sl1:"
METADATA_MAX_BYTES = 4096


def encode_completed(watermark: int, completed: set[int]) -> str:
    """Offsets done above the watermark, as distances, cut to fit Kafka's metadata limit.

    What does not fit is simply processed again after a restart (at-least-once).
    """
    if not completed:
        return ""
    text = METADATA_PREFIX
    for offset in sorted(completed):
        item = f"{offset - watermark},"
        if len(text) + len(item) > METADATA_MAX_BYTES:
            break
        text += item
    return text.rstrip(",")


def decode_completed(watermark: int, metadata: str) -> set[int]:
    """The offsets ``encode_completed`` wrote; nothing for metadata it did not write."""
    if not metadata.startswith(METADATA_PREFIX):
        return set()
    body = metadata[len(METADATA_PREFIX):]
    return {watermark + int(part) for part in body.split(",") if part.strip().isdigit()}
