"""What the late broker's proxy saw of the group protocol, for tests to assert on.

One :class:`GroupCall` per JoinGroup, SyncGroup and LeaveGroup request, completed with the
broker's answer and with when the proxy passed that answer on. :class:`GroupRecord` is written
by the proxy's thread and read by tests from any thread; every read returns a snapshot.

"Stable" is the group as the proxy sees it: a generation is stable once every member the
leader's JoinGroup answer listed has been *handed* its successful SyncGroup answer, and no
JoinGroup or LeaveGroup request for the group came since. (A member that learns of a
rebalance from a heartbeat error rejoins with a JoinGroup, which ends the stability then.)
All times are ``time.monotonic()``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["JOIN", "LEAVE", "SYNC", "GroupCall", "GroupRecord"]

JOIN = "JoinGroup"
SYNC = "SyncGroup"
LEAVE = "LeaveGroup"

T = TypeVar("T")
_POLL = 0.02


@dataclass(frozen=True)
class GroupCall:
    """A group request and, once they happened, its answer and the answer's release."""

    api: str
    """:data:`JOIN`, :data:`SYNC` or :data:`LEAVE`."""
    version: int
    connection: int
    """The proxy's number for the client connection the request came on."""
    client_id: str | None
    group_id: str | None
    member_id: str | None
    """As the request names it: empty on a member's first JoinGroup."""
    requested_at: float
    """When the proxy passed the request on to the broker."""
    while_stable: bool | None = None
    """JoinGroup, LeaveGroup: the group was stable when this request came (so it started a
    rebalance, unless the broker ignores it)."""
    leader: bool | None = None
    """SyncGroup: the request carried the assignments, i.e. it is the leader's."""
    generation_id: int | None = None
    """JoinGroup: the generation the answer names; SyncGroup: the one the request names."""
    answered_at: float | None = None
    """When the broker's answer reached the proxy."""
    error_code: int | None = None
    assigned_member_id: str | None = None
    """JoinGroup: the member id the answer gives."""
    leader_id: str | None = None
    """JoinGroup: the leader the answer names."""
    members: tuple[str | None, ...] = ()
    """JoinGroup: the members the answer lists (only the leader's lists them)."""
    released_at: float | None = None
    """When the proxy handed the answer to the client (after holding it, if it did)."""

    @property
    def ok(self) -> bool:
        """Answered with error code 0."""
        return self.error_code == 0

    @property
    def member(self) -> str | None:
        """The member this call is about: the id the answer gave, else the one the request named."""
        return self.assigned_member_id or self.member_id

    @property
    def held_s(self) -> float | None:
        """How long the proxy held the answer (None until it is released)."""
        if self.answered_at is None or self.released_at is None:
            return None
        return self.released_at - self.answered_at

    @property
    def took_s(self) -> float | None:
        """From the request reaching the proxy to the answer leaving it."""
        return None if self.released_at is None else self.released_at - self.requested_at


@dataclass
class _Group:
    generation: int | None = None
    members: frozenset[str | None] | None = None
    synced: set[str | None] = dataclasses.field(default_factory=set)
    rejoining: bool = False
    stable_since: float | None = None


