"""``StateDirCleaner``: deletes task directories in ``state.dir`` that no local stream thread owns.

A directory left by a task that moved to another instance only costs disk; it is
kept for ``state.cleanup.delay.ms`` in case the task comes back (a restore from
its checkpoint is cheaper than a full one), then deleted. The cleaner runs only
while a stream thread is alive: with none, it forgets what it saw and waits, and
picks up again when a thread is added.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class StateDirCleaner:
    def __init__(self, directory: str, delay_ms: int, owned: Callable[[], set[str] | None],
                 interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        """``owned()`` names the task directories in use, or None when no stream thread is alive."""
        self.directory = directory
        self.delay_s = delay_ms / 1000.0
        self._owned = owned
        self._interval_s = interval_s
        self._clock = clock
        self._unowned_since: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.deleted: list[str] = []

    def start(self, name: str) -> None:
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.clean_once()
            except Exception:  # a failed sweep is retried at the next tick
                log.exception("Cleaning %s failed", self.directory)

    def clean_once(self) -> list[str]:
        owned = self._owned()
        if owned is None:
            self._unowned_since.clear()
            return []
        try:
            entries = [e for e in os.listdir(self.directory) if os.path.isdir(os.path.join(self.directory, e))]
        except FileNotFoundError:
            return []
        now = self._clock()
        deleted = []
        for entry in entries:
            if entry in owned:
                self._unowned_since.pop(entry, None)
                continue
            since = self._unowned_since.setdefault(entry, now)
            if now - since >= self.delay_s:
                # Asked again right before deleting: a task may have been assigned meanwhile.
                latest = self._owned()
                if latest is None or entry in latest:
                    self._unowned_since.pop(entry, None)
                    continue
                path = os.path.join(self.directory, entry)
                log.info("Deleting the state of task %s: no local thread has owned it for %.0f ms (%s)",
                         entry, (now - since) * 1000, path)
                shutil.rmtree(path, ignore_errors=True)
                self._unowned_since.pop(entry, None)
                deleted.append(entry)
        self.deleted.extend(deleted)
        return deleted
