"""The checkpoint file of a task's persistent stores: the changelog offset each store is in sync with.

Written after a restore and after commits (``streamloop.state.uncommitted`` says which
offset a commit may name), and never removed while the task runs: the store on disk
holds a commit's state, so after a crash the next start restores only the changelog
from this offset on. A file that cannot be read is treated as missing (a full restore),
never as an error; so is a symbolic link.
The file is 0600, written to a temporary file created exclusively (a link planted in
its place is removed, never followed) and renamed over the old one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os

from streamloop.records import TopicPartition
from streamloop.state.directory import make_private_dirs, open_private_file

log = logging.getLogger(__name__)

FILE_NAME = ".checkpoint"
_VERSION = 1


def read(directory: str) -> dict[TopicPartition, int]:
    path = os.path.join(directory, FILE_NAME)
    try:
        with os.fdopen(open_private_file(path, os.O_RDONLY), encoding="utf-8") as f:
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
    make_private_dirs(directory)
    path = os.path.join(directory, FILE_NAME)
    tmp = path + ".tmp"
    with os.fdopen(_create_exclusive(tmp), "w", encoding="utf-8") as f:
        json.dump({"version": _VERSION, "offsets": [[tp.topic, tp.partition, o] for tp, o in sorted(offsets.items())]},
                  f)
        f.flush()
        os.fsync(f.fileno())
    # Atomic replace: a crash mid-write leaves the old file or the new one, never half of one.
    os.replace(tmp, path)


def _create_exclusive(path: str) -> int:
    """A new 0600 file at ``path``; whatever is there (a crash's leftover, a planted link) is removed first."""
    try:
        return open_private_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        os.unlink(path)  # unlinks a link itself, never its target
        return open_private_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)


def remove(directory: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(directory, FILE_NAME))
