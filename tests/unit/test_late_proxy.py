"""The late proxy (tests/support/late_broker.py) in front of a fake broker, and its record.

The fake broker answers every request at once, in order, so whatever comes late through the
proxy was held by the proxy. tests/integration/test_late_broker.py does the same with a real
broker and aiokafka's consumers.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest
import pytest_asyncio
from aiokafka.protocol.admin import ApiVersionRequest_v0
from aiokafka.protocol.group import (
    JoinGroupRequest_v5,
    JoinGroupResponse_v5,
    LeaveGroupRequest_v1,
    SyncGroupRequest_v3,
    SyncGroupResponse_v3,
)
from aiokafka.protocol.types import CompactBytes, CompactString, Int16, Int32, String, UnsignedVarInt32

from streamloop.testing import eventually_async
from tests.support import kafka_frames as frames
from tests.support import kafka_wire as wire
from tests.support.group_record import JOIN, LEAVE, SYNC, GroupCall, GroupRecord
from tests.support.late_broker import GroupDelays, LateProxy

Connect = Callable[[], Awaitable[frames.RawConnection]]

DEADLINE = 5.0
MARGIN = 0.3
AT_ONCE = 0.1
NO_TAGS = UnsignedVarInt32.encode(0)
C = CompactString("utf-8")


class FakeBroker:
    """Answers each request at once (JoinGroup v5/v6, SyncGroup v3, LeaveGroup v1, anything
    else with an ApiVersions v0 answer), one connection's answers in request order."""

    def __init__(self) -> None:
        self.join_error = 0
        self.garbage_join_answers = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                frame = await reader.readexactly(size)
                correlation_id = struct.unpack(">i", frame[4:8])[0]
                writer.write(self._answer(frame, correlation_id))
                await writer.drain()
        except (asyncio.IncompleteReadError, OSError):
            writer.close()
        finally:
            self._writers.discard(writer)

    def _answer(self, frame: bytes, correlation_id: int) -> bytes:
        api_key, version = struct.unpack(">hh", frame[:4])
        head = Int32.encode(correlation_id)
        if api_key == wire.JOIN_GROUP and self.garbage_join_answers:
            body = head + b"\x00"
        elif api_key == wire.JOIN_GROUP and version == 6:
            header = wire.parse_request_header(frame)
            member = wire.parse_join_group_request(frame, header).member_id
            body = (head + NO_TAGS + Int32.encode(0) + Int16.encode(self.join_error) + Int32.encode(1)
                    + C.encode("range") + C.encode(member) + C.encode(member)
                    + UnsignedVarInt32.encode(1) + NO_TAGS)
        elif api_key == wire.JOIN_GROUP:
            member = wire.parse_join_group_request(frame, wire.parse_request_header(frame)).member_id
            body = head + JoinGroupResponse_v5(0, self.join_error, 1, "range", member, member, []).encode()
        elif api_key == wire.SYNC_GROUP:
            body = head + SyncGroupResponse_v3(0, 0, b"assignment").encode()
        elif api_key == wire.LEAVE_GROUP:
            body = head + Int32.encode(0) + Int16.encode(0)
        else:
            body = head + Int16.encode(0) + Int32.encode(0)
        return struct.pack(">i", len(body)) + bytes(body)


@pytest_asyncio.fixture
async def broker() -> AsyncIterator[FakeBroker]:
    fake = FakeBroker()
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


@pytest.fixture
def proxy(broker: FakeBroker) -> Iterator[LateProxy]:
    with LateProxy("127.0.0.1", broker.port) as late:
        yield late


@pytest_asyncio.fixture
async def connect(proxy: LateProxy) -> AsyncIterator[Connect]:
    opened: list[frames.RawConnection] = []

    async def open_one() -> frames.RawConnection:
        conn = await frames.RawConnection.open(proxy.address)
        opened.append(conn)
        return conn

    yield open_one
    proxy.set_delays(GroupDelays())
    for conn in opened:
        await conn.close()


def join(member: str = "m-1", group: str = "g") -> JoinGroupRequest_v5:
    return JoinGroupRequest_v5(group, 10_000, 10_000, member, None, "consumer", [("range", b"")])


def sync(member: str, leader: bool, group: str = "g") -> SyncGroupRequest_v3:
    return SyncGroupRequest_v3(group, 1, member, None, [("m-1", b"a"), ("m-2", b"b")] if leader else [])


async def answer_time(conn: frames.RawConnection, request: object, client_id: str = "c") -> float:
    """Seconds from sending ``request`` to its answer."""
    sent = time.monotonic()
    conn.send(request, client_id)
    _, _, arrived = await conn.receive()
    return arrived - sent


@pytest.mark.asyncio
async def test_the_proxy_listens_below_the_ephemeral_range(proxy: LateProxy) -> None:
    assert 20_000 <= proxy.port < 32_000


