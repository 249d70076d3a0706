"""Fixtures the integration tests of several files share, and the engine's DEBUG log of each
failed test (``test-logs/<node id>.log`` at the repository root, named in the failure report)."""

from __future__ import annotations

import collections
import gc
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

import streamloop.tasks.loops as loops_module
from tests.support.failure_logs import FailureLog, capture_setting, log_path

# Records kept per test: a test logs a few hundred to 2,000 (with aiokafka); this is minutes of the busiest.
LOG_CAPACITY = 100_000
_failure_log = pytest.StashKey[FailureLog]()
_failed_runs = pytest.StashKey[collections.Counter[str]]()  # per node id, in this session
_log_written = pytest.StashKey[Path]()  # the log of the test's run in progress


@pytest.fixture(autouse=True)
def engine_log(request: pytest.FixtureRequest) -> Iterator[None]:
    """Capture the engine's log records at DEBUG for the test; ``pytest_runtest_makereport`` writes
    them out if any phase of the test fails. ``STREAMLOOP_TEST_LOGS=off`` turns it off."""
    names = capture_setting()
    if not names:
        yield
        return
    log = FailureLog(names, LOG_CAPACITY)
    request.node.stash[_failure_log] = log
    log.start()
    try:
        yield
    finally:
        log.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    log = item.stash.get(_failure_log, None)
    if log is None:
        return report
    if report.failed:
        # A failed teardown after a failed call rewrites the call's log (it holds more). A test
        # repeated in one session (``--keep-duplicates``) keeps a log per failed run.
        path = item.stash.get(_log_written, None)
        if path is None:
            runs = item.config.stash.setdefault(_failed_runs, collections.Counter())
            runs[item.nodeid] += 1
            path = log_path(item.config.rootpath, item.nodeid)
            if runs[item.nodeid] > 1:
                path = path.with_suffix(f".{runs[item.nodeid]}.log")
            item.stash[_log_written] = path
        log.write(path)
        report.sections.append(("engine log", f"{log.seen} records; the last ones are in {path}"))
    if report.when == "teardown":
        del item.stash[_failure_log]  # the records go with the test
        if _log_written in item.stash:
            del item.stash[_log_written]
    return report


@pytest.fixture
def windows(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The run loop each task chose: a ``BatchWindow`` on the Spark bulk path, else the per-record one."""
    chosen: list[Any] = []
    original = loops_module.bulk_window

    def spy(task: Any, spark_jobs: Any) -> Any:
        window = original(task, spark_jobs)
        chosen.append(window)
        return window

    monkeypatch.setattr(loops_module, "bulk_window", spy)
    return chosen


# What an aiokafka connection left open by a client whose start or request failed against a frozen
# or vanished broker says when it is collected after its event loop closed (aio-libs/aiokafka#715,
# open): the writer, the transport and the socket each warn. Fault tests cause exactly that.
# (The "." after "in" stands for the colon, which a warning filter cannot hold.)
LEAKED_CONNECTION = ("ignore:Exception ignored in. <(function StreamWriter.__del__|function "
                     "_SelectorTransport.__del__|socket.socket ):pytest.PytestUnraisableExceptionWarning")


@pytest.fixture
def collect_leaked_connections() -> Iterator[None]:
    """For fault tests: collect what the fault leaked before the test ends, so that it is reported
    (and filtered, ``LEAKED_CONNECTION``) in the test that caused it, not in whichever test the
    garbage collector happens to run in next (on another worker's schedule under xdist)."""
    yield
    gc.collect()
