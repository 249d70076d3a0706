"""When a stream thread rejoins because of its own client's threads: stale generations.

The group coordinator tells a member of a rebalance only at the member's next heartbeat
(``heartbeat.interval.ms``, 3 s by default). So a thread added to a client would wait that long
for its siblings to rejoin, and a cooperative hand-over, which needs two rebalances, twice. A
client knows more than the coordinator tells: it sees its own threads start a join or leave.
This module decides, from that knowledge alone, when a thread's generation is *stale*: certain
to be replaced by a rebalance the coordinator has started or is about to start. Rejoining a
stale generation early only moves the thread into that rebalance sooner; it never starts one.

The facts, each in one place:

- ``Membership`` (one per thread, written by its loop, read by its siblings): a token unique to
  this thread in this process, the join it is making (``joining``, what its JoinGroup carries),
  the latest join the coordinator has registered (``joins``, what its siblings count on), and
  whether it has left the group.
- The roster of a generation: the tokens of the client's threads in it, each with the join that
  brought it there. The group leader builds it from the members' subscriptions, so every member
  of a generation gets the same roster (``streamloop.tasks.assignor``).
- ``GenerationWatch`` (one per thread, on its loop): the thread's current generation and roster,
  or None while it is joining.

A generation is stale because of a sibling that is alive and whose registered join its roster
does not record (a new thread, or a member that rejoins: the coordinator rebalances for it, and
completes no rebalance without it), or because of a sibling in its roster that has left the
group. Nothing else makes our client rejoin, and it rejoins at most once for each such change
(``acted``): a member that just got its assignment never rejoins while a join or sync that its
generation already includes is in flight, however late the broker answers.

A join counts once the coordinator has it. A known member's has it when it starts (the
coordinator waits for every known member); a new thread's only once its first JoinGroup is
answered (KIP-394's MEMBER_ID_REQUIRED makes it a pending member, which the coordinator waits
for too). Counted earlier, a sibling's rejoin could complete a generation before the new
thread's first JoinGroup arrived, and the sibling would then wait for its heartbeat.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["LEFT", "Change", "FollowUpWait", "GenerationWatch", "Membership", "Roster"]

Roster = Mapping[str, int]
"""The client's threads in one generation: token -> the join count that brought it there."""

LEFT = -1
"""``Change.joins`` of a sibling that left the group."""

_tokens = itertools.count(1)


class Membership:
    """A stream thread's membership as its siblings see it (plain attribute reads and writes)."""

    __slots__ = ("joining", "joins", "left", "name", "token")

    def __init__(self, thread_name: str) -> None:
        self.name = thread_name
        # Thread names are reused (KIP-663 gives a removed thread's name to the next one): the
        # token is not, so a roster never mistakes a new thread for the one it replaced.
        self.token = f"{thread_name}#{next(_tokens)}"
        self.joining = 0
        """The thread's latest join (its JoinGroup subscriptions carry it): one per rebalance it starts."""
        self.joins = 0
        """The latest join the coordinator has registered; what siblings count on."""
        self.left = False
        """The thread's consumer left the group (LeaveGroup sent on close)."""


@dataclass(frozen=True, slots=True)
class Change:
    """A sibling's join (its join count) or departure (``LEFT``) that makes a generation stale."""

    token: str
    name: str
    joins: int

    def describe(self) -> str:
        if self.joins == LEFT:
            return f"{self.name} left the group"
        return f"{self.name} started join {self.joins}"


class GenerationWatch:
    """One thread's current generation, and the changes it has already rejoined for (its loop only)."""

    def __init__(self, own: Membership) -> None:
        self._own = own
        self.number: int | None = None
        self.roster: Roster | None = None
        """None while the thread is joining (and before its first generation)."""
        self._acted: set[Change] = set()

    @property
    def settled(self) -> bool:
        return self.roster is not None

    def begin_join(self) -> bool:
        """The thread is about to send a JoinGroup; True when this starts a new join.

        A join that retries (the transport calls ``on_partitions_revoked`` once per rebalance, not
        per JoinGroup) is one join."""
        if self.roster is None and self._own.joining > 0:
            return False
        self.roster = None
        self.number = None
        self._own.joining += 1
        return True

    def registered(self) -> bool:
        """The coordinator has the join in flight; True when that is news for the siblings."""
        own = self._own
        if own.joins == own.joining:
            return False
        own.joins = own.joining
        return True

    def settle(self, number: int | None, roster: Roster) -> None:
        """The thread's assignment for generation ``number`` has arrived."""
        self.number = number
        self.roster = dict(roster)

    def stale(self, siblings: Iterable[tuple[Membership, bool]]) -> list[Change]:
        """The changes among ``siblings`` (each with whether it is alive) that make the current
        generation stale and that the thread has not rejoined for yet; they count as acted on.

        Empty while the thread is joining: its join takes in whatever happened meanwhile, and
        the generation it gets is judged when it arrives."""
        roster = self.roster
        if roster is None:
            return []
        changes = []
        present = set()
        for member, alive in siblings:
            if member is self._own:
                continue
            present.add(member.token)
            change = _change(member, alive, roster)
            if change is not None and change not in self._acted:
                changes.append(change)
        # Forget what concerns threads that are gone: the set stays as small as the client.
        self._acted = {c for c in self._acted if c.token in present}
        self._acted.update(changes)
        return changes


class FollowUpWait:
    """When a member waiting for a cooperative follow-up rebalance asks the coordinator about it.

    Its assignment withheld tasks that still have owners elsewhere: the owners rejoin once their
    own SyncGroup answers take the tasks away, and the coordinator would tell this member of that
    rebalance only at its next heartbeat, up to ``heartbeat.interval.ms`` later, which another
    client's threads cannot shorten with a nudge. So the member asks (a heartbeat: it never starts
    a rebalance) ``first_ms`` after its assignment, then at doubling intervals until one reaches
    the heartbeat interval, where the heartbeat task alone asks again.
    """

    def __init__(self, first_ms: int, heartbeat_ms: int) -> None:
        self._first_ms = max(1, first_ms)
        self._heartbeat_ms = heartbeat_ms
        self._next_ms: int | None = None
        self._step_ms = self._first_ms
        self.in_flight = False
        """An ask is under way: the next one waits for its answer."""

    @property
    def waiting(self) -> bool:
        return self._next_ms is not None

    def begin(self, now_ms: int) -> None:
        """The assignment has come and the follow-up is still to come."""
        self._step_ms = self._first_ms
        self._next_ms = now_ms + self._step_ms

    def end(self) -> None:
        """The member joins (the follow-up, or any other rebalance), or leaves."""
        self._next_ms = None

    def due(self, now_ms: int) -> bool:
        """Whether to ask now; counts the ask."""
        if self._next_ms is None or self.in_flight or now_ms < self._next_ms:
            return False
        self._step_ms *= 2
        self._next_ms = None if self._step_ms >= self._heartbeat_ms else now_ms + self._step_ms
        return True


def _change(member: Membership, alive: bool, roster: Roster) -> Change | None:
    if member.left:
        return Change(member.token, member.name, LEFT) if member.token in roster else None
    joins = member.joins
    if alive and joins > 0 and roster.get(member.token) != joins:
        return Change(member.token, member.name, joins)
    return None
