"""The application killed with SIGKILL at random points, again and again, and restarted each time
(issue #19's process-kill faults). An independent reader checks the output: nothing lost, under
exactly-once nothing duplicated (``read_committed``), and no stall: after the last restart the
group's committed offsets reach the end of the input.

``buffered.records.per.partition`` is 10, so back-pressure pauses the partitions while a restarted
task initialises its transactional.id. ``STREAMLOOP_KILLS`` sets the number of kills (default 2;
20 for a long run), ``STREAMLOOP_KILL_SEED`` the seed of the kill points.
"""

from __future__ import annotations

import os

import pytest

from tests.support.crash_restore import kill_mid_stream_and_restart
from tests.support.process_kills import KillReport, kill_and_restart

pytestmark = [pytest.mark.kafka, pytest.mark.asyncio]

KILLS = int(os.environ.get("STREAMLOOP_KILLS", "2"))
SEED = int(os.environ.get("STREAMLOOP_KILL_SEED", "19"))
TIMEOUT = 60 + 45 * KILLS


def described(report: KillReport) -> str:
    return f"seed {SEED}: {report.figures()}\n{report.stderr_tail}"


@pytest.mark.timeout(TIMEOUT)
async def test_exactly_once_loses_and_duplicates_nothing_and_drains_after_repeated_sigkills(
        kafka_bootstrap: str) -> None:
    report = await kill_and_restart(kafka_bootstrap, KILLS, "exactly_once_v2", seed=SEED)

    assert report.stalls == 0, described(report)
    assert (report.lost, report.duplicates) == (0, 0), described(report)
    assert report.records_out == report.records_in


@pytest.mark.timeout(TIMEOUT)
async def test_at_least_once_loses_nothing_and_drains_after_repeated_sigkills(kafka_bootstrap: str) -> None:
    report = await kill_and_restart(kafka_bootstrap, KILLS, "at_least_once", seed=SEED)

    assert report.stalls == 0, described(report)
    assert report.lost == 0, described(report)
    assert report.records_out == report.records_in + report.duplicates  # counted, and allowed


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize(("ordering", "count"), [("unordered", False), ("key", True)])
async def test_records_in_flight_under_exactly_once_lose_and_duplicate_nothing_after_sigkills(
        kafka_bootstrap: str, ordering: str, count: bool) -> None:
    """Records in flight (8 per task, finishing out of order) under exactly-once: each record's
    output, changelog updates included, is held until the commit's watermark covers it, so a
    transaction holds exactly the output of the offsets it commits. Relaying (unordered) and
    counting into a store (key order)."""
    report = await kill_and_restart(kafka_bootstrap, KILLS, "exactly_once_v2", seed=SEED, in_flight=8,
                                    ordering=ordering, count=count)

    assert report.stalls == 0, described(report)
    assert (report.lost, report.duplicates) == (0, 0), described(report)
    assert report.records_out == report.records_in


@pytest.mark.timeout(240)
@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once_v2"])
async def test_a_sigkill_mid_stream_restores_only_the_changelog_tail_and_counts_stay_exact(
        kafka_bootstrap: str, guarantee: str) -> None:
    """Issue #35: the app counting into a RocksDB store dies with SIGKILL mid-stream and restarts on
    its state directory. Its store is the last commit's and its checkpoint names where the changelog
    goes on from: the restore starts there (not at 0), applies exactly the updates of committed
    records past it (the listener's ``total_restored`` says so), and every count stays exact."""
    report = await kill_mid_stream_and_restart(kafka_bootstrap, guarantee, records=4000, kill_after=1500,
                                               commit_interval_ms=100, io_ms=0.5)
    figures = report.figures()

    assert report.exact, figures
    assert report.restore_start == report.checkpoint_at_kill > 0, figures
    assert report.restore_end >= report.changelog_at_kill, figures
    assert report.restored == report.should_restore, figures
    # A tail: less than the changelog the killed app had written (a full restore reads all of it).
    assert report.restore_end - report.restore_start < report.changelog_at_kill, figures
