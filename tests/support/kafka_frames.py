"""Cutting Kafka byte streams into frames, and a bare client connection, for the late broker.

Every Kafka frame, either way, is a 4-byte big-endian size and that many bytes; a response's
first 4 of them are the correlation id of the request it answers. The cutters never raise:
after a size that cannot be a Kafka frame they set ``broken`` (the stream cannot be cut any
more) and from then on pass everything through unlooked at.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.support.kafka_wire import WireError

__all__ = ["MAX_FRAME", "Piece", "RawConnection", "RequestScanner", "ResponseCutter"]

# Kafka's socket.request.max.bytes defaults to 100 MiB; a larger size means the stream is not
# Kafka frames (or we lost track of the frame boundaries).
MAX_FRAME = 100 * 1024 * 1024


def _frame_size(head: bytes | bytearray) -> int:
    size = int(struct.unpack(">i", bytes(head[:4]))[0])
    if not 4 <= size <= MAX_FRAME:
        raise WireError(f"a frame size of {size} bytes: not a Kafka frame")
    return size


class RequestScanner:
    """Cuts a client's byte stream into request frames, for watching (not for forwarding).

    :meth:`feed` returns each frame completed by the bytes given: whole when ``keep_whole(api_key)``,
    else only its first ``prefix`` bytes (enough for the header), so a large produce request is
    not copied. After a size that cannot be a frame, ``broken`` says why and nothing more is cut.
    """

    def __init__(self, keep_whole: Callable[[int], bool], prefix: int = 1024) -> None:
        self._keep_whole = keep_whole
        self._prefix = prefix
        self._head = bytearray()  # the size field, while incomplete
        self._frame = bytearray()
        self._size = 0
        self._want = 0  # bytes of the current frame to keep
        self._seen = 0  # bytes of the current frame consumed
        self.broken: str | None = None

    def feed(self, data: bytes) -> list[bytes]:
        frames: list[bytes] = []
        view = memoryview(data)
        while view and self.broken is None:
            if len(self._head) < 4:
                take = 4 - len(self._head)
                self._head += view[:take]
                view = view[take:]
                if len(self._head) == 4:
                    try:
                        self._size = _frame_size(self._head)
                    except WireError as exc:
                        self.broken = str(exc)
                    self._want = self._size
                    self._seen = 0
                continue
            take = min(len(view), self._size - self._seen)
            keep = max(0, min(take, self._want - len(self._frame)))
            self._frame += view[:keep]
            self._seen += take
            view = view[take:]
            if self._want == self._size and len(self._frame) >= 2:
                # Decide once the api key is in: keep the whole frame or a prefix.
                api_key = int(struct.unpack(">h", bytes(self._frame[:2]))[0])
                if not self._keep_whole(api_key):
                    self._want = min(self._size, self._prefix)
                    del self._frame[self._want :]
            if self._seen == self._size:
                frames.append(bytes(self._frame))
                self._head.clear()
                self._frame = bytearray()
        return frames


@dataclass(frozen=True)
class Piece:
    """Bytes of a response stream to forward, in order.

    ``correlation_id`` is set on the first piece of each frame; ``frame`` holds the whole frame
    (after the size) when the cutter was asked to keep it whole, and then ``data`` is the whole
    frame including its size. Pieces of other frames are forwarded as they arrive.
    """

    data: bytes
    correlation_id: int | None = None
    frame: bytes | None = None


class ResponseCutter:
    """Cuts a broker's byte stream into pieces at frame boundaries.

    ``keep_whole(correlation_id)`` says which frames to gather whole (those a proxy may hold
    back); the bytes of every other frame pass on as soon as they come. After a size that
    cannot be a frame, ``broken`` says why and everything from there on (that frame's bytes
    gathered so far included) passes on as opaque pieces.
    """

    _HEAD = 8  # size + correlation id

    def __init__(self, keep_whole: Callable[[int], bool]) -> None:
        self._keep_whole = keep_whole
        self._head = bytearray()
        self._whole = False
        self._frame = bytearray()
        self._left = 0  # bytes of the current frame still to come, after the head
        self.broken: str | None = None

    def feed(self, data: bytes) -> list[Piece]:
        if self.broken is not None:
            return [Piece(data)] if data else []
        pieces: list[Piece] = []
        view = memoryview(data)
        while view:
            if len(self._head) < self._HEAD:
                take = self._HEAD - len(self._head)
                self._head += view[:take]
                view = view[take:]
                if len(self._head) >= 4 and (reason := self._bad_size()) is not None:
                    self.broken = reason
                    pieces.append(Piece(bytes(self._head) + bytes(view)))
                    self._head.clear()
                    return pieces
                if len(self._head) == self._HEAD:
                    self._start_frame(pieces)
                continue
            take = min(len(view), self._left)
            chunk = bytes(view[:take])
            view = view[take:]
            self._left -= take
            if self._whole:
                self._frame += chunk
            else:
                pieces.append(Piece(chunk))
            if self._left == 0:
                self._end_frame(pieces)
        return pieces

    def _bad_size(self) -> str | None:
        try:
            _frame_size(self._head)
        except WireError as exc:
            return str(exc)
        return None

    def _start_frame(self, pieces: list[Piece]) -> None:
        size = _frame_size(self._head)
        correlation_id = int(struct.unpack(">i", bytes(self._head[4:8]))[0])
        self._left = size - 4
        self._whole = bool(self._keep_whole(correlation_id))
        if self._whole:
            self._frame = bytearray(self._head)
        else:
            pieces.append(Piece(bytes(self._head), correlation_id))
        if self._left == 0:
            self._end_frame(pieces)

    def _end_frame(self, pieces: list[Piece]) -> None:
        if self._whole:
            frame = bytes(self._frame)
            correlation_id = int(struct.unpack(">i", frame[4:8])[0])
            pieces.append(Piece(frame, correlation_id, frame[4:]))
            self._frame = bytearray()
        self._head.clear()
        self._whole = False


# -- a bare client connection -------------------------------------------------------------------


class RawConnection:
    """A bare Kafka connection for tests: send aiokafka request structs, read the answers as they
    come (pipelining allowed), to see exactly what arrives when on one connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._next_id = 1

    @classmethod
    async def open(cls, address: str) -> RawConnection:
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        return cls(reader, writer)

    def send(self, request: Any, client_id: str | None = "raw") -> int:
        """Send an aiokafka request struct (``JoinGroupRequest_v5(...)``, ...); returns its
        correlation id."""
        header = request.build_request_header(self._next_id, client_id).encode()
        return self.send_frame(header + request.encode())

    def send_frame(self, frame: bytes) -> int:
        """Send a request frame given without its size (its correlation id is not checked)."""
        correlation_id, self._next_id = self._next_id, self._next_id + 1
        self.writer.write(struct.pack(">i", len(frame)) + frame)
        return correlation_id

    @property
    def next_correlation_id(self) -> int:
        return self._next_id

    async def receive(self) -> tuple[int, bytes, float]:
        """The next answer: its correlation id, its frame (from the correlation id on) and the
        ``time.monotonic()`` it arrived."""
        size = int(struct.unpack(">i", await self.reader.readexactly(4))[0])
        frame = await self.reader.readexactly(size)
        return int(struct.unpack(">i", frame[:4])[0]), frame, time.monotonic()

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()
