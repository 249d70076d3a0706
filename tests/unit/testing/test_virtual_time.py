"""``VirtualTimeLoop``: timers fire at once, in order, and the clock moves by what they asked."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from streamloop.testing.virtual_time import VirtualTimeLoop


@pytest.fixture
def loop():
    loop = VirtualTimeLoop()
    yield loop
    loop.close()


def test_a_long_sleep_takes_no_real_time_and_moves_the_clock_by_its_length(loop) -> None:
    started = time.monotonic()
    loop.run_until_complete(asyncio.sleep(3_600))
    assert time.monotonic() - started < 1
    assert loop.time() == pytest.approx(3_600)
    assert loop.time_ms() == 3_600_000


def test_timers_fire_in_the_order_of_their_deadlines(loop) -> None:
    fired: list[str] = []

    async def after(seconds: float, name: str) -> None:
        await asyncio.sleep(seconds)
        fired.append(name)

    async def main() -> None:
        await asyncio.gather(after(30, "c"), after(10, "a"), after(20, "b"))

    loop.run_until_complete(main())
    assert fired == ["a", "b", "c"]
    assert loop.time() == pytest.approx(30)


def test_a_wait_that_nothing_ends_times_out_at_once(loop) -> None:
    async def main() -> None:
        await asyncio.wait_for(asyncio.Event().wait(), 600)

    with pytest.raises(TimeoutError):
        loop.run_until_complete(main())
    assert loop.time() == pytest.approx(600)


def test_while_a_socket_is_open_time_runs_at_real_speed(loop) -> None:
    ours, theirs = socket.socketpair()

    async def main() -> None:
        reader, writer = await asyncio.open_connection(sock=ours)
        try:
            # Nothing arrives: the timeout is a real 50 ms, not a jump.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(reader.read(1), 0.05)
        finally:
            writer.close()
            await writer.wait_closed()

    started = time.monotonic()
    try:
        loop.run_until_complete(main())
    finally:
        theirs.close()
    assert time.monotonic() - started >= 0.04
    assert loop.time() < 5
