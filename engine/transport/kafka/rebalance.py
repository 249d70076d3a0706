"""The engine's assignor and rebalance listener as aiokafka sees them, and what they tell ``poll``.

Group membership and rebalance callbacks
    aiokafka runs the group protocol in a background task of the consumer's
    loop (the *coordination task*), not inside ``getmany``. The rebalance
    listener is awaited by that task: ``on_partitions_revoked`` (eager, every
    owned partition, also with an empty set on the first join) before the
    JoinGroup request, then, after SyncGroup, the assignor's ``on_assignment``
    and ``on_partitions_assigned``. So the callbacks can run whenever the
    engine's loop is idle at an ``await`` (during ``poll`` but also during a
    ``flush`` or ``commit``), never in another thread.
    aiokafka logs and swallows exceptions raised by the listener. The adapters
    here record the first exception of the engine's listener or assignor in
    :class:`RebalanceState`, and the consumer raises it from its next ``poll``.
    Between the assignor's ``on_assignment`` and the end of the listener's
    ``on_partitions_assigned`` the state's *gate* is closed: the consumer's ``poll``
    returns no records of the new assignment before the engine has taken it on.

Cooperative rebalancing (KIP-429) over aiokafka's eager group client
    aiokafka revokes everything before each JoinGroup and replaces its assignment, positions
    and pause flags included, after SyncGroup. With ``ConsumerSettings.cooperative`` the
    adapters turn that into the cooperative protocol (``streamloop.transport.base.RebalanceListener``):
    before the join the engine is told of no revocation, the old assignment is held
    (:attr:`RebalanceState.held`) and aiokafka's "reassignment in progress" flag is cleared, so
    ``getmany`` keeps returning the held partitions' records during the rebalance (aiokafka's
    background fetcher keeps fetching them). When the assignment arrives, the partitions that stay
    get their positions and pause flags back from the held assignment, the engine revokes the ones
    it lost (their commits go to the coordinator directly: aiokafka's ``commit`` refuses partitions
    it no longer assigns), and the member rejoins at once for the follow-up rebalance. The broker
    does not take part: the classic group protocol is the same for both.

``request_rejoin()``
    Uses the coordinator's private ``request_rejoin()`` (aiokafka has no
    ``enforceRebalance``). A follower that rejoins with an unchanged
    subscription gets its old assignment back without a group rebalance, so
    the transport puts a rejoin counter in front of the assignor's user data
    (stripped again before ``GroupAssignor.assign`` sees it); every
    ``request_rejoin()`` changes it and so rebalances the whole group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

import orjson
from aiokafka import errors as aioerrors
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.client import ConnectionGroup
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from streamloop.records import TopicPartition
from streamloop.transport.base import GroupAssignor, MemberAssignment, MemberSubscription, RebalanceListener
from streamloop.transport.kafka.errors import describe
from streamloop.transport.kafka.structs import our_tps

__all__ = ["AssignorAdapter", "ListenerAdapter", "RebalanceState", "adapt_join_requests"]

log = logging.getLogger(__name__)


class RebalanceState:
    """One consumer's view of its rebalances: the rejoin count, the first callback error, the gate.

    Written by the adapters (in aiokafka's coordination task) and read by the consumer's ``poll``,
    all on the consumer's loop.
    """

    def __init__(self, client_id: str, cooperative: bool = False,
                 consumer: Callable[[], Any] = lambda: None) -> None:
        self._client_id = client_id
        self.cooperative = cooperative
        # The aiokafka consumer once started (None before): the adapters reach its subscription.
        self._consumer = consumer
        self.rejoin_count = 0
        # Cooperative: aiokafka's assignment held through a rejoin, then the partitions being revoked.
        self.held: Any = None
        self.revoking: set[TopicPartition] = set()
        # The assignment the last rebalance installed: a pattern subscription whose topics changed
        # gets a new aiokafka subscription without it, and the hold falls back to this one.
        self._installed: Any = None
        self._callback_error: BaseException | None = None
        # An asyncio future, as aiokafka's coordination task resolves it.
        self._gate: asyncio.Future[None] | None = None

    def callback_failed(self, exc: BaseException, where: str) -> Exception:
        """Keep the first failure of an engine callback; the error to hand back to aiokafka."""
        log.error("Rebalance callback %s of consumer %s failed: %r", where, self._client_id, exc)
        if self._callback_error is None:
            self._callback_error = exc
        # aiokafka logs what the assignor raises; the engine hears of it from poll.
        error: Exception = aioerrors.KafkaError(f"{where} failed: {describe(exc)}")
        return error

    def raise_callback_error(self) -> None:
        exc = self._callback_error
        if exc is not None:
            self._callback_error = None
            raise exc

    @property
    def assigning(self) -> bool:
        """Whether a new assignment is installed but the engine's ``on_partitions_assigned`` has not ended."""
        return self._gate is not None and not self._gate.done()

    async def assigned(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) until the assignment under way has been taken on."""
        gate = self._gate
        if gate is not None and not gate.done():
            await asyncio.wait([gate], timeout=timeout_s)

    def assignment_started(self) -> None:
        if self._gate is None or self._gate.done():
            self._gate = asyncio.get_running_loop().create_future()

    def hold_assignment(self) -> bool:
        """Cooperative, before a JoinGroup: keep the assignment, and let ``getmany`` go on returning it.

        False when the member is no longer in the group (aiokafka reset its generation after an
        unknown-member or illegal-generation answer): its partitions may have new owners already,
        so it gives them all up (its commits are refused), as after Kafka's ``onPartitionsLost``."""
        consumer = self._consumer()
        subscription = None if consumer is None else consumer._subscription.subscription
        assignment = None if subscription is None else subscription.assignment
        self.held = None
        if subscription is not None and assignment is None and self._installed is not None:
            # A topic the pattern matched was created or deleted: aiokafka replaced the subscription
            # (the old assignment fetches no more), but the partitions that stay keep their positions
            # and the lost ones are revoked, as for any cooperative rebalance.
            if consumer._coordinator.generation < 0:
                return False
            self.held, self._installed = self._installed, None
            return True
        if subscription is None or assignment is None or not assignment.tps:
            return True
        if consumer._coordinator.generation < 0:
            return False
        self.held = assignment
        # Set by aiokafka's _on_join_prepare: fetched_records waits for the new assignment while it is.
        subscription._reassignment_in_progress = False
        return True

    def carry_over(self) -> None:
        """Cooperative, on a new assignment: the partitions that stay continue where they were;
        ``revoking`` becomes the partitions lost."""
        held, self.held = self.held, None
        consumer = self._consumer()
        if consumer is None:
            return
        assignment = self._installed = consumer._subscription.subscription.assignment
        if held is None:
            return
        for tp in held.tps & assignment.tps:
            before, after = held.state_value(tp), assignment.state_value(tp)
            if before.has_valid_position:
                after.seek(before.position)
            if before.paused:
                after.pause()
        self.revoking = our_tps(held.tps - assignment.tps)

    def assignment_finished(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None and not gate.done():
            gate.set_result(None)


# The subscription user data on the wire is the engine's bytes behind a short
# header carrying this member's request_rejoin() count and the partitions it holds.
# The broker starts a rebalance when a follower rejoins only if its subscription
# changed (a leader always triggers one), so request_rejoin() bumps the count to
# make sure the whole group rebalances, as Kafka Streams does with its "unique
# field". The held partitions are the cooperative protocol's "owned partitions"
# (ConsumerProtocol v1+ has a field for them; aiokafka writes v0).
_USER_DATA_MAGIC = b"\xffSO"


def _wrap_user_data(rejoin_count: int, owned: Iterable[tuple[str, int]], user_data: bytes) -> bytes:
    held = orjson.dumps(sorted([tp[0], tp[1]] for tp in owned))
    return (_USER_DATA_MAGIC + (rejoin_count & 0xFFFFFFFF).to_bytes(4, "big") + len(held).to_bytes(4, "big")
            + held + user_data)


def _unwrap_user_data(wire: bytes | None) -> tuple[tuple[TopicPartition, ...], bytes]:
    """The held partitions and the engine's user data."""
    data = bytes(wire or b"")
    start = len(_USER_DATA_MAGIC) + 8
    if not data.startswith(_USER_DATA_MAGIC) or len(data) < start:
        return (), data  # a member that does not use this transport
    size = int.from_bytes(data[start - 4 : start], "big")
    owned = tuple(TopicPartition(topic, partition) for topic, partition in orjson.loads(data[start : start + size]))
    return owned, data[start + size :]


_JOIN_GROUP = 11
# A new member's first JoinGroup is answered MEMBER_ID_REQUIRED (KIP-394); from then on the
# coordinator counts it as a pending member and completes no rebalance without it.
_REGISTERING = (aioerrors.NoError.errno, aioerrors.MemberIdRequired.errno)
# As Java's consumer: a JoinGroup may take the whole rebalance timeout, and a little more.
JOIN_TIMEOUT_LAPSE_MS = 5_000


def adapt_join_requests(coordinator: Any, registered: Callable[[], None], join_timeout_ms: int) -> None:
    """Give JoinGroup requests up to ``join_timeout_ms``, and call ``registered`` when a JoinGroup
    answer shows the coordinator has this member.

    aiokafka bounds every request by ``request_timeout_ms``, JoinGroup included, though the
    coordinator holds a JoinGroup until the rebalance completes (up to the rebalance timeout; some
    brokers hold it half the session timeout whatever happens): a hold past the request timeout
    times out, is sent again and held again, for ever. Java's consumer gives JoinGroup the
    rebalance timeout plus 5 s. aiokafka also sends a new member's two JoinGroup requests
    (KIP-394) in one step, with no callback in between. So this wraps the coordinator's private
    request method, as ``leave_group`` replaces its leave step; while a JoinGroup waits, the
    coordinator connection's other requests get the longer bound too (the engine bounds its own
    commits and offset reads itself)."""
    send = coordinator._send_req

    async def send_req(request: Any) -> Any:
        if getattr(request, "API_KEY", None) != _JOIN_GROUP:
            return await send(request)
        async with _request_timeout(coordinator, join_timeout_ms):
            response = await send(request)
        if response.error_code in _REGISTERING:
            registered()
        return response

    coordinator._send_req = send_req


@contextlib.asynccontextmanager
async def _request_timeout(coordinator: Any, timeout_ms: int) -> AsyncIterator[None]:
    """The coordinator connection's request timeout raised to ``timeout_ms`` for a while.

    A connection reads its timeout when a request is sent: the connection is opened first (the
    client opens it lazily) and the raised bound put on it, then put back after."""
    client = coordinator._client
    node_id = coordinator.coordinator_id
    conn = None
    if node_id is not None and await client.ready(node_id, group=ConnectionGroup.COORDINATION):
        conn = client._conns.get((node_id, ConnectionGroup.COORDINATION))
    if conn is None:
        yield
        return
    before = conn._request_timeout
    conn._request_timeout = max(before, timeout_ms / 1000)
    try:
        yield
    finally:
        conn._request_timeout = before


class AssignorAdapter(AbstractPartitionAssignor):  # type: ignore[misc]  # aiokafka ships no types
    """Adapts the engine's :class:`GroupAssignor` to aiokafka's assignor interface.

    aiokafka calls these through the objects in ``partition_assignment_strategy``
    (``assignor.name``, ``assignor.metadata(topics)``, ``assignor.assign(cluster,
    members)`` on the leader, ``assignor.on_assignment(assignment)``), so an
    instance with instance methods works although the base declares classmethods.
    """

    def __init__(self, assignor: GroupAssignor, state: RebalanceState) -> None:
        self._assignor = assignor
        self._state = state

    @property
    def name(self) -> str:
        return self._assignor.name

    def metadata(self, topics: Any) -> Any:
        ordered = sorted(topics)
        try:
            user_data = self._assignor.subscription_user_data(ordered) or b""
        except Exception as exc:
            raise self._state.callback_failed(exc, "subscription_user_data") from exc
        held = self._state.held
        wire = _wrap_user_data(self._state.rejoin_count, () if held is None else held.tps, bytes(user_data))
        return ConsumerProtocolMemberMetadata(0, ordered, wire)

    def assign(self, cluster: Any, members: Mapping[str, Any]) -> dict[str, Any]:
        subscriptions = {}
        for member_id, meta in members.items():
            owned, user_data = _unwrap_user_data(meta.user_data)
            subscriptions[member_id] = MemberSubscription(member_id, tuple(meta.subscription), user_data, owned)
        partitions_per_topic: dict[str, int] = {}
        for topic in sorted({t for s in subscriptions.values() for t in s.topics}):
            partitions = cluster.partitions_for_topic(topic)
            if partitions:
                partitions_per_topic[topic] = len(partitions)
        try:
            result = self._assignor.assign(subscriptions, partitions_per_topic)
        except Exception as exc:
            raise self._state.callback_failed(exc, "assign") from exc
        out: dict[str, Any] = {}
        for member_id in members:
            assignment = result.get(member_id) or MemberAssignment(())
            by_topic: dict[str, list[int]] = defaultdict(list)
            for tp in assignment.partitions:
                by_topic[tp[0]].append(tp[1])
            out[member_id] = ConsumerProtocolMemberAssignment(
                0,
                [(topic, sorted(parts)) for topic, parts in sorted(by_topic.items())],
                bytes(assignment.user_data or b""),
            )
        return out

    def on_assignment(self, assignment: Any) -> None:
        # Called right after aiokafka installed the new assignment and before
        # the listener's on_partitions_assigned: close the poll gate now.
        self._state.assignment_started()
        if self._state.cooperative:
            self._state.carry_over()
        ours = MemberAssignment(
            tuple(TopicPartition(topic, p) for topic, parts in assignment.assignment for p in parts),
            bytes(assignment.user_data or b""),
        )
        try:
            self._assignor.on_assignment(ours)
        except Exception as exc:
            self._state.assignment_finished()
            raise self._state.callback_failed(exc, "on_assignment") from exc


class ListenerAdapter(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka ships no types
    """Adapts the engine's :class:`RebalanceListener` (engine ``TopicPartition`` sets)."""

    def __init__(self, listener: RebalanceListener | None, state: RebalanceState,
                 rejoin: Callable[[], None] = lambda: None) -> None:
        self._listener = listener
        self._state = state
        self._rejoin = rejoin

    async def on_partitions_revoked(self, revoked: Any) -> None:
        state = self._state
        if state.cooperative and state.hold_assignment():
            revoked = ()
        if self._listener is None:
            return
        try:
            await self._listener.on_partitions_revoked(our_tps(revoked))
        except Exception as exc:
            state.callback_failed(exc, "on_partitions_revoked")

    def join_registered(self) -> None:
        """A JoinGroup of this member got an answer that registers it (see ``watch_join_answers``)."""
        if self._listener is None:
            return
        try:
            self._listener.on_join_registered()
        except Exception as exc:
            self._state.callback_failed(exc, "on_join_registered")

    async def on_partitions_assigned(self, assigned: Any) -> None:
        state = self._state
        lost = state.revoking
        try:
            if lost and self._listener is not None:
                await self._listener.on_partitions_revoked(set(lost))
            if self._listener is not None:
                await self._listener.on_partitions_assigned(our_tps(assigned))
        except Exception as exc:
            state.callback_failed(exc, "on_partitions_assigned")
        finally:
            state.revoking = set()
            state.assignment_finished()
            if lost:
                # The follow-up rebalance that hands the lost partitions to their new owners.
                self._rejoin()
