"""Checked, logged state machines for the client, its threads and its tasks.

A machine is an ``Enum`` of states plus a table of allowed successors, written
once next to the enum. ``transition_to`` checks the move against the table,
logs "State transition from X to Y" and tells the listeners. Waiting for a state
works from any thread (``wait_for``) and from any event loop (``wait_for_async``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Mapping
from enum import Enum
from typing import Generic, TypeVar

import anyio

from streamloop.loop_signal import LoopSignal

S = TypeVar("S", bound=Enum)

Listener = Callable[[S, S], None]


class IllegalTransitionError(RuntimeError):
    def __init__(self, owner: str, old: Enum, new: Enum) -> None:
        super().__init__(f"{owner}: illegal state transition from {old.name} to {new.name}")
        self.old = old
        self.new = new


class StateMachine(Generic[S]):
    """One object's state, guarded by a lock; transitions follow ``allowed``."""

    def __init__(
        self,
        owner: str,
        initial: S,
        allowed: Mapping[S, Collection[S]],
        logger: logging.Logger | logging.LoggerAdapter[logging.Logger],
        level: int = logging.INFO,
    ) -> None:
        """``level``: what transitions are logged at; DEBUG for the many small machines (tasks, members)."""
        self._owner = owner
        self._level = level
        self._state = initial
        self._allowed = allowed
        self._log = logger
        self._cond = threading.Condition(threading.RLock())
        self._listeners: list[Listener[S]] = []

    @property
    def state(self) -> S:
        return self._state

    @property
    def lock(self) -> threading.Condition:
        """Held while a transition and its listeners run; take it to read-then-act atomically."""
        return self._cond

    def add_listener(self, listener: Listener[S]) -> None:
        with self._cond:
            self._listeners.append(listener)

    def remove_listener(self, listener: Listener[S]) -> None:
        with self._cond:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def can_transition_to(self, new: S) -> bool:
        return new in self._allowed[self._state]

    def transition_to(self, new: S) -> S:
        """Move to ``new``; raises ``IllegalTransitionError`` if the table forbids it."""
        with self._cond:
            old = self._state
            if new not in self._allowed[old]:
                raise IllegalTransitionError(self._owner, old, new)
            self._state = new
            self._log.log(self._level, "State transition from %s to %s", old.name, new.name)
            self._cond.notify_all()
            listeners = list(self._listeners)
            for listener in listeners:
                listener(old, new)
            return old

    def maybe_transition_to(self, new: S) -> bool:
        """Move to ``new`` if allowed; return whether it moved."""
        with self._cond:
            if new not in self._allowed[self._state]:
                return False
            self.transition_to(new)
            return True

    def wait_for(self, states: Collection[S], timeout: float | None) -> bool:
        """Block the calling thread until the state is one of ``states``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._state not in states:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    async def wait_for_async(self, states: Collection[S], timeout: float | None) -> bool:  # noqa: ASYNC109 - as wait_for
        """Wait on the calling event loop (never blocking it) until the state is in ``states``."""
        reached = LoopSignal(f"{self._owner} waiting for a state")
        reached.bind()

        def on_change(_old: S, new: S) -> None:
            if new in states:
                # Under this machine's lock: only enqueues the wake-up, never waits for the loop.
                reached.set()

        with self._cond:
            if self._state in states:
                return True
            self._listeners.append(on_change)
        try:
            with anyio.move_on_after(math.inf if timeout is None else timeout):
                await reached.wait()
                return True
            return self._state in states
        finally:
            self.remove_listener(on_change)
