"""A thread's rebalance metrics, and the one warning of a client that stays REBALANCING too long."""

from __future__ import annotations

import logging

import pytest

from streamloop.client_states import ClientState
from streamloop.logcontext import LogContext
from streamloop.threads.rebalances import RebalanceWatch, ThreadRebalances


class Clock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


def test_a_rebalance_lasts_from_its_join_to_its_assignment() -> None:
    clock = Clock()
    rebalances = ThreadRebalances("t1", clock)
    rebalances.started(0, "first join")
    clock.now += 150
    rebalances.started(1, "first join")  # the transport's first JoinGroup: the same rebalance
    clock.now += 50
    rebalances.completed(4)
    clock.now += 1_000
    rebalances.started(2, "t2 started join 1")
    clock.now += 20
    rebalances.completed(5)
    clock.now += 500
    metrics = rebalances.metrics()
    assert metrics["rebalance-total"] == 2
    assert metrics["rebalance-latency-last"] == 20
    assert metrics["rebalance-latency-max"] == 200
    assert metrics["rebalance-latency-avg"] == 110
    assert metrics["last-rebalance-seconds-ago"] == 0.5
    assert [(r.join, r.generation, r.reason) for r in rebalances.since(0)] == [
        (1, 4, "first join"), (2, 5, "t2 started join 1")]


def test_no_rebalance_yet_reads_as_never() -> None:
    assert ThreadRebalances("t1", Clock()).metrics()["last-rebalance-seconds-ago"] == -1


@pytest.fixture
def warnings(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING, logger="test.rebalances")
    return caplog


def test_a_client_rebalancing_past_its_bound_warns_once_with_each_generation(
        warnings: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    t1, t2 = ThreadRebalances("t1", clock), ThreadRebalances("t2", clock)
    watch = RebalanceWatch(30_000, clock, lambda: [t1, t2], LogContext(logging.getLogger("test.rebalances"), ""))
    watch.state_changed(ClientState.CREATED, ClientState.REBALANCING)
    for generation in range(1, 6):
        t1.started(generation, "t2 started join")
        t2.started(generation, "the group coordinator started a rebalance")
        clock.now += 5_000
        t1.completed(generation)
        watch.check()
    assert warnings.records == []
    clock.now += 5_001
    t2.started(9, "still waiting")
    watch.check()
    watch.check()
    assert len(warnings.records) == 1
    message = warnings.records[0].getMessage()
    assert "REBALANCING for 30.0 s" in message and "5 generations passed" in message
    assert "t1 join 3 (t2 started join) -> generation 3" in message
    assert "t2 join 9 (still waiting) -> still joining" in message


def test_the_warning_comes_again_only_after_the_client_settled_in_between(
        warnings: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    watch = RebalanceWatch(1_000, clock, list, LogContext(logging.getLogger("test.rebalances"), ""))
    watch.state_changed(ClientState.CREATED, ClientState.REBALANCING)
    clock.now += 2_000
    watch.check()
    watch.state_changed(ClientState.REBALANCING, ClientState.RUNNING)
    clock.now += 2_000
    watch.check()  # RUNNING: nothing to say
    watch.state_changed(ClientState.RUNNING, ClientState.REBALANCING)
    clock.now += 999
    watch.check()
    assert len(warnings.records) == 1
    clock.now += 1
    watch.check()
    assert len(warnings.records) == 2