class GroupRecord:
    """Thread-safe log of :class:`GroupCall` s, with the queries tests need."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._calls: dict[int, GroupCall] = {}
        self._groups: dict[str | None, _Group] = {}

    # -- written by the proxy ------------------------------------------------------------------

    def requested(self, call: GroupCall) -> int:
        """Log a request; returns the id the answer is filed under."""
        with self._lock:
            group = self._groups.setdefault(call.group_id, _Group())
            if call.api in (JOIN, LEAVE):
                call = dataclasses.replace(call, while_stable=group.stable_since is not None)
                group.stable_since = None
                group.rejoining = True
            call_id = next(self._ids)
            self._calls[call_id] = call
            return call_id

    def answered(
        self,
        call_id: int,
        at: float,
        error_code: int,
        *,
        generation_id: int | None = None,
        assigned_member_id: str | None = None,
        leader_id: str | None = None,
        members: tuple[str | None, ...] = (),
    ) -> None:
        """Log the broker's answer (the keywords: what a JoinGroup answer carries)."""
        with self._lock:
            call = self._calls.get(call_id)
            if call is None:  # cleared meanwhile
                return
            call = dataclasses.replace(
                call,
                answered_at=at,
                error_code=error_code,
                generation_id=call.generation_id if generation_id is None else generation_id,
                assigned_member_id=assigned_member_id,
                leader_id=leader_id,
                members=members,
            )
            self._calls[call_id] = call
            if call.api != JOIN or error_code != 0 or call.generation_id is None:
                return
            group = self._groups.setdefault(call.group_id, _Group())
            if call.generation_id != group.generation:
                group.generation = call.generation_id
                group.members = None
                group.synced = set()
            else:
                # Answered within the current generation (the broker lets a member of a stable
                # group rejoin without a rebalance): stable again once it has synced.
                group.synced.discard(call.assigned_member_id)
            group.rejoining = False
            group.stable_since = None
            if call.members:
                group.members = frozenset(call.members)

    def released(self, call_id: int, at: float) -> None:
        """Log that the answer went on to the client."""
        with self._lock:
            call = self._calls.get(call_id)
            if call is None:
                return
            call = dataclasses.replace(call, released_at=at)
            self._calls[call_id] = call
            if call.api != SYNC or not call.ok:
                return
            group = self._groups.setdefault(call.group_id, _Group())
            if call.generation_id != group.generation or group.rejoining:
                return
            group.synced.add(call.member_id)
            everyone = group.members is None or group.synced >= group.members
            if everyone and group.stable_since is None:
                group.stable_since = at

    def clear(self) -> None:
        """Forget every call and every group's state (answers still held are not logged)."""
        with self._lock:
            self._calls.clear()
            self._groups.clear()

    # -- queries ---------------------------------------------------------------------------

    def calls(
        self, api: str | None = None, *, group_id: str | None = None, client_prefix: str | None = None
    ) -> list[GroupCall]:
        """Every call so far, in request order, optionally of one api / group / client."""
        with self._lock:
            calls = list(self._calls.values())
        return [
            c
            for c in calls
            if (api is None or c.api == api)
            and (group_id is None or c.group_id == group_id)
            and (client_prefix is None or (c.client_id or "").startswith(client_prefix))
        ]

    def join_requests(self, *, group_id: str | None = None, client_prefix: str | None = None) -> list[GroupCall]:
        return self.calls(JOIN, group_id=group_id, client_prefix=client_prefix)

    def join_requests_since(
        self, t: float, client_prefix: str | None = None, *, group_id: str | None = None
    ) -> list[GroupCall]:
        """JoinGroup requests that reached the proxy at or after ``t``."""
        return [c for c in self.join_requests(group_id=group_id, client_prefix=client_prefix) if c.requested_at >= t]

    def joins(self, *, group_id: str | None = None, client_prefix: str | None = None) -> list[GroupCall]:
        """Successful JoinGroup answers (as the broker gave them; see ``released_at``)."""
        return [c for c in self.join_requests(group_id=group_id, client_prefix=client_prefix) if c.ok]

    def syncs(
        self, *, group_id: str | None = None, client_prefix: str | None = None, leader: bool | None = None
    ) -> list[GroupCall]:
        """Successful SyncGroup answers; ``leader`` picks the leader's or the followers'."""
        return [
            c
            for c in self.calls(SYNC, group_id=group_id, client_prefix=client_prefix)
            if c.ok and (leader is None or c.leader is leader)
        ]

    def generations(self, group_id: str | None = None) -> list[int]:
        """The distinct generations successful JoinGroup answers named, in order."""
        seen: list[int] = []
        for call in self.joins(group_id=group_id):
            if call.generation_id is not None and call.generation_id not in seen:
                seen.append(call.generation_id)
        return seen

    def last_generation(self, group_id: str | None = None) -> int | None:
        generations = self.generations(group_id)
        return generations[-1] if generations else None

    def stable_since(self, group_id: str) -> float | None:
        """Since when the group has been stable (see the module's doc), or None."""
        with self._lock:
            group = self._groups.get(group_id)
            return None if group is None else group.stable_since

    def generation_members(self, group_id: str, generation: int) -> set[str | None]:
        """The member ids the answers of ``generation`` named."""
        return {c.assigned_member_id for c in self.joins(group_id=group_id) if c.generation_id == generation}

    def client_of(self, member_id: str | None) -> str | None:
        """The client id of the connection a member joined on."""
        for call in self.joins():
            if call.assigned_member_id == member_id:
                return call.client_id
        return None

    # -- waiting (on the caller's event loop) ---------------------------------------------------

    async def _until(self, what: str, timeout: float, probe: Callable[[], T | None]) -> T:
        deadline = time.monotonic() + timeout
        while (value := probe()) is None:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"timed out after {timeout} s waiting for {what}; calls: {self.summary()}")
            await asyncio.sleep(_POLL)
        return value

    async def wait_for_generation(
        self, group_id: str, at_least: int = 1, *, released: bool = True, timeout: float = 30.0
    ) -> int:
        """Wait for a successful JoinGroup answer of generation ``at_least`` or later (handed
        to the client, unless ``released`` is false); returns that generation."""

        def probe() -> int | None:
            gens = [
                c.generation_id
                for c in self.joins(group_id=group_id)
                if c.generation_id is not None and c.generation_id >= at_least
                and (c.released_at is not None or not released)
            ]
            return max(gens) if gens else None

        return await self._until(f"generation {at_least}+ of {group_id}", timeout, probe)

    async def wait_until_stable(self, group_id: str, at_least: int = 1, *, timeout: float = 30.0) -> float:
        """Wait until the group is stable in generation ``at_least`` or later; returns since when."""

        def probe() -> float | None:
            with self._lock:
                group = self._groups.get(group_id)
                if group is None or group.generation is None or group.generation < at_least:
                    return None
                return group.stable_since

        return await self._until(f"{group_id} to be stable in generation {at_least}+", timeout, probe)

    async def expect_no_join_requests(
        self, seconds: float, *, group_id: str | None = None, client_prefix: str | None = None
    ) -> None:
        """Watch for ``seconds`` (from now); raise :class:`AssertionError` as soon as a JoinGroup
        request (of the group / clients given) comes in that time."""
        start = time.monotonic()
        end = start + seconds
        while True:
            came = self.join_requests_since(start, client_prefix, group_id=group_id)
            if came:
                first = came[0]
                raise AssertionError(
                    f"{first.client_id} sent a JoinGroup {first.requested_at - start:.2f} s into a "
                    f"{seconds} s quiet period: {came}"
                )
            if time.monotonic() >= end:
                return
            await asyncio.sleep(min(_POLL, max(0.0, end - time.monotonic())))

    def summary(self) -> str:
        """One line per call, for failure messages."""
        lines = []
        t0 = min((c.requested_at for c in self.calls()), default=0.0)
        for c in self.calls():
            answer = "-" if c.answered_at is None else f"+{c.answered_at - t0:.2f}"
            release = "-" if c.released_at is None else f"+{c.released_at - t0:.2f}"
            lines.append(
                f"{c.api} v{c.version} {c.client_id} {c.group_id} member={c.member!r} gen={c.generation_id} "
                f"leader={c.leader} err={c.error_code} stable={c.while_stable} "
                f"asked +{c.requested_at - t0:.2f} answered {answer} released {release}"
            )
        return "\n" + "\n".join(lines)
