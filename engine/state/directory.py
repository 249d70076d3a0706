"""The state directory: private to its user, and one client at a time per ``state.dir/<application.id>``.

Local state is checked as SSH checks a key. Directories are created 0700 and files
0600; an existing ``state.dir`` (or application directory) that belongs to another
user or that group or others may write is refused with a ``StateDirectoryError``
naming the path and the fix, because whoever can write there can replace a store or
a checkpoint. The lock and checkpoint files are opened without following symbolic
links, so a link planted in the directory cannot redirect a write.

Two clients of one application sharing a state directory would restore into,
checkpoint over and clean up each other's task directories. Kafka Streams refuses
that at start-up; so do we, with an advisory lock file that the operating system
releases if the process dies.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat

from streamloop.errors import ConfigError, StateDirectoryError

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
DIRECTORY_MODE = 0o700
FILE_MODE = 0o600


def make_private_dirs(path: str) -> None:
    """Create ``path`` and each missing parent 0700 (``os.makedirs`` gives only the last one a mode)."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    if parent and parent != path:
        make_private_dirs(parent)
    with contextlib.suppress(FileExistsError):  # made meanwhile by another process or thread
        os.mkdir(path, DIRECTORY_MODE)


def check_private_dir(path: str) -> None:
    """Raise ``StateDirectoryError`` unless ``path`` is a directory of this user that only it may write.

    A directory readable by others is only warned about: state directories made by earlier
    versions are 0755, and reading is not replacing.
    """
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        raise StateDirectoryError(path, "is not a directory", "Set state.dir to a directory.")
    mode = stat.S_IMODE(info.st_mode)
    me = os.geteuid()
    if info.st_uid != me:
        raise StateDirectoryError(
            path, f"belongs to another user (uid {info.st_uid}, this process runs as uid {me})",
            "Use another state.dir, one of this user's own.")
    if mode & 0o022:
        raise StateDirectoryError(
            path, f"is writable by group or others (mode {mode:04o})",
            f"Run `chmod 700 {path}` or use another state.dir.")
    if mode & 0o077:
        log.warning("State directory %s is readable by group or others (mode %04o): run `chmod 700 %s`",
                    path, mode, path)


def open_private_file(path: str, flags: int) -> int:
    """``os.open`` a file 0600 without following a symbolic link; ``StateDirectoryError`` if ``path`` is one."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StateDirectoryError(path, "is a symbolic link", "Remove it: the engine creates this file "
                                      "itself and never writes through a link.") from exc
        raise


class StateDirectoryLock:
    def __init__(self, state_dir: str, application_id: str) -> None:
        self.state_dir = state_dir
        self.directory = os.path.join(state_dir, application_id)
        self._fd: int | None = None

    def acquire(self) -> None:
        """Create (0700) and check the directories, then lock.

        Raises ``StateDirectoryError`` when ``state.dir`` or the application's directory is not
        private, and ``ConfigError`` for ``state.dir``, naming the directory, when another client
        holds it.
        """
        check_private_dir(self.state_dir)
        make_private_dirs(self.state_dir)
        check_private_dir(self.directory)
        make_private_dirs(self.directory)
        fd = open_private_file(os.path.join(self.directory, LOCK_FILE), os.O_CREAT | os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise ConfigError(
                "state.dir", f"{self.directory} is in use by another client of this application (in this or "
                             "another process): give each instance its own state.dir") from exc
        # A lock file left by an earlier version may be 0644.
        os.fchmod(fd, FILE_MODE)
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
