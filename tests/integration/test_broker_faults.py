"""The broker itself goes away (stopped and started again on the same data and port) or freezes
(SIGSTOP): retriable errors are retried under task.timeout.ms, as in Kafka Streams.

These tests stop their own broker (module-scoped), never the session's shared one. Client
timeouts are short (request.timeout.ms 3 000), so each fault shows up within seconds.
``STREAMLOOP_LONG_FAULTS=1`` keeps the broker down 30 s instead of 10 s in the bounce tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from streamloop.errors import StartupTimeoutError, TaskTimeoutError
from tests.integration.conftest import LEAKED_CONNECTION
from tests.support import broker_faults
from tests.support.broker_faults import AT_LEAST_ONCE, EXACTLY_ONCE
from tests.support.kafka_broker import KafkaBroker

pytestmark = [pytest.mark.kafka, pytest.mark.asyncio, pytest.mark.timeout(180),
              pytest.mark.usefixtures("collect_leaked_connections"), pytest.mark.filterwarnings(LEAKED_CONNECTION)]

DOWN_S = 30.0 if os.environ.get("STREAMLOOP_LONG_FAULTS") else 10.0


@pytest.fixture(scope="module")
def broker() -> Iterator[KafkaBroker]:
    with KafkaBroker() as own:
        yield own


@pytest.mark.parametrize("guarantee", [AT_LEAST_ONCE, EXACTLY_ONCE])
async def test_a_broker_bounce_shorter_than_the_deadlines_loses_nothing_and_no_thread(
        broker: KafkaBroker, guarantee: str) -> None:
    # A small back-pressure limit: a task revived after the outage seeks back in its transactional
    # initialisation while back-pressure has paused its partition (the stall of issue #19 item 2).
    figures = await broker_faults.bounce(broker, guarantee=guarantee, down_s=DOWN_S, task_timeout_ms=120_000,
                                         buffered_per_partition=100)
    assert figures["error"] is None
    assert figures["state"] == "RUNNING"
    assert figures["thread_deaths"] == 0
    assert figures["stalled"] == 0, figures
    assert figures["lost"] == 0
    if guarantee == EXACTLY_ONCE:
        assert figures["duplicates"] == 0


# The exactly-once run waits out its transaction timeouts too (about 35 s): `make test-slow` runs it.
@pytest.mark.parametrize("guarantee", [AT_LEAST_ONCE, pytest.param(EXACTLY_ONCE, marks=pytest.mark.slow)])
async def test_a_broker_down_longer_than_task_timeout_fails_the_thread_with_task_timeout_error(
        broker: KafkaBroker, guarantee: str) -> None:
    figures = await broker_faults.outage_past_task_timeout(broker, guarantee=guarantee, task_timeout_ms=4_000)
    assert figures["state"] == "ERROR"
    assert figures["error_type"] is TaskTimeoutError, figures["error"]
    assert "4000 ms" in figures["error"] and "task.timeout.ms" in figures["error"]


async def test_a_frozen_broker_is_ridden_out(broker: KafkaBroker) -> None:
    figures = await broker_faults.pause(broker, frozen_s=2 * broker_faults.REQUEST_TIMEOUT_MS / 1000)
    assert figures["error"] is None
    assert figures["state"] == "RUNNING"
    assert figures["thread_deaths"] == 0
    assert figures["stalled"] == 0, figures
    assert figures["lost"] == 0


async def test_a_thread_added_while_the_broker_is_down_starts_once_it_is_back(broker: KafkaBroker) -> None:
    figures = await broker_faults.thread_added_during_outage(broker, down_s=6.0, task_timeout_ms=60_000)
    assert figures["added"] is not None
    assert figures["error"] is None
    assert figures["thread_deaths"] == 0
    assert figures["alive_threads"] == 2
    assert figures["state"] == "RUNNING"
    assert figures["lost"] == 0


async def test_a_thread_start_up_longer_than_task_timeout_fails_with_startup_timeout_error(
        broker: KafkaBroker) -> None:
    figures = await broker_faults.thread_added_during_long_outage(broker, task_timeout_ms=3_000)
    assert figures["error_type"] is StartupTimeoutError, figures["error"]
    assert "3000 ms" in figures["error"] and "task.timeout.ms" in figures["error"]
