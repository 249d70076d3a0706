"""The supervisor of failed stream threads: what the handler's answer becomes, and the replacement back-off."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from streamloop.handlers import StreamThreadExceptionResponse as Response
from streamloop.threads.supervisor import ReplacementBackoff, Supervisor


@dataclass
class FakeThread:
    name: str = "app-1-StreamThread-1"


@dataclass
class Actions:
    """What the supervisor asked the client to do, in order."""

    done: list[tuple[str, Any]] = field(default_factory=list)
    replacement: str | None = "app-1-StreamThread-2"

    def replace(self, thread: FakeThread) -> str | None:
        self.done.append(("replace", thread.name))
        return self.replacement

    def shutdown_thread(self, thread: FakeThread) -> None:
        self.done.append(("shutdown_thread", thread.name))

    def shutdown_client(self) -> None:
        self.done.append(("shutdown_client", None))

    def shutdown_application(self, thread: FakeThread) -> None:
        self.done.append(("shutdown_application", thread.name))


def make_supervisor(
    handler: Callable[[BaseException], Any] | None,
    actions: Actions | None = None,
    closing: threading.Event | None = None,
    backoff: ReplacementBackoff | None = None,
) -> Supervisor:
    actions = actions or Actions()
    return Supervisor(
        handler,
        actions.replace,  # type: ignore[arg-type]
        actions.shutdown_thread,  # type: ignore[arg-type]
        actions.shutdown_client,
        actions.shutdown_application,  # type: ignore[arg-type]
        closing or threading.Event(),
        backoff or ReplacementBackoff(base_s=1.0, cap_s=30.0),
    )


FAILURE = RuntimeError("poison record")


# -- ReplacementBackoff ------------------------------------------------------------------------


def test_first_replacement_is_immediate() -> None:
    assert ReplacementBackoff(base_s=1.0, cap_s=8.0).next_delay(now=100.0) == 0.0


def test_replacements_in_a_row_wait_the_base_then_double() -> None:
    backoff = ReplacementBackoff(base_s=1.0, cap_s=100.0)

    delays = [backoff.next_delay(now=100.0 + i) for i in range(5)]

    assert delays == [0.0, 1.0, 2.0, 4.0, 8.0]


def test_replacement_delay_stops_growing_at_the_cap() -> None:
    backoff = ReplacementBackoff(base_s=1.0, cap_s=5.0)

    delays = [backoff.next_delay(now=100.0 + i) for i in range(6)]

    assert delays == [0.0, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_failure_after_a_quiet_period_is_replaced_immediately_again() -> None:
    backoff = ReplacementBackoff(base_s=1.0, cap_s=8.0, reset_after_s=60.0)
    for second in range(3):
        backoff.next_delay(now=100.0 + second)

    assert backoff.next_delay(now=102.0 + 60.5) == 0.0
    assert backoff.next_delay(now=163.0) == 1.0


def test_failure_within_the_quiet_period_keeps_the_streak() -> None:
    backoff = ReplacementBackoff(base_s=1.0, cap_s=8.0, reset_after_s=60.0)
    backoff.next_delay(now=100.0)

    assert backoff.next_delay(now=159.0) == 1.0


def test_quiet_period_counts_from_the_last_failure() -> None:
    backoff = ReplacementBackoff(base_s=1.0, cap_s=8.0, reset_after_s=60.0)
    for now in (0.0, 50.0, 100.0):  # never 60 s apart
        backoff.next_delay(now)

    assert backoff.next_delay(now=150.0) == 4.0


# -- Supervisor.decide -----------------------------------------------------------------------------


def test_without_a_handler_the_client_shuts_down() -> None:
    assert make_supervisor(None).decide(FakeThread(), FAILURE) is Response.SHUTDOWN_CLIENT  # type: ignore[arg-type]


@pytest.mark.parametrize("answer", list(Response))
def test_handlers_answer_is_the_decision(answer: Response) -> None:
    supervisor = make_supervisor(lambda exc: answer)

    assert supervisor.decide(FakeThread(), FAILURE) is answer  # type: ignore[arg-type]


def test_handler_gets_the_threads_exception() -> None:
    seen: list[BaseException] = []

    def handler(exc: BaseException) -> Response:
        seen.append(exc)
        return Response.REPLACE_THREAD

    make_supervisor(handler).decide(FakeThread(), FAILURE)  # type: ignore[arg-type]

    assert seen == [FAILURE]


def test_deciding_does_not_act() -> None:
    actions = Actions()
    supervisor = make_supervisor(lambda exc: Response.SHUTDOWN_APPLICATION, actions)

    supervisor.decide(FakeThread(), FAILURE)  # type: ignore[arg-type]

    assert actions.done == []


def test_handler_that_raises_shuts_the_client_down_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    def broken(exc: BaseException) -> Response:
        raise KeyError("handler bug")

    with caplog.at_level(logging.ERROR, logger="streamloop.threads.supervisor"):
        response = make_supervisor(broken).decide(FakeThread(), FAILURE)  # type: ignore[arg-type]

    assert response is Response.SHUTDOWN_CLIENT
    [record] = caplog.records
    assert record.levelno == logging.ERROR
    assert "stream-thread [app-1-StreamThread-1]" in record.getMessage()
    assert "KeyError('handler bug')" in record.getMessage()
    assert "RuntimeError('poison record')" in record.getMessage()


@pytest.mark.parametrize("answer", [None, "replace_thread", True, 1])
def test_handler_answer_that_is_not_a_response_shuts_the_client_down_and_is_logged(
    answer: object, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="streamloop.threads.supervisor"):
        response = make_supervisor(lambda exc: answer).decide(FakeThread(), FAILURE)  # type: ignore[arg-type]

    assert response is Response.SHUTDOWN_CLIENT
    [record] = caplog.records
    assert record.levelno == logging.ERROR
    assert f"returned {answer!r}, not a StreamThreadExceptionResponse" in record.getMessage()


# -- Supervisor.on_failure -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "action"),
    [
        (Response.REPLACE_THREAD, ("replace", "app-1-StreamThread-1")),
        (Response.SHUTDOWN_THREAD, ("shutdown_thread", "app-1-StreamThread-1")),
        (Response.SHUTDOWN_CLIENT, ("shutdown_client", None)),
        (Response.SHUTDOWN_APPLICATION, ("shutdown_application", "app-1-StreamThread-1")),
    ],
)
def test_on_failure_carries_out_the_decision(answer: Response, action: tuple[str, Any]) -> None:
    actions = Actions()
    supervisor = make_supervisor(lambda exc: answer, actions)

    assert supervisor.on_failure(FakeThread(), FAILURE) is answer  # type: ignore[arg-type]
    assert actions.done == [action]


def test_replacement_waiting_for_its_back_off_is_dropped_when_the_client_closes() -> None:
    actions = Actions()
    closing = threading.Event()
    closing.set()
    supervisor = make_supervisor(lambda exc: Response.REPLACE_THREAD, actions, closing,
                                 ReplacementBackoff(base_s=30.0, cap_s=30.0))
    supervisor.on_failure(FakeThread(), FAILURE)  # type: ignore[arg-type]

    # The second failure in a row would wait 30 s; closing ends the wait without a replacement.
    supervisor.on_failure(FakeThread(), FAILURE)  # type: ignore[arg-type]

    assert actions.done == [("replace", "app-1-StreamThread-1")]
