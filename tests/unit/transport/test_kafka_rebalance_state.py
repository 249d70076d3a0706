"""``RebalanceState``: the gate that keeps ``poll`` from returning records of an assignment the
engine has not taken on yet, and the first error of a rebalance callback."""

from __future__ import annotations

import anyio
import pytest

from streamloop.transport.kafka.rebalance import RebalanceState


@pytest.mark.asyncio
async def test_the_gate_is_closed_from_assignment_until_the_listener_is_done() -> None:
    state = RebalanceState("c")
    assert not state.assigning
    state.assignment_started()
    assert state.assigning
    waited = anyio.Event()

    async def wait() -> None:
        await state.assigned(60)
        waited.set()

    # The wait's own bound is far off: only an opened gate ends it within the deadline.
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            assert not waited.is_set()
            state.assignment_finished()
    assert waited.is_set()
    assert not state.assigning


@pytest.mark.asyncio
async def test_waiting_for_the_gate_ends_at_the_timeout() -> None:
    state = RebalanceState("c")
    state.assignment_started()
    with anyio.fail_after(30):  # far above the wait's own bound: only a hang trips it
        await state.assigned(0.01)
    assert state.assigning


@pytest.mark.asyncio
async def test_a_new_assignment_while_the_gate_is_closed_keeps_one_gate() -> None:
    state = RebalanceState("c")
    state.assignment_started()
    state.assignment_started()
    state.assignment_finished()
    assert not state.assigning


def test_the_first_callback_error_is_raised_once() -> None:
    state = RebalanceState("c")
    first, second = ValueError("first"), ValueError("second")
    handed_back = state.callback_failed(first, "assign")
    state.callback_failed(second, "on_assignment")
    assert "assign failed: ValueError: first" in str(handed_back)
    with pytest.raises(ValueError, match="first"):
        state.raise_callback_error()
    state.raise_callback_error()  # reported once
