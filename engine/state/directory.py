"""``StateDirectoryLock``: one client at a time per ``state.dir/<application.id>``.

Two clients of one application sharing a state directory would restore into,
checkpoint over and clean up each other's task directories. Kafka Streams refuses
that at start-up; so do we, with an advisory lock file that the operating system
releases if the process dies.
"""

from __future__ import annotations

import fcntl
import os

from engine.errors import ConfigError

LOCK_FILE = ".lock"


class StateDirectoryLock:
    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._fd: int | None = None

    def acquire(self) -> None:
        """Raises ``ConfigError`` for ``state.dir``, naming the directory, when another client holds it."""
        os.makedirs(self.directory, exist_ok=True)
        fd = os.open(os.path.join(self.directory, LOCK_FILE), os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise ConfigError(
                "state.dir", f"{self.directory} is in use by another client of this application (in this or "
                             "another process): give each instance its own state.dir") from exc
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
