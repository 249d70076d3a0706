"""The shape of the engine's errors, where it carries meaning."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from engine.errors import CommitFailedError, RebalanceInProgressError, TransportError


def test_a_rebalance_in_progress_is_not_a_failed_commit() -> None:
    """A failed commit means the partitions moved on; a rebalance in progress means the member still
    owns them and commits after it: opposites, so siblings (as in Kafka's clients), and an
    ``except CommitFailedError`` never takes one for the other."""
    assert not issubclass(RebalanceInProgressError, CommitFailedError)
    assert issubclass(RebalanceInProgressError, TransportError) and issubclass(CommitFailedError, TransportError)
    assert RebalanceInProgressError("waits").retriable


def test_the_declared_anyio_has_what_the_engine_uses() -> None:
    """The chunk loop's lock is ``anyio.Lock(fast_acquire=True)``, new in anyio 4.5."""
    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    declared = next(d for d in project["project"]["dependencies"] if d.startswith("anyio"))
    match = re.search(r">=\s*(\d+)\.(\d+)", declared)
    assert match is not None and (int(match[1]), int(match[2])) >= (4, 5), declared