@pytest.mark.asyncio
async def test_a_successful_join_answer_is_held(proxy: LateProxy, connect: Connect) -> None:
    proxy.set_delays(GroupDelays(join_s=0.4))
    conn = await connect()
    took = await answer_time(conn, join())
    assert 0.4 <= took < 0.4 + MARGIN
    [call] = proxy.record.calls(JOIN)
    assert call.ok and call.generation_id == 1 and call.client_id == "c"
    assert call.held_s is not None and call.held_s >= 0.4


@pytest.mark.asyncio
async def test_an_error_answer_is_not_held(
    proxy: LateProxy, broker: FakeBroker, connect: Connect
) -> None:
    proxy.set_delays(GroupDelays(join_s=5.0))
    broker.join_error = 79  # MEMBER_ID_REQUIRED
    conn = await connect()
    assert await answer_time(conn, join("")) < AT_ONCE
    assert proxy.record.calls(JOIN)[0].error_code == 79


@pytest.mark.asyncio
async def test_the_followers_sync_answer_is_held_longer_than_the_leaders(
    proxy: LateProxy, connect: Connect
) -> None:
    proxy.set_delays(GroupDelays(leader_sync_s=0.2, follower_sync_s=0.6))
    leader, follower = await connect(), await connect()
    took = await asyncio.gather(answer_time(follower, sync("m-2", False)), answer_time(leader, sync("m-1", True)))
    assert 0.6 <= took[0] < 0.6 + MARGIN
    assert 0.2 <= took[1] < 0.2 + MARGIN
    assert {c.member_id: c.leader for c in proxy.record.calls(SYNC)} == {"m-1": True, "m-2": False}


@pytest.mark.asyncio
async def test_a_held_answer_holds_the_ones_behind_it_and_no_other_connections(
    proxy: LateProxy, connect: Connect
) -> None:
    proxy.set_delays(GroupDelays(join_s=0.5))
    conn, other = await connect(), await connect()
    sent = time.monotonic()
    ids = [conn.send(join()), conn.send(ApiVersionRequest_v0())]
    assert await answer_time(other, ApiVersionRequest_v0()) < AT_ONCE
    answers = [await conn.receive(), await conn.receive()]
    assert [a[0] for a in answers] == ids
    assert all(0.5 <= arrived - sent < 0.5 + MARGIN for _, _, arrived in answers)


@pytest.mark.asyncio
async def test_lowering_the_delays_releases_what_is_held(proxy: LateProxy, connect: Connect) -> None:
    proxy.set_delays(GroupDelays(join_s=30.0))
    conn = await connect()
    conn.send(join())
    await eventually_async(lambda: proxy.record.joins(), DEADLINE, "the broker's answer", interval=0.01)
    changed = time.monotonic()
    await asyncio.to_thread(proxy.set_delays, GroupDelays(join_s=0.2))
    _, _, arrived = await conn.receive()
    answered = proxy.record.joins()[0].answered_at
    assert answered is not None
    assert arrived - changed < 0.2 + MARGIN and arrived - answered >= 0.2


@pytest.mark.asyncio
async def test_flexible_versions_are_held_too(proxy: LateProxy, connect: Connect) -> None:
    proxy.set_delays(GroupDelays(join_s=0.3))
    s = String("utf-8")
    body = (C.encode("g") + Int32.encode(10_000) + Int32.encode(10_000) + C.encode("m-9") + C.encode(None)
            + C.encode("consumer") + UnsignedVarInt32.encode(2) + C.encode("range") + CompactBytes.encode(b"")
            + NO_TAGS + NO_TAGS)
    conn = await connect()
    frame = Int16.encode(wire.JOIN_GROUP) + Int16.encode(6) + Int32.encode(conn.next_correlation_id) \
        + s.encode("flex") + NO_TAGS + body
    sent = time.monotonic()
    conn.send_frame(frame)
    _, answer, arrived = await conn.receive()
    assert 0.3 <= arrived - sent < 0.3 + MARGIN
    assert wire.parse_join_group_response(answer, 6).member_id == "m-9"
    [call] = proxy.record.calls(JOIN)
    assert (call.version, call.client_id, call.group_id, call.member_id) == (6, "flex", "g", "m-9")
    assert call.leader_id == "m-9"
    assert proxy.api_versions_seen() == {wire.JOIN_GROUP: {6}}


@pytest.mark.asyncio
async def test_frames_that_do_not_parse_pass_at_once(
    proxy: LateProxy, broker: FakeBroker, connect: Connect
) -> None:
    proxy.set_delays(GroupDelays(join_s=5.0, leader_sync_s=5.0))
    conn = await connect()
    # A JoinGroup whose body ends early: not understood, so its answer is not held.
    truncated = Int16.encode(wire.JOIN_GROUP) + Int16.encode(5) + Int32.encode(conn.next_correlation_id) \
        + String("utf-8").encode("c") + String("utf-8").encode("g")
    broker.garbage_join_answers = True
    conn.send_frame(truncated)
    sent = time.monotonic()
    _, _, arrived = await conn.receive()
    assert arrived - sent < AT_ONCE
    # A well-formed JoinGroup whose answer does not parse: passed on at once as well.
    assert await answer_time(conn, join()) < AT_ONCE
    assert proxy.unparsed_frames == 2
    [call] = proxy.record.calls(JOIN)
    assert call.answered_at is None and call.released_at is not None


