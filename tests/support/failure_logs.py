"""The DEBUG log of one test, kept in memory and written out only if the test fails.

A flaky integration test fails once in many runs, on a broker whose timing cannot be replayed:
the log of that one run is the evidence. ``FailureLog`` records what the ``engine`` loggers (and
optionally ``aiokafka``) say at DEBUG into a bounded ring of ``LogRecord`` objects and formats
them only when a failure asks for them: a passing test pays for making each DEBUG record (about
12 µs; a test makes a few hundred to 2,000) and a ``deque.append``.

Lowering a logger to DEBUG also sends every DEBUG record on to the root logger's handlers
(pytest's, which format each record at once, for its "Captured log" sections and ``caplog``).
While the capture runs, each root handler gets a filter that drops what it would not have seen
without the capture. (Turning propagation off instead does not work: pytest attaches its
handlers to every non-propagating logger when a test phase starts.)

A record is formatted when the log is written: an argument that is a mutable object shows its
value at that time (the engine's log calls pass fresh values: ids, sorted lists, numbers).

Caller: ``tests/integration/conftest.py`` (one ``FailureLog`` per test).
"""

from __future__ import annotations

import collections
import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path

LINE_FORMAT = "%(asctime)s %(threadName)s %(levelname)s %(name)s %(message)s"

# Below DEBUG, so that a test which sets a captured logger to DEBUG itself (caplog) is told apart
# from the capture: its DEBUG records then reach caplog as they would without the capture.
_CAPTURE_LEVEL = 1


class _Ring(logging.Handler):
    """Keeps the last ``capacity`` records; no formatting, no lock (``deque.append`` is atomic)."""

    def __init__(self, capacity: int) -> None:
        super().__init__(_CAPTURE_LEVEL)
        self.records: collections.deque[logging.LogRecord] = collections.deque(maxlen=capacity)
        self.seen = 0

    def handle(self, record: logging.LogRecord) -> bool:  # no lock, unlike Handler.handle
        self.records.append(record)
        self.seen += 1  # may miss a count under a race between threads: it only says "records dropped"
        return True

    def emit(self, record: logging.LogRecord) -> None:
        self.handle(record)


class _Uncaptured(logging.Filter):
    """Lets a root handler see a captured logger's record only if the record would have been made
    without the capture: at or above the level its logger had (or a level a test set since)."""

    def __init__(self, levels_before: dict[str, int]) -> None:
        super().__init__()
        self._levels_before = levels_before

    def filter(self, record: logging.LogRecord) -> bool:
        name = record.name
        top = name.partition(".")[0]
        if top not in self._levels_before:
            return True
        return record.levelno >= self._threshold(name, top)

    def _threshold(self, name: str, top: str) -> int:
        # The nearest level set on the record's logger or a parent below the captured one, else
        # the captured logger's own (as it was, unless a test changed it since), else the root's.
        loggers = logging.Logger.manager.loggerDict
        while name != top:
            logger = loggers.get(name)
            if isinstance(logger, logging.Logger) and logger.level:
                return logger.level
            name = name.rpartition(".")[0]
        level = logging.getLogger(top).level
        if level == _CAPTURE_LEVEL:
            level = self._levels_before[top]
        return level or logging.getLogger().getEffectiveLevel()


class FailureLog:
    """The captured records of one test. ``start`` before it runs, ``stop`` after its teardown."""

    def __init__(self, names: Iterable[str], capacity: int) -> None:
        self._ring = _Ring(capacity)
        self._loggers = [logging.getLogger(name) for name in names]
        if any("." in logger.name for logger in self._loggers):
            raise ValueError("only top-level loggers can be captured")
        self._levels_before: dict[str, int] = {}
        self._filter = _Uncaptured(self._levels_before)
        self._filtered: list[logging.Handler] = []

    def start(self) -> None:
        for logger in self._loggers:
            self._levels_before[logger.name] = logger.level
            logger.addHandler(self._ring)
            logger.setLevel(_CAPTURE_LEVEL)
        self._filtered = list(logging.getLogger().handlers)
        for handler in self._filtered:
            handler.addFilter(self._filter)

    def stop(self) -> None:
        for handler in self._filtered:
            handler.removeFilter(self._filter)
        self._filtered.clear()
        for logger in self._loggers:
            logger.removeHandler(self._ring)
            # Unless a test set a level of its own meanwhile (caplog restores that one itself).
            if logger.level == _CAPTURE_LEVEL:
                logger.setLevel(self._levels_before[logger.name])

    @property
    def seen(self) -> int:
        return self._ring.seen

    def write(self, path: Path) -> Path:
        """Format the kept records into ``path`` (replacing it); returns ``path``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        formatter = logging.Formatter(LINE_FORMAT)
        records = list(self._ring.records)
        with path.open("w", encoding="utf-8") as f:
            dropped = self._ring.seen - len(records)
            if dropped:
                f.write(f"[{dropped} earlier records dropped: the buffer keeps the last {len(records)}]\n")
            for record in records:
                try:
                    line = formatter.format(record)
                except Exception as exc:  # a record whose arguments no longer format
                    line = f"{record.name} {record.levelname} unformattable record {record.msg!r}: {exc!r}"
                f.write(line + "\n")
        return path


def log_path(root: Path, nodeid: str) -> Path:
    """``test-logs/<node id with every character but [A-Za-z0-9_.-] replaced by _>.log`` under ``root``."""
    return root / "test-logs" / (re.sub(r"[^A-Za-z0-9_.-]", "_", nodeid) + ".log")


def capture_setting() -> tuple[str, ...]:
    """Which loggers to capture: ``STREAMLOOP_TEST_LOGS`` = ``streamloop`` (the default), ``all``
    (``streamloop`` and ``aiokafka``) or ``off``."""
    setting = os.environ.get("STREAMLOOP_TEST_LOGS", "streamloop")
    return {"off": (), "all": ("streamloop", "aiokafka")}.get(setting, ("streamloop",))
