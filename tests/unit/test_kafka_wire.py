"""The late broker's Kafka parsing (tests/support/kafka_wire.py) and frame cutting (kafka_frames.py).

Frames are encoded with aiokafka's own protocol classes where it has them (the versions it
sends: JoinGroup v0-v5, SyncGroup v0-v3, LeaveGroup v0-v1) and otherwise with aiokafka's
primitive types, field by field as Kafka's message schemas (JoinGroupResponse.json, ...) list
them, for the flexible versions other clients send.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from aiokafka.protocol.group import (
    JoinGroupRequest_v0,
    JoinGroupRequest_v1,
    JoinGroupRequest_v5,
    JoinGroupResponse_v0,
    JoinGroupResponse_v2,
    JoinGroupResponse_v5,
    LeaveGroupRequest_v1,
    SyncGroupRequest_v0,
    SyncGroupRequest_v3,
    SyncGroupResponse_v0,
    SyncGroupResponse_v3,
)
from aiokafka.protocol.metadata import MetadataRequest_v1
from aiokafka.protocol.types import (
    Boolean,
    Bytes,
    CompactBytes,
    CompactString,
    Int16,
    Int32,
    String,
    UnsignedVarInt32,
)

from tests.support import kafka_frames as frames
from tests.support import kafka_wire as wire

S = String("utf-8")
C = CompactString("utf-8")
NO_TAGS = UnsignedVarInt32.encode(0)
# A tagged-field section holding one field (tag 0, 3 bytes), which a parser must skip.
SOME_TAGS = UnsignedVarInt32.encode(1) + UnsignedVarInt32.encode(0) + UnsignedVarInt32.encode(3) + b"xyz"


def request_frame(request: Any, correlation_id: int = 7, client_id: str | None = "client-1") -> bytes:
    """An aiokafka request as on the wire, without the size."""
    return bytes(request.build_request_header(correlation_id, client_id).encode() + request.encode())


def flexible_request(api_key: int, version: int, body: bytes, correlation_id: int = 7,
                     client_id: str | None = "client-1") -> bytes:
    """Request header v2: the classic header, a nullable (non-compact) client id, tagged fields."""
    header = Int16.encode(api_key) + Int16.encode(version) + Int32.encode(correlation_id) + S.encode(client_id)
    return bytes(header + SOME_TAGS + body)


def compact_array(items: list[bytes]) -> bytes:
    return bytes(UnsignedVarInt32.encode(len(items) + 1)) + b"".join(items)


def classic_array(items: list[bytes]) -> bytes:
    return bytes(Int32.encode(len(items))) + b"".join(items)


def sized(frame: bytes) -> bytes:
    return struct.pack(">i", len(frame)) + frame


# -- requests ---------------------------------------------------------------------------------


def test_a_classic_request_header() -> None:
    frame = request_frame(MetadataRequest_v1(["t"]), correlation_id=42, client_id="app-1")
    header = wire.parse_request_header(frame)
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (3, 1, 42, "app-1")
    assert header.body_offset is None  # metadata's header version is not one this module knows


def test_a_null_client_id() -> None:
    header = wire.parse_request_header(request_frame(JoinGroupRequest_v5("g", 1, 1, "", None, "c", []), client_id=None))
    assert header.client_id is None


@pytest.mark.parametrize("request_struct", [
    JoinGroupRequest_v0("grp", 10_000, "m-1", "consumer", [("range", b"meta")]),
    JoinGroupRequest_v1("grp", 10_000, 300_000, "m-1", "consumer", [("range", b"meta")]),
    JoinGroupRequest_v5("grp", 10_000, 300_000, "m-1", "instance", "consumer", [("range", b"meta")]),
])
def test_join_group_requests_aiokafka_sends(request_struct: Any) -> None:
    frame = request_frame(request_struct)
    header = wire.parse_request_header(frame)
    assert header.api_key == wire.JOIN_GROUP
    assert wire.parse_join_group_request(frame, header) == wire.JoinGroupRequest("grp", "m-1")


@pytest.mark.parametrize("version", [6, 7, 8, 9])
def test_flexible_join_group_requests(version: int) -> None:
    protocols = compact_array([C.encode("range") + CompactBytes.encode(b"meta") + NO_TAGS])
    reason = C.encode("because") if version >= 8 else b""
    body = (C.encode("grp") + Int32.encode(10_000) + Int32.encode(300_000) + C.encode("") + C.encode(None)
            + C.encode("consumer") + protocols + reason + NO_TAGS)
    frame = flexible_request(wire.JOIN_GROUP, version, body)
    header = wire.parse_request_header(frame)
    assert wire.parse_join_group_request(frame, header) == wire.JoinGroupRequest("grp", "")


@pytest.mark.parametrize("assignments", [[], [("m-1", b"a"), ("m-2", b"b")]])
def test_sync_group_requests_aiokafka_sends(assignments: list[tuple[str, bytes]]) -> None:
    for request_struct in (SyncGroupRequest_v0("grp", 3, "m-1", assignments),
                           SyncGroupRequest_v3("grp", 3, "m-1", None, assignments)):
        frame = request_frame(request_struct)
        sync = wire.parse_sync_group_request(frame, wire.parse_request_header(frame))
        assert sync == wire.SyncGroupRequest("grp", 3, "m-1", len(assignments))
        assert sync.leader is bool(assignments)


@pytest.mark.parametrize("version", [4, 5])
@pytest.mark.parametrize("leader", [False, True])
def test_flexible_sync_group_requests(version: int, leader: bool) -> None:
    items = [C.encode("m-1") + CompactBytes.encode(b"a") + NO_TAGS] if leader else []
    protocol = C.encode("consumer") + C.encode("range") if version >= 5 else b""
    body = C.encode("grp") + Int32.encode(3) + C.encode("m-1") + C.encode("i-1") + protocol + compact_array(items) \
        + NO_TAGS
    frame = flexible_request(wire.SYNC_GROUP, version, body)
    sync = wire.parse_sync_group_request(frame, wire.parse_request_header(frame))
    assert (sync.group_id, sync.generation_id, sync.member_id, sync.leader) == ("grp", 3, "m-1", leader)


def test_leave_group_requests() -> None:
    frame = request_frame(LeaveGroupRequest_v1("grp", "m-1"))
    assert wire.parse_leave_group_request(frame, wire.parse_request_header(frame)) == wire.LeaveGroupRequest(
        "grp", ("m-1",)
    )
    member = S.encode("m-2") + S.encode(None)
    frame = Int16.encode(13) + Int16.encode(3) + Int32.encode(1) + S.encode("c") + S.encode("grp") \
        + classic_array([member])
    assert wire.parse_leave_group_request(frame, wire.parse_request_header(frame)).member_ids == ("m-2",)
    member = C.encode("m-2") + C.encode(None) + C.encode("bye") + NO_TAGS
    frame = flexible_request(wire.LEAVE_GROUP, 5, C.encode("grp") + compact_array([member, member]) + NO_TAGS)
    assert wire.parse_leave_group_request(frame, wire.parse_request_header(frame)).member_ids == ("m-2", "m-2")


# -- responses --------------------------------------------------------------------------------


def test_join_group_responses_aiokafka_reads() -> None:
    members = [("m-1", b"meta"), ("m-2", b"meta")]
    cases = {
        0: JoinGroupResponse_v0(0, 4, "range", "m-1", "m-1", members),
        2: JoinGroupResponse_v2(0, 0, 4, "range", "m-1", "m-1", members),
        5: JoinGroupResponse_v5(0, 0, 4, "range", "m-1", "m-1", [(m, None, meta) for m, meta in members]),
    }
    for version, response in cases.items():
        frame = Int32.encode(9) + response.encode()
        parsed = wire.parse_join_group_response(frame, version)
        assert parsed == wire.JoinGroupResponse(0, 4, "m-1", "m-1", ("m-1", "m-2")), version


def test_a_join_group_error_answer() -> None:
    frame = Int32.encode(9) + JoinGroupResponse_v5(0, 79, -1, "", "", "m-new", []).encode()
    assert wire.parse_join_group_response(frame, 5) == wire.JoinGroupResponse(79, -1, "", "m-new", ())


@pytest.mark.parametrize("version", [6, 7, 8, 9])
def test_flexible_join_group_responses(version: int) -> None:
    member = C.encode("m-2") + C.encode("i-2") + CompactBytes.encode(b"meta") + NO_TAGS
    body = (Int32.encode(0) + Int16.encode(0) + Int32.encode(12)
            + (C.encode("consumer") if version >= 7 else b"")
            + C.encode("range") + C.encode("m-1")
            + (Boolean.encode(False) if version >= 9 else b"")
            + C.encode("m-2") + compact_array([member]) + NO_TAGS)
    # The flexible response header carries tagged fields after the correlation id.
    frame = Int32.encode(9) + SOME_TAGS + body
    assert wire.parse_join_group_response(frame, version) == wire.JoinGroupResponse(0, 12, "m-1", "m-2", ("m-2",))


def test_sync_group_responses() -> None:
    assert wire.parse_sync_group_response(Int32.encode(1) + SyncGroupResponse_v0(0, b"abc").encode(), 0) \
        == wire.SyncGroupResponse(0, 3)
    assert wire.parse_sync_group_response(Int32.encode(1) + SyncGroupResponse_v3(0, 27, b"").encode(), 3) \
        == wire.SyncGroupResponse(27, 0)
    flexible = Int32.encode(1) + SOME_TAGS + Int32.encode(0) + Int16.encode(0) + CompactBytes.encode(b"ab") + NO_TAGS
    assert wire.parse_sync_group_response(flexible, 4) == wire.SyncGroupResponse(0, 2)
    v5 = Int32.encode(1) + NO_TAGS + Int32.encode(0) + Int16.encode(0) + C.encode("consumer") + C.encode("range") \
        + CompactBytes.encode(b"abcd") + NO_TAGS
    assert wire.parse_sync_group_response(v5, 5) == wire.SyncGroupResponse(0, 4)


def test_leave_group_responses() -> None:
    assert wire.parse_leave_group_response(Int32.encode(1) + Int16.encode(25), 0) == 25
    assert wire.parse_leave_group_response(Int32.encode(1) + Int32.encode(0) + Int16.encode(0), 1) == 0
    assert wire.parse_leave_group_response(Int32.encode(1) + SOME_TAGS + Int32.encode(0) + Int16.encode(16), 4) == 16


def test_what_does_not_parse_raises_wire_error() -> None:
    frame = Int32.encode(9) + JoinGroupResponse_v5(0, 0, 4, "range", "m-1", "m-1", []).encode()
    with pytest.raises(wire.WireError, match="version"):
        wire.parse_join_group_response(frame, 10)
    with pytest.raises(wire.WireError, match="wanted"):
        wire.parse_join_group_response(frame[:-6], 5)
    not_utf8 = Int16.encode(14) + Int16.encode(0) + Int32.encode(1) + Int16.encode(1) + b"\xff"
    with pytest.raises(wire.WireError, match="UTF-8"):
        wire.parse_request_header(not_utf8)
    with pytest.raises(wire.WireError):
        wire.parse_request_header(b"\x00\x0b")


# -- cutting streams --------------------------------------------------------------------------


def test_the_request_scanner_keeps_group_requests_whole_and_only_the_head_of_others() -> None:
    join = request_frame(JoinGroupRequest_v5("grp", 1, 1, "", None, "consumer", [("range", b"m" * 3000)]))
    metadata = request_frame(MetadataRequest_v1(["t" * 3000]))
    stream = sized(join) + sized(metadata) + sized(join)
    scanner = frames.RequestScanner(lambda api_key: api_key == wire.JOIN_GROUP, prefix=64)
    for chunking in (1, 7, len(stream)):
        found = [f for i in range(0, len(stream), chunking) for f in scanner.feed(stream[i : i + chunking])]
        assert found == [join, metadata[:64], join]
        assert scanner.broken is None


def test_the_request_scanner_gives_up_on_a_nonsense_size() -> None:
    scanner = frames.RequestScanner(lambda api_key: True)
    assert scanner.feed(b"GET / HTTP/1.1\r\n") == []
    assert scanner.broken is not None and "not a Kafka frame" in scanner.broken
    assert scanner.feed(sized(request_frame(MetadataRequest_v1([])))) == []


def test_the_response_cutter_passes_other_frames_on_as_they_come() -> None:
    kept = Int32.encode(1) + b"k" * 50
    other = Int32.encode(2) + b"o" * 50
    stream = sized(other) + sized(kept) + sized(other)
    cutter = frames.ResponseCutter(lambda correlation_id: correlation_id == 1)
    pieces = [p for b in range(len(stream)) for p in cutter.feed(stream[b : b + 1])]
    assert b"".join(p.data for p in pieces) == stream
    assert [p.correlation_id for p in pieces if p.correlation_id is not None] == [2, 1, 2]
    whole = [p for p in pieces if p.frame is not None]
    assert [(p.frame, p.data) for p in whole] == [(kept, sized(kept))]
    # The other frames went on byte by byte, not gathered.
    assert max(len(p.data) for p in pieces if p.frame is None) <= 8


def test_the_response_cutter_passes_everything_on_after_a_nonsense_size() -> None:
    cutter = frames.ResponseCutter(lambda correlation_id: True)
    good = sized(Int32.encode(1) + b"abc")
    pieces = cutter.feed(good + b"\xff\xff\xff\xff" + b"rest")
    assert [p.frame for p in pieces] == [good[4:], None]
    assert b"".join(p.data for p in pieces) == good + b"\xff\xff\xff\xffrest"
    assert cutter.broken is not None
    assert cutter.feed(good) == [frames.Piece(good)]


def test_a_bytes_field_of_null() -> None:
    frame = Int32.encode(1) + SyncGroupResponse_v0(0, None).encode()
    assert Bytes.encode(None) == Int32.encode(-1)
    assert wire.parse_sync_group_response(frame, 0) == wire.SyncGroupResponse(0, -1)