@pytest.mark.asyncio
async def test_stall_and_pass_through_still_work(proxy: LateProxy, connect: Connect) -> None:
    conn = await connect()
    proxy.stall()
    conn.send(join())
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(conn.receive(), 0.3)
    assert proxy.record.calls() == []  # the request is held before the broker, not seen yet
    proxy.pass_through()
    await asyncio.wait_for(conn.receive(), DEADLINE)
    assert [c.ok for c in proxy.record.calls(JOIN)] == [True]


@pytest.mark.asyncio
async def test_leave_group_is_recorded_not_held(proxy: LateProxy, connect: Connect) -> None:
    proxy.set_delays(GroupDelays(join_s=5.0, leader_sync_s=5.0, follower_sync_s=5.0))
    conn = await connect()
    assert await answer_time(conn, LeaveGroupRequest_v1("g", "m-1")) < AT_ONCE
    [call] = proxy.record.calls(LEAVE)
    assert (call.group_id, call.member_id, call.ok) == ("g", "m-1", True)


# -- the delays and the record, by themselves ---------------------------------------------------


def test_group_delays_hold_the_follower_a_second_longer_by_default() -> None:
    assert GroupDelays().follower_s == 0
    assert GroupDelays(leader_sync_s=2).follower_s == 3
    assert GroupDelays(leader_sync_s=2, follower_sync_s=0.5).follower_s == 0.5
    assert GroupDelays(join_s=4).for_call(JOIN, None) == 4
    with pytest.raises(ValueError, match="join_s"):
        GroupDelays(join_s=-1)


class Script:
    """Drives a GroupRecord as the proxy would, on a fake clock."""

    def __init__(self) -> None:
        self.record = GroupRecord()
        self.now = 100.0

    def tick(self) -> float:
        self.now += 1.0
        return self.now

    def join(self, client: str, member: str, generation: int, members: tuple[str, ...] = ()) -> GroupCall:
        call_id = self.record.requested(GroupCall(JOIN, 5, 1, client, "g", member, self.tick()))
        self.record.answered(call_id, self.tick(), 0, generation_id=generation, assigned_member_id=member,
                             leader_id="a", members=members)
        self.record.released(call_id, self.tick())
        return self.record.calls()[-1]

    def sync(self, client: str, member: str, generation: int) -> None:
        call = GroupCall(SYNC, 3, 1, client, "g", member, self.tick(), leader=member == "a", generation_id=generation)
        call_id = self.record.requested(call)
        self.record.answered(call_id, self.tick(), 0)
        self.record.released(call_id, self.tick())


def test_the_record_knows_when_the_group_is_stable_and_what_started_a_rebalance() -> None:
    s = Script()
    record = s.record
    s.join("app-a", "a", 1, members=("a", "b"))
    s.join("app-b", "b", 1)
    s.sync("app-a", "a", 1)
    assert record.stable_since("g") is None  # b has not synced yet
    s.sync("app-b", "b", 1)
    settled = record.stable_since("g")
    assert settled == s.now
    # b rejoins: that starts a rebalance; a's rejoin comes during it.
    s.join("app-b", "b", 2, members=("a", "b"))
    s.join("app-a", "a", 2)
    assert [c.while_stable for c in record.join_requests_since(settled)] == [True, False]
    assert record.stable_since("g") is None
    assert record.generations("g") == [1, 2] and record.last_generation("g") == 2
    s.sync("app-a", "a", 2)
    s.sync("app-b", "b", 2)
    assert record.stable_since("g") == s.now
    assert [c.client_id for c in record.join_requests_since(settled, "app-a")] == ["app-a"]
    assert record.client_of("b") == "app-b"
    assert record.generation_members("g", 2) == {"a", "b"}
    record.clear()
    assert record.calls() == [] and record.stable_since("g") is None


def test_a_rejoin_answered_in_the_same_generation_is_stable_again_after_its_sync() -> None:
    s = Script()
    s.join("app-a", "a", 1, members=("a",))
    s.sync("app-a", "a", 1)
    s.join("app-a", "a", 1)
    assert s.record.stable_since("g") is None
    s.sync("app-a", "a", 1)
    assert s.record.stable_since("g") == s.now


@pytest.mark.asyncio
async def test_expect_no_join_requests_fails_as_soon_as_one_comes() -> None:
    record = GroupRecord()
    await record.expect_no_join_requests(0.05)

    async def join_soon() -> None:
        await asyncio.sleep(0.1)  # the event the check must catch, not a wait for a condition
        record.requested(GroupCall(JOIN, 5, 1, "app-a", "g", "a", time.monotonic()))

    started = time.monotonic()
    with pytest.raises(AssertionError, match="app-a sent a JoinGroup"):
        await asyncio.gather(record.expect_no_join_requests(5.0, client_prefix="app-"), join_soon())
    assert time.monotonic() - started < 1.0
    await record.expect_no_join_requests(0.05, client_prefix="other-")
