"""Just enough of the Kafka wire protocol to watch the group protocol go by, for the late broker.

Frames (both directions) are a 4-byte big-endian size followed by that many bytes. A request
starts with its header (int16 api_key, int16 api_version, int32 correlation_id, nullable
string client_id, then tagged fields in the flexible header versions); a response with int32
correlation_id (then tagged fields when the request's version is flexible, except for
ApiVersions, whose response header is never flexible so that any client can read it).

Parsed here, in the versions Apache Kafka 4.1 defines (clients/src/main/resources/common/
message/*.json in the Kafka sources):

* JoinGroup (11) requests v0-9 and responses v0-9 (flexible from v6);
* SyncGroup (14) requests v0-5 and responses v0-5 (flexible from v4);
* LeaveGroup (13) requests v0-5 (flexible from v4): the group id and member ids; its responses
  only as far as the error code.

aiokafka 0.14 picks the highest version it has a class for that the broker supports: against
Kafka 4.1 that is JoinGroup v5, SyncGroup v3, LeaveGroup v1 and Heartbeat v1, none flexible.

Anything that does not parse raises :class:`WireError`; callers treat such a frame as opaque.
Cutting byte streams into frames is in tests/support/kafka_frames.py.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = [
    "API_VERSIONS",
    "HEARTBEAT",
    "JOIN_GROUP",
    "LEAVE_GROUP",
    "SYNC_GROUP",
    "JoinGroupRequest",
    "JoinGroupResponse",
    "LeaveGroupRequest",
    "RequestHeader",
    "SyncGroupRequest",
    "SyncGroupResponse",
    "WireError",
    "parse_join_group_request",
    "parse_join_group_response",
    "parse_leave_group_request",
    "parse_leave_group_response",
    "parse_request_header",
    "parse_sync_group_request",
    "parse_sync_group_response",
]

JOIN_GROUP = 11
HEARTBEAT = 12
LEAVE_GROUP = 13
SYNC_GROUP = 14
API_VERSIONS = 18

# The first flexible version and the highest version parsed, per api key.
_FLEXIBLE_FROM = {JOIN_GROUP: 6, HEARTBEAT: 4, LEAVE_GROUP: 4, SYNC_GROUP: 4, API_VERSIONS: 3}
_MAX_VERSION = {JOIN_GROUP: 9, LEAVE_GROUP: 5, SYNC_GROUP: 5}

class WireError(ValueError):
    """Bytes that are not what the protocol says they should be."""


def _flexible(api_key: int, version: int) -> bool:
    first = _FLEXIBLE_FROM.get(api_key)
    return first is not None and version >= first


def _check_version(api_key: int, version: int) -> None:
    if not 0 <= version <= _MAX_VERSION[api_key]:
        raise WireError(f"api {api_key} v{version} is not a version this parser knows")


class _Reader:
    """Reads the protocol's primitive types from ``data`` starting at ``offset``."""

    def __init__(self, data: bytes, offset: int = 0) -> None:
        self.data = data
        self.pos = offset

    def _take(self, n: int) -> bytes:
        end = self.pos + n
        if n < 0 or end > len(self.data):
            raise WireError(f"wanted {n} bytes at {self.pos}, the frame has {len(self.data)}")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def int8(self) -> int:
        return int(struct.unpack(">b", self._take(1))[0])

    def int16(self) -> int:
        return int(struct.unpack(">h", self._take(2))[0])

    def int32(self) -> int:
        return int(struct.unpack(">i", self._take(4))[0])

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self._take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise WireError("an unsigned varint longer than 5 bytes")

    def string(self, flexible: bool) -> str | None:
        """A (nullable) string: int16 length, or in flexible versions uvarint length + 1."""
        n = self.uvarint() - 1 if flexible else self.int16()
        if n < 0:
            return None
        try:
            return self._take(n).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WireError(f"a string that is not UTF-8: {exc}") from None

    def skip_bytes(self, flexible: bool) -> int:
        """Skips a (nullable) byte array; returns its length (-1 for null)."""
        n = self.uvarint() - 1 if flexible else self.int32()
        if n >= 0:
            self._take(n)
        return n

    def array_length(self, flexible: bool) -> int:
        """An array's element count (-1 for a null array)."""
        return self.uvarint() - 1 if flexible else self.int32()

    def skip_tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self._take(self.uvarint())


# -- requests --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int | None
    """Where the body starts in the frame; None for an api whose header version is not known here
    (the header's tagged fields are only there in the flexible versions of each api)."""


def parse_request_header(frame: bytes) -> RequestHeader:
    """The header of a request frame (the bytes after the size; a prefix of them is enough)."""
    r = _Reader(frame)
    api_key, api_version, correlation_id = r.int16(), r.int16(), r.int32()
    # client_id is a classic nullable string even in the flexible header (v2).
    client_id = r.string(flexible=False)
    body_offset: int | None = None
    if api_key in _FLEXIBLE_FROM:
        if _flexible(api_key, api_version):
            r.skip_tagged_fields()
        body_offset = r.pos
    return RequestHeader(api_key, api_version, correlation_id, client_id, body_offset)


@dataclass(frozen=True)
class JoinGroupRequest:
    group_id: str | None
    member_id: str | None
    """Empty on a member's first JoinGroup (it is given an id with MEMBER_ID_REQUIRED, v4+)."""


