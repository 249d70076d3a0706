"""The checkpoint file of a task's persistent stores: the changelog offset each store is in sync with.

Written after a commit (and on a clean close), removed when the task starts
processing, so a crash leaves none and the next start restores in full. A file
that cannot be read is treated as missing, never as an error.
"""

from __future__ import annotations

import json
import logging
import os

from engine.records import TopicPartition

log = logging.getLogger(__name__)

FILE_NAME = ".checkpoint"
_VERSION = 1


def read(directory: str) -> dict[TopicPartition, int]:
    path = os.path.join(directory, FILE_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if data.get("version") != _VERSION:
            raise ValueError(f"unknown version {data.get('version')!r}")
        return {TopicPartition(t, int(p)): int(o) for t, p, o in data["offsets"]}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("Ignoring the unreadable checkpoint %s (%s): restoring in full", path, exc)
        return {}


def write(directory: str, offsets: dict[TopicPartition, int]) -> None:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, FILE_NAME)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"version": _VERSION, "offsets": [[tp.topic, tp.partition, o] for tp, o in sorted(offsets.items())]},
                  f)
        f.flush()
        os.fsync(f.fileno())
    # Atomic replace: a crash mid-write leaves the old file or the new one, never half of one.
    os.replace(tmp, path)


def remove(directory: str) -> None:
    try:
        os.remove(os.path.join(directory, FILE_NAME))
    except FileNotFoundError:
        pass
