"""``StateMachine``: transitions follow the table, listeners hear them, waits end on a state or a deadline."""

from __future__ import annotations

import asyncio
import logging
import threading
from enum import Enum

import pytest

from streamloop.lifecycle import IllegalTransitionError, StateMachine

log = logging.getLogger("tests.lifecycle")


class Phase(Enum):
    CREATED = 1
    RUNNING = 2
    PENDING_SHUTDOWN = 3
    DEAD = 4


ALLOWED = {
    Phase.CREATED: {Phase.RUNNING, Phase.PENDING_SHUTDOWN},
    Phase.RUNNING: {Phase.PENDING_SHUTDOWN},
    Phase.PENDING_SHUTDOWN: {Phase.DEAD},
    Phase.DEAD: set(),
}

DEADLINE_S = 10.0


@pytest.fixture
def machine() -> StateMachine[Phase]:
    return StateMachine("stream-thread [t-1]", Phase.CREATED, ALLOWED, log)


class TransitionOnRelease:
    """Makes ``new`` happen on another OS thread, at the moment the caller releases the machine's lock.

    The caller holds ``machine.lock`` while it starts waiting; the other thread is
    blocked on that lock until then, so the transition cannot happen before the
    wait begins.
    """

    def __init__(self, machine: StateMachine[Phase], new: Phase) -> None:
        self._machine = machine
        self._new = new
        self.thread = threading.Thread(target=self._run, name="transition", daemon=True)

    def _run(self) -> None:
        with self._machine.lock:
            self._machine.transition_to(self._new)

    def start(self) -> None:
        self.thread.start()

    def join(self) -> None:
        self.thread.join(DEADLINE_S)
        assert not self.thread.is_alive()


# -- transitions ---------------------------------------------------------------


def test_machine_starts_in_its_initial_state(machine: StateMachine[Phase]) -> None:
    assert machine.state is Phase.CREATED


def test_allowed_transition_moves_and_returns_the_old_state(machine: StateMachine[Phase]) -> None:
    old = machine.transition_to(Phase.RUNNING)

    assert old is Phase.CREATED
    assert machine.state is Phase.RUNNING


def test_illegal_transition_raises_and_keeps_the_state(machine: StateMachine[Phase]) -> None:
    with pytest.raises(IllegalTransitionError) as caught:
        machine.transition_to(Phase.DEAD)

    assert machine.state is Phase.CREATED
    assert (caught.value.old, caught.value.new) == (Phase.CREATED, Phase.DEAD)
    assert str(caught.value) == "stream-thread [t-1]: illegal state transition from CREATED to DEAD"


def test_transition_to_the_same_state_is_illegal_unless_the_table_allows_it(
    machine: StateMachine[Phase],
) -> None:
    with pytest.raises(IllegalTransitionError):
        machine.transition_to(Phase.CREATED)


def test_terminal_state_allows_no_transition(machine: StateMachine[Phase]) -> None:
    machine.transition_to(Phase.PENDING_SHUTDOWN)
    machine.transition_to(Phase.DEAD)

    for phase in Phase:
        assert not machine.can_transition_to(phase)


def test_can_transition_to_follows_the_table(machine: StateMachine[Phase]) -> None:
    assert machine.can_transition_to(Phase.RUNNING)
    assert not machine.can_transition_to(Phase.DEAD)


def test_maybe_transition_to_moves_when_allowed(machine: StateMachine[Phase]) -> None:
    assert machine.maybe_transition_to(Phase.RUNNING) is True
    assert machine.state is Phase.RUNNING


def test_maybe_transition_to_does_nothing_when_illegal(machine: StateMachine[Phase]) -> None:
    assert machine.maybe_transition_to(Phase.DEAD) is False
    assert machine.state is Phase.CREATED


def test_transition_is_logged_with_both_state_names(
    machine: StateMachine[Phase], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger=log.name):
        machine.transition_to(Phase.RUNNING)

    assert [r.getMessage() for r in caplog.records] == ["State transition from CREATED to RUNNING"]


# -- listeners -------------------------------------------------------------------


def test_listener_is_called_with_old_and_new_state(machine: StateMachine[Phase]) -> None:
    heard: list[tuple[Phase, Phase]] = []
    machine.add_listener(lambda old, new: heard.append((old, new)))

    machine.transition_to(Phase.RUNNING)
    machine.transition_to(Phase.PENDING_SHUTDOWN)

    assert heard == [(Phase.CREATED, Phase.RUNNING), (Phase.RUNNING, Phase.PENDING_SHUTDOWN)]


def test_listener_sees_the_new_state_already_set(machine: StateMachine[Phase]) -> None:
    seen: list[Phase] = []
    machine.add_listener(lambda _old, _new: seen.append(machine.state))

    machine.transition_to(Phase.RUNNING)

    assert seen == [Phase.RUNNING]