def _body(frame: bytes, header: RequestHeader) -> _Reader:
    if header.body_offset is None:
        raise WireError(f"api {header.api_key}: the header's version is not known")
    return _Reader(frame, header.body_offset)


def parse_join_group_request(frame: bytes, header: RequestHeader) -> JoinGroupRequest:
    _check_version(JOIN_GROUP, header.api_version)
    v = header.api_version
    flexible = _flexible(JOIN_GROUP, v)
    r = _body(frame, header)
    group_id = r.string(flexible)
    r.int32()  # session_timeout_ms
    if v >= 1:
        r.int32()  # rebalance_timeout_ms
    return JoinGroupRequest(group_id=group_id, member_id=r.string(flexible))


@dataclass(frozen=True)
class SyncGroupRequest:
    group_id: str | None
    generation_id: int
    member_id: str | None
    assignments: int
    """How many assignments the request carries: the leader's carries one per member, the
    followers' none."""

    @property
    def leader(self) -> bool:
        return self.assignments > 0


def parse_sync_group_request(frame: bytes, header: RequestHeader) -> SyncGroupRequest:
    _check_version(SYNC_GROUP, header.api_version)
    v = header.api_version
    flexible = _flexible(SYNC_GROUP, v)
    r = _body(frame, header)
    group_id = r.string(flexible)
    generation_id = r.int32()
    member_id = r.string(flexible)
    if v >= 3:
        r.string(flexible)  # group_instance_id
    if v >= 5:
        r.string(flexible)  # protocol_type
        r.string(flexible)  # protocol_name
    return SyncGroupRequest(group_id, generation_id, member_id, max(0, r.array_length(flexible)))


@dataclass(frozen=True)
class LeaveGroupRequest:
    group_id: str | None
    member_ids: tuple[str | None, ...]


def parse_leave_group_request(frame: bytes, header: RequestHeader) -> LeaveGroupRequest:
    _check_version(LEAVE_GROUP, header.api_version)
    v = header.api_version
    flexible = _flexible(LEAVE_GROUP, v)
    r = _body(frame, header)
    group_id = r.string(flexible)
    if v < 3:
        return LeaveGroupRequest(group_id, (r.string(flexible),))
    members: list[str | None] = []
    for _ in range(max(0, r.array_length(flexible))):
        members.append(r.string(flexible))
        r.string(flexible)  # group_instance_id
        if v >= 5:
            r.string(flexible)  # reason
        if flexible:
            r.skip_tagged_fields()
    return LeaveGroupRequest(group_id, tuple(members))


# -- responses -------------------------------------------------------------------------------


def _response_body(frame: bytes, api_key: int, version: int) -> _Reader:
    """A reader past the response header (correlation id, and tagged fields when flexible)."""
    r = _Reader(frame)
    r.int32()  # correlation_id
    if _flexible(api_key, version) and api_key != API_VERSIONS:
        r.skip_tagged_fields()
    return r


@dataclass(frozen=True)
class JoinGroupResponse:
    error_code: int
    generation_id: int
    leader_id: str | None
    member_id: str | None
    members: tuple[str | None, ...]
    """The group's members: only in the leader's answer (it computes the assignment)."""


def parse_join_group_response(frame: bytes, version: int) -> JoinGroupResponse:
    """A JoinGroup response frame (the bytes after the size, from the correlation id on)."""
    _check_version(JOIN_GROUP, version)
    flexible = _flexible(JOIN_GROUP, version)
    r = _response_body(frame, JOIN_GROUP, version)
    if version >= 2:
        r.int32()  # throttle_time_ms
    error_code, generation_id = r.int16(), r.int32()
    if version >= 7:
        r.string(flexible)  # protocol_type
    r.string(flexible)  # protocol_name
    leader_id = r.string(flexible)
    if version >= 9:
        r.int8()  # skip_assignment
    member_id = r.string(flexible)
    members: list[str | None] = []
    for _ in range(max(0, r.array_length(flexible))):
        members.append(r.string(flexible))
        if version >= 5:
            r.string(flexible)  # group_instance_id
        r.skip_bytes(flexible)  # metadata
        if flexible:
            r.skip_tagged_fields()
    return JoinGroupResponse(error_code, generation_id, leader_id, member_id, tuple(members))


@dataclass(frozen=True)
class SyncGroupResponse:
    error_code: int
    assignment_size: int


def parse_sync_group_response(frame: bytes, version: int) -> SyncGroupResponse:
    _check_version(SYNC_GROUP, version)
    flexible = _flexible(SYNC_GROUP, version)
    r = _response_body(frame, SYNC_GROUP, version)
    if version >= 1:
        r.int32()  # throttle_time_ms
    error_code = r.int16()
    if version >= 5:
        r.string(flexible)  # protocol_type
        r.string(flexible)  # protocol_name
    return SyncGroupResponse(error_code, r.skip_bytes(flexible))


def parse_leave_group_response(frame: bytes, version: int) -> int:
    """A LeaveGroup answer's (top-level) error code."""
    _check_version(LEAVE_GROUP, version)
    r = _response_body(frame, LEAVE_GROUP, version)
    if version >= 1:
        r.int32()  # throttle_time_ms
    return r.int16()
