"""A Kafka broker that answers JoinGroup and SyncGroup late, like some Kafka-compatible brokers do.

On brokers other than Apache Kafka a JoinGroup answer can take 2-25 s and a follower's
SyncGroup answer comes after the leader's. :class:`LateProxy` reproduces that timing on
loopback in front of a real Apache Kafka broker: it reads the Kafka frames going through it
(tests/support/kafka_wire.py) and holds successful JoinGroup and SyncGroup answers back::

    with late_kafka(GroupDelays(join_s=2, leader_sync_s=1)) as kafka:
        consume(kafka.bootstrap)                          # every connection goes through the proxy
        kafka.proxy.set_delays(GroupDelays())             # from any thread, at any time
        kafka.record.generations(group)                   # what the proxy saw (group_record.py)

:func:`late_kafka` starts a dedicated broker with Kafka's *default* group settings
(``group.initial.rebalance.delay.ms=3000``, ``group.min.session.timeout.ms=6000``) where the
session test broker shortens them; with the delays at zero it is simply such a broker.

What is held, and how
    Only answers with error code 0: an error (MEMBER_ID_REQUIRED, REBALANCE_IN_PROGRESS, ...)
    goes on at once, as does every other api (produce, fetch, metadata, heartbeat, ...), except
    that answers on one connection stay in order: a held answer holds the ones behind it, as a
    real broker answers one request per connection at a time (aiokafka puts the group protocol
    on its own coordinator connection, so that is its JoinGroup/SyncGroup/Heartbeat traffic).
    A successful answer is held until ``delay`` after the broker gave it, where ``delay`` is
    read from the current :class:`GroupDelays`, also while it is held: lowering the delays
    releases what has been held longer than the new ones.
    Requests are never delayed. A frame that does not parse is passed on untouched (and logged).

The proxy keeps :class:`~tests.support.fault_proxy.FaultProxy`'s ``stall``/``drop`` modes, and
listens on a free port below the ephemeral range.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.support import kafka_frames as frames
from tests.support import kafka_wire as wire
from tests.support.fault_proxy import _CHUNK, FaultProxy, _Connection, proxied_kafka
from tests.support.group_record import JOIN, LEAVE, SYNC, GroupCall, GroupRecord
from tests.support.kafka_broker import KafkaBroker
from tests.support.ports import PORT_RANGE

__all__ = [
    "KAFKA_GROUP_DEFAULTS",
    "GroupCall",
    "GroupDelays",
    "GroupRecord",
    "LateKafka",
    "LateProxy",
    "late_kafka",
]

log = logging.getLogger(__name__)

# Apache Kafka's own defaults; the session test broker (kafka_broker.py) sets 0 and 500.
KAFKA_GROUP_DEFAULTS: Mapping[str, object] = {
    "group.initial.rebalance.delay.ms": 3000,
    "group.min.session.timeout.ms": 6000,
}

_GROUP_APIS = {wire.JOIN_GROUP: JOIN, wire.SYNC_GROUP: SYNC, wire.LEAVE_GROUP: LEAVE}
# Answers queued on one connection beyond this make the proxy stop reading from the broker
# until the client side catches up (TCP flow control then pushes back on the broker).
_QUEUE_LIMIT = 4 * 1024 * 1024


@dataclass(frozen=True)
class GroupDelays:
    """How long successful group answers are held after the broker gave them (seconds).

    ``follower_sync_s`` defaults to ``leader_sync_s + 1`` when ``leader_sync_s`` is set (the
    follower's answer comes after the leader's), else to 0: ``GroupDelays()`` holds nothing.
    """

    join_s: float = 0.0
    leader_sync_s: float = 0.0
    follower_sync_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("join_s", "leader_sync_s", "follower_sync_s"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")

    @property
    def follower_s(self) -> float:
        """``follower_sync_s`` with its default applied."""
        if self.follower_sync_s is not None:
            return self.follower_sync_s
        return self.leader_sync_s + 1.0 if self.leader_sync_s > 0 else 0.0

    def for_call(self, api: str, leader: bool | None) -> float:
        if api == JOIN:
            return self.join_s
        if api == SYNC:
            return self.leader_sync_s if leader else self.follower_s
        return 0.0


@dataclass
class _Pending:
    """A group request whose answer has not come yet."""

    api: str
    version: int
    call_id: int  # in the record
    leader: bool | None = None


@dataclass
class _Out:
    """Bytes for the client, in order; with ``hold`` they wait for the delay of their api."""

    data: bytes | None  # None: the broker's end of stream
    api: str | None = None
    leader: bool | None = None
    call_id: int | None = None
    answered_at: float = 0.0
    hold: bool = False


@dataclass
class _Wire:
    """One connection's protocol state (proxy loop only)."""

    number: int
    scanner: frames.RequestScanner | None
    pending: dict[int, _Pending] = field(default_factory=dict)