def test_listeners_are_called_in_the_order_they_were_added(machine: StateMachine[Phase]) -> None:
    order: list[str] = []
    machine.add_listener(lambda _o, _n: order.append("first"))
    machine.add_listener(lambda _o, _n: order.append("second"))

    machine.transition_to(Phase.RUNNING)

    assert order == ["first", "second"]


def test_removed_listener_is_not_called(machine: StateMachine[Phase]) -> None:
    heard: list[Phase] = []

    def listener(_old: Phase, new: Phase) -> None:
        heard.append(new)

    machine.add_listener(listener)
    machine.remove_listener(listener)
    machine.transition_to(Phase.RUNNING)

    assert heard == []


def test_removing_an_unknown_listener_is_a_no_op(machine: StateMachine[Phase]) -> None:
    machine.remove_listener(lambda _o, _n: None)


def test_illegal_transition_does_not_notify_listeners(machine: StateMachine[Phase]) -> None:
    heard: list[Phase] = []
    machine.add_listener(lambda _o, new: heard.append(new))

    with pytest.raises(IllegalTransitionError):
        machine.transition_to(Phase.DEAD)

    assert heard == []


# -- wait_for (blocking) ------------------------------------------------------------


def test_wait_for_returns_at_once_when_already_in_a_wanted_state(machine: StateMachine[Phase]) -> None:
    assert machine.wait_for({Phase.CREATED, Phase.DEAD}, timeout=0) is True


def test_wait_for_returns_when_another_thread_reaches_the_state(machine: StateMachine[Phase]) -> None:
    transition = TransitionOnRelease(machine, Phase.RUNNING)
    with machine.lock:
        transition.start()
        reached = machine.wait_for({Phase.RUNNING}, timeout=DEADLINE_S)
    transition.join()

    assert reached is True


def test_wait_for_keeps_waiting_through_states_it_was_not_asked_for(machine: StateMachine[Phase]) -> None:
    def run() -> None:
        with machine.lock:
            machine.transition_to(Phase.RUNNING)
        with machine.lock:
            machine.transition_to(Phase.PENDING_SHUTDOWN)
        with machine.lock:
            machine.transition_to(Phase.DEAD)

    thread = threading.Thread(target=run, daemon=True)
    with machine.lock:
        thread.start()
        reached = machine.wait_for({Phase.DEAD}, timeout=DEADLINE_S)
    thread.join(DEADLINE_S)

    assert reached is True
    assert machine.state is Phase.DEAD


def test_wait_for_returns_false_on_timeout(machine: StateMachine[Phase]) -> None:
    assert machine.wait_for({Phase.RUNNING}, timeout=0.01) is False
    assert machine.state is Phase.CREATED


# -- wait_for_async ------------------------------------------------------------------


@pytest.mark.asyncio
async def test_wait_for_async_returns_at_once_when_already_in_a_wanted_state(
    machine: StateMachine[Phase],
) -> None:
    assert await machine.wait_for_async({Phase.CREATED}, timeout=0) is True


@pytest.mark.asyncio
async def test_wait_for_async_returns_when_the_loop_itself_transitions(machine: StateMachine[Phase]) -> None:
    waiter = asyncio.create_task(machine.wait_for_async({Phase.RUNNING}, timeout=DEADLINE_S))
    await asyncio.sleep(0)  # one step: the waiter registers and suspends

    machine.transition_to(Phase.RUNNING)

    assert await waiter is True


@pytest.mark.asyncio
async def test_wait_for_async_returns_when_another_os_thread_transitions(machine: StateMachine[Phase]) -> None:
    transition = TransitionOnRelease(machine, Phase.RUNNING)
    with machine.lock:
        transition.start()
        waiter = asyncio.create_task(machine.wait_for_async({Phase.RUNNING}, timeout=DEADLINE_S))
        # One step: the waiter registers its listener under the (reentrant) lock and suspends.
        await asyncio.sleep(0)
        assert not waiter.done()
    reached = await waiter
    transition.join()

    assert reached is True


@pytest.mark.asyncio
async def test_wait_for_async_does_not_block_the_loop(machine: StateMachine[Phase]) -> None:
    waiter = asyncio.create_task(machine.wait_for_async({Phase.RUNNING}, timeout=DEADLINE_S))
    other = asyncio.create_task(asyncio.sleep(0, result="ran"))

    assert await other == "ran"
    assert not waiter.done()
    machine.transition_to(Phase.RUNNING)
    assert await waiter is True


@pytest.mark.asyncio
async def test_wait_for_async_returns_false_on_timeout(machine: StateMachine[Phase]) -> None:
    assert await machine.wait_for_async({Phase.RUNNING}, timeout=0.01) is False
