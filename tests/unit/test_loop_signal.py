"""``LoopSignal``: a waiter on one loop is woken from any thread, and the setter never waits."""

from __future__ import annotations

import threading

import anyio
import anyio.lowlevel
import pytest

from streamloop.errors import IllegalStateError
from streamloop.loop_signal import LoopSignal


def test_a_set_from_another_thread_wakes_the_waiter() -> None:
    async def main() -> None:
        signal = LoopSignal("test")
        signal.bind()
        setter = threading.Thread(target=signal.set)
        setter.start()
        with anyio.fail_after(10):
            await signal.wait()
        await anyio.to_thread.run_sync(setter.join)

    anyio.run(main)


def test_a_set_returns_while_the_owner_loop_is_blocked() -> None:
    async def main() -> None:
        signal = LoopSignal("test")
        signal.bind()
        set_done = threading.Event()

        def setter() -> None:
            signal.set()
            set_done.set()

        thread = threading.Thread(target=setter)
        thread.start()
        # This loop is blocked until the setter returns: a set that waited for the loop
        # (as anyio.from_thread.run_sync does) would never return, and this would time out.
        assert set_done.wait(10)
        with anyio.fail_after(10):
            await signal.wait()
        thread.join()

    anyio.run(main)


def test_a_set_before_bind_is_dropped() -> None:
    async def main() -> None:
        signal = LoopSignal("test")
        signal.set()
        signal.bind()
        await anyio.lowlevel.checkpoint()
        assert not signal.is_set()

    anyio.run(main)


def test_clear_forgets_an_earlier_set_and_a_later_set_still_wakes() -> None:
    async def main() -> None:
        signal = LoopSignal("test")
        signal.bind()
        signal.set()
        with anyio.fail_after(10):
            await signal.wait()
        signal.clear()
        assert not signal.is_set()
        threading.Thread(target=signal.set).start()
        with anyio.fail_after(10):
            await signal.wait()

    anyio.run(main)


def test_a_signal_belongs_to_one_loop() -> None:
    signal = LoopSignal("test")

    async def bind() -> None:
        signal.bind()

    anyio.run(bind)
    with pytest.raises(IllegalStateError, match="second event loop"):
        anyio.run(bind)


def test_a_set_after_the_owner_loop_closed_is_dropped() -> None:
    signal = LoopSignal("test")

    async def bind() -> None:
        signal.bind()

    anyio.run(bind)
    signal.set()  # the loop is closed: no error, nothing to wake
    assert not signal.is_set()