class LateProxy(FaultProxy):
    """A :class:`FaultProxy` that reads Kafka frames and holds group answers (module doc)."""

    def __init__(
        self,
        target_host: str,
        target_port: int | Callable[[], int | None],
        *,
        delays: GroupDelays | None = None,
        listen_host: str = "127.0.0.1",
        listen_port: int | range = PORT_RANGE,
        name: str = "kafka-late-proxy",
    ) -> None:
        super().__init__(target_host, target_port, listen_host=listen_host, listen_port=listen_port, name=name)
        self._delays = delays or GroupDelays()
        self.record = GroupRecord()
        self._wires: weakref.WeakKeyDictionary[_Connection, _Wire] = weakref.WeakKeyDictionary()
        self._numbers = itertools.count(1)
        self._delays_changed: asyncio.Event | None = None  # loop only
        self._versions_lock = threading.Lock()
        self._versions: dict[int, set[int]] = {}
        self.unparsed_frames = 0
        """Frames (or streams) passed on without being understood; each is logged."""

    # -- delays ----------------------------------------------------------------------------

    @property
    def delays(self) -> GroupDelays:
        return self._delays

    def set_delays(self, delays: GroupDelays) -> None:
        """Apply ``delays`` (any thread): to answers arriving from now on and to those held."""
        self._delays = delays  # one reference assignment: atomic
        loop = self._loop
        if loop is None or not self.running:
            return
        if threading.current_thread() is self._thread:
            self._wake_holders()
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(self._wake_holders)

    def _wake_holders(self) -> None:
        changed, self._delays_changed = self._delays_changed, asyncio.Event()
        if changed is not None:
            changed.set()

    def api_versions_seen(self) -> dict[int, set[int]]:
        """api key -> the versions of it clients sent through this proxy."""
        with self._versions_lock:
            return {key: set(versions) for key, versions in self._versions.items()}

    # -- forwarding ----------------------------------------------------------------------------

    def _wire(self, conn: _Connection) -> _Wire:
        state = self._wires.get(conn)
        if state is None:
            scanner = frames.RequestScanner(lambda api_key: api_key in _GROUP_APIS)
            state = self._wires[conn] = _Wire(next(self._numbers), scanner)
        return state

    async def _pump(
        self,
        conn: _Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        to_target: bool,
    ) -> None:
        if self._delays_changed is None:
            self._delays_changed = asyncio.Event()
        try:
            if to_target:
                await self._pump_requests(conn, reader, writer)
            else:
                await self._pump_answers(conn, reader, writer)
        except OSError:  # reset by peer, broken pipe: pass the failure on to the other side
            conn.abort()
        except Exception:
            log.exception("%s: forwarding failed", self.name)
            conn.abort()

    async def _pass_gate(self) -> None:
        gate = self._gate
        assert gate is not None
        while not gate.is_set():
            await gate.wait()

    async def _pump_requests(
        self, conn: _Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        state = self._wire(conn)
        while True:
            data = await reader.read(_CHUNK)
            await self._pass_gate()  # stalled: hold this chunk and read no more
            if conn.reset:
                return
            if not data:
                if writer.can_write_eof() and not writer.transport.is_closing():
                    writer.write_eof()
                return
            # Watched before it is passed on, so the request is on file before any answer.
            self._watch_requests(state, data)
            writer.write(data)
            self._bytes_to_target += len(data)
            self._notify()
            await writer.drain()

    def _watch_requests(self, state: _Wire, data: bytes) -> None:
        scanner = state.scanner
        if scanner is None:
            return
        now = time.monotonic()
        for frame in scanner.feed(data):
            try:
                self._watch_request(state, frame, now)
            except wire.WireError as exc:
                self.unparsed_frames += 1
                log.warning("%s: connection %d: a request frame did not parse (%s); passed on", self.name,
                            state.number, exc)
        if scanner.broken is not None:
            self.unparsed_frames += 1
            log.warning("%s: connection %d: stopped reading requests: %s", self.name, state.number, scanner.broken)
            state.scanner = None

    def _watch_request(self, state: _Wire, frame: bytes, now: float) -> None:
        header = wire.parse_request_header(frame)
        with self._versions_lock:
            self._versions.setdefault(header.api_key, set()).add(header.api_version)
        api = _GROUP_APIS.get(header.api_key)
        if api is None:
            return
        common: dict[str, Any] = {
            "api": api,
            "version": header.api_version,
            "connection": state.number,
            "client_id": header.client_id,
            "requested_at": now,
        }
        if api == JOIN:
            join = wire.parse_join_group_request(frame, header)
            call = GroupCall(group_id=join.group_id, member_id=join.member_id, **common)
            leader = None
        elif api == SYNC:
            sync = wire.parse_sync_group_request(frame, header)
            call = GroupCall(
                group_id=sync.group_id, member_id=sync.member_id, leader=sync.leader,
                generation_id=sync.generation_id, **common,
            )
            leader = sync.leader
        else:
            leave = wire.parse_leave_group_request(frame, header)
            member = leave.member_ids[0] if len(leave.member_ids) == 1 else None
            call = GroupCall(group_id=leave.group_id, member_id=member, **common)
            leader = None
        state.pending[header.correlation_id] = _Pending(api, header.api_version, self.record.requested(call), leader)

    async def _pump_answers(
        self, conn: _Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Read the broker's answers in a task of their own and pass them on in this one: a held
        answer must not keep the proxy from seeing (and timing) the answers behind it."""
        state = self._wire(conn)
        queue: collections.deque[_Out] = collections.deque()
        queued = asyncio.Event()
        room = asyncio.Event()  # clear while too much is queued
        room.set()
        size = 0

        async def read() -> None:
            nonlocal size
            cutter = frames.ResponseCutter(lambda cid: cid in state.pending)
            try:
                while True:
                    await room.wait()
                    data = await reader.read(_CHUNK)
                    await self._pass_gate()  # stalled: read no more (flow control, as FaultProxy)
                    if not data:
                        queue.append(_Out(None))
                        queued.set()
                        return
                    for piece in cutter.feed(data):
                        queue.append(self._classify(state, piece))
                        size += len(piece.data)
                    if cutter.broken is not None and state.scanner is not None:
                        self.unparsed_frames += 1
                        log.warning("%s: connection %d: answers passed on unread from here: %s", self.name,
                                    state.number, cutter.broken)
                        state.scanner = None  # nothing more is looked at on this connection
                    if size > _QUEUE_LIMIT:
                        room.clear()
                    queued.set()
            except OSError:  # the broker reset the connection: reset the client's at once too
                conn.abort()
            except Exception:
                log.exception("%s: reading answers failed", self.name)
                conn.abort()

        reading = asyncio.create_task(read())
        try:
            while True:
                while not queue:
                    queued.clear()
                    await queued.wait()
                out = queue[0]
                await self._hold(out)
                await self._pass_gate()
                if conn.reset:
                    return
                queue.popleft()
                if out.data is None:
                    if writer.can_write_eof() and not writer.transport.is_closing():
                        writer.write_eof()
                    return
                if out.call_id is not None:  # on file before the client can read it
                    self.record.released(out.call_id, time.monotonic())
                writer.write(out.data)
                size -= len(out.data)
                if size <= _QUEUE_LIMIT:
                    room.set()
                self._bytes_to_client += len(out.data)
                self._notify()
                await writer.drain()
        finally:
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)

    def _classify(self, state: _Wire, piece: frames.Piece) -> _Out:
        """What to do with a piece of the answer stream; files the group answers it completes."""
        out = _Out(piece.data)
        if piece.correlation_id is None:
            return out
        pending = state.pending.pop(piece.correlation_id, None)
        if pending is None or piece.frame is None:
            return out
        now = time.monotonic()
        out.api, out.leader, out.call_id, out.answered_at = pending.api, pending.leader, pending.call_id, now
        try:
            if pending.api == JOIN:
                join = wire.parse_join_group_response(piece.frame, pending.version)
                error_code = join.error_code
                self.record.answered(
                    pending.call_id, now, error_code, generation_id=join.generation_id,
                    assigned_member_id=join.member_id, leader_id=join.leader_id, members=join.members,
                )
            elif pending.api == SYNC:
                error_code = wire.parse_sync_group_response(piece.frame, pending.version).error_code
                self.record.answered(pending.call_id, now, error_code)
            else:
                error_code = wire.parse_leave_group_response(piece.frame, pending.version)
                self.record.answered(pending.call_id, now, error_code)
        except wire.WireError as exc:
            self.unparsed_frames += 1
            log.warning("%s: connection %d: a %s v%d answer did not parse (%s); passed on", self.name,
                        state.number, pending.api, pending.version, exc)
            return out
        out.hold = error_code == 0 and pending.api != LEAVE
        return out

    async def _hold(self, out: _Out) -> None:
        """Wait until ``out`` is due under the delays in force (re-read when they change)."""
        if not out.hold or out.api is None:
            return
        while True:
            due = out.answered_at + self._delays.for_call(out.api, out.leader)
            remaining = due - time.monotonic()
            if remaining <= 0:
                return
            changed = self._delays_changed
            assert changed is not None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)


# -- a dedicated broker --------------------------------------------------------------------------


@dataclass
class LateKafka:
    """A dedicated broker at Kafka's default group settings, every client connection through
    ``proxy``."""

    proxy: LateProxy
    broker: KafkaBroker

    @property
    def bootstrap(self) -> str:
        """The proxy's address: use it as ``bootstrap.servers``."""
        return self.proxy.address

    @property
    def record(self) -> GroupRecord:
        return self.proxy.record

    def set_delays(self, delays: GroupDelays) -> None:
        self.proxy.set_delays(delays)

    def reset(self) -> None:
        """Delays to zero, the record cleared, the proxy passing through: a fresh start."""
        self.proxy.set_delays(GroupDelays())
        self.proxy.pass_through()
        self.proxy.record.clear()


@contextlib.contextmanager
def late_kafka(
    delays: GroupDelays | None = None, properties: Mapping[str, object] | None = None, **broker_kwargs: Any
) -> Iterator[LateKafka]:
    """Start a :class:`LateProxy` (holding answers by ``delays``) and a dedicated broker that
    advertises it, with Kafka's default group settings; ``properties`` override or add
    broker properties (``broker_kwargs`` go to :class:`KafkaBroker`)."""
    props = {**KAFKA_GROUP_DEFAULTS, **(properties or {})}
    made: list[LateProxy] = []

    def make_proxy(broker_port: Callable[[], int | None]) -> LateProxy:
        made.append(LateProxy("127.0.0.1", broker_port, delays=delays))
        return made[0]

    with proxied_kafka(props, make_proxy=make_proxy, **broker_kwargs) as proxied:
        kafka = LateKafka(proxy=made[0], broker=proxied.broker)
        asyncio.run(_coordinator_loaded(kafka.bootstrap))
        yield kafka


async def _coordinator_loaded(bootstrap: str, timeout_s: float = 60.0) -> None:
    """Until the fresh broker's group coordinator has loaded its (one) offsets partition: before
    that it answers JoinGroup with COORDINATOR_LOAD_IN_PROGRESS, which a test of the group
    protocol's answers took for an error of the members (the first test on the broker failed)."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                answers = await admin.describe_consumer_groups(["streamloop-coordinator-check"])
                if all(group[0] == 0 for answer in answers for group in answer.groups):
                    return
            except KafkaError:
                pass  # the offsets topic is still being created: no coordinator yet
            if time.monotonic() > deadline:
                raise TimeoutError(f"the group coordinator of {bootstrap} did not load within {timeout_s} s")
            await asyncio.sleep(0.1)  # polls the broker's state, with the deadline above
    finally:
        await admin.close()
