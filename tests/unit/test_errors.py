"""The shape of the engine's errors, where it carries meaning."""

from __future__ import annotations

import importlib
import pkgutil
import re
import tomllib
import warnings
from pathlib import Path

import streamloop
from streamloop.errors import (
    CommitFailedError,
    MissingExtraError,
    RebalanceInProgressError,
    StreamsError,
    TransportError,
)


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


# Packages with errors of their own: the test kit (``streamloop.testing``) and the optional schema
# registry serdes (``streamloop.schema_registry.errors``, exported from that package).
OWN_ERRORS = ("streamloop.testing", "streamloop.schema_registry")


def _engine_modules() -> list[str]:
    names = [m.name for m in pkgutil.walk_packages(streamloop.__path__, "streamloop.")]
    # The entry points run on import (argument parsing, the demo); they define no errors.
    return [n for n in names if n not in ("streamloop.__main__", "streamloop.demo") and not n.startswith(OWN_ERRORS)]


def _subclasses(cls: type) -> set[type]:
    found: set[type] = set()
    for sub in cls.__subclasses__():
        found |= {sub} | _subclasses(sub)
    return found


def test_every_error_the_engine_raises_lives_in_errors_and_is_exported() -> None:
    """One place to find them (``streamloop.errors``) and one name to catch them by (``from streamloop
    import ...``): an error defined beside the module that raises it is invisible to the user who
    must handle it."""
    for name in _engine_modules():
        # Importing every module loads third-party ones (the console's) whose deprecations are theirs.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            try:
                importlib.import_module(name)
            except MissingExtraError:
                continue  # an optional extra not installed: its module raises no error of ours then
    errors = {cls for cls in _subclasses(StreamsError) if not cls.__module__.startswith(OWN_ERRORS)}
    outside = sorted(f"{cls.__module__}.{cls.__name__}" for cls in errors if cls.__module__ != "streamloop.errors")
    assert outside == []
    unexported = sorted(cls.__name__ for cls in errors if getattr(streamloop, cls.__name__, None) is not cls)
    assert unexported == []
