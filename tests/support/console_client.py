"""A scripted telnet client for the aiomonitor console, as a test types into it.

prompt_toolkit's telnet server starts a session only once the client has told
its terminal type (TTYPE), and sizes its output by the window size (NAWS): the
client answers both (a wide window, so tables do not wrap) and every cursor
position request, and strips the terminal's escape codes from what it reads.
``command`` types one line and returns the text printed between the echoed
line and the next prompt. With ``token``, the client answers the console's
``token:`` prompt with it first.
"""

from __future__ import annotations

import contextlib
import re
import select
import socket
import struct
import time
from collections.abc import Callable
from typing import TypeVar

from streamloop.testing.waiting import eventually

IAC, DONT, DO, WONT, WILL, SB, SE = 255, 254, 253, 252, 251, 250, 240
TTYPE, NAWS = 24, 31
TTYPE_IS, TTYPE_SEND = 0, 1

# CSI sequences, OSC sequences, charset selection and other two-byte escapes.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[()][0-9A-Za-z]|\x1b[=>78]")
_CPR_REQUEST = "\x1b[6n"
TOKEN_PROMPT = "token:"

T = TypeVar("T")


class ConsoleClient:
    def __init__(self, host: str, port: int, prompt: str = "streamloop >>> ", timeout: float = 30.0,
                 token: str | None = None) -> None:
        self.prompt = prompt
        self.timeout = timeout
        self._sock = eventually(lambda: _connect(host, port), timeout, f"the console listening on {host}:{port}")
        self._raw = bytearray()
        self.text = ""  # everything shown so far, escape codes removed
        if token is not None:
            self._read_until(lambda: TOKEN_PROMPT in self.text or None, "the token prompt")
            self._sock.sendall(token.encode() + b"\r")
        self._read_until(lambda: self.prompt in self.text or None, "the first prompt")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.sendall(b"exit\r")
        self._sock.close()

    def reset(self) -> None:
        """Drop the connection with a TCP reset, as a killed client or a network failure does."""
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self._sock.close()

    def __enter__(self) -> ConsoleClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def command(self, line: str) -> str:
        """Type ``line`` and Enter; the command's output, once the next prompt is shown.

        prompt_toolkit draws the typed line more than once (while typing, and again on
        Enter), so the answer is what follows the *last* echo of the line up to the next
        prompt; every command prints something, so a blank stretch is not an answer yet.
        """
        start = len(self.text)
        self._sock.sendall(line.encode() + b"\r")
        echo = self.prompt + line

        def answered() -> str | None:
            text = self.text[start:].replace("\r", "")
            end_of_echo = -1
            at = text.find(echo + "\n")
            while at >= 0:
                end_of_echo = at + len(echo) + 1
                at = text.find(echo + "\n", end_of_echo)
            if end_of_echo < 0:
                return None
            prompt_at = text.find(self.prompt, end_of_echo)
            if prompt_at < 0:
                return None
            answer = text[end_of_echo:prompt_at].strip("\n")
            return answer if answer.strip() else None

        return self._read_until(answered, f"the answer to {line!r}")

    def type_line(self, line: str) -> None:
        """Type ``line`` and Enter without waiting for an answer."""
        self._sock.sendall(line.encode() + b"\r")

    def wait_for(self, text: str, after: int = 0) -> None:
        """Read until ``text`` is shown past position ``after`` of ``self.text``."""
        self._read_until(lambda: text in self.text[after:].replace("\r", "") or None, repr(text))

    def wait_closed(self) -> None:
        """Read until the console closes the connection; ``TimeoutError`` if it stays open."""
        try:
            self._read_until(lambda: None, "close of the connection")
        except ConnectionError:
            return

    def _read_until(self, done: Callable[[], T | None], what: str) -> T:
        deadline = time.monotonic() + self.timeout
        while True:
            result = done()
            if result:
                return result
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"No {what} within {self.timeout} s; the console showed:\n{self.text}")
            ready, _, _ = select.select([self._sock], [], [], left)
            if ready:
                data = self._sock.recv(65536)
                if not data:
                    raise ConnectionError(f"The console closed the connection; it showed:\n{self.text}")
                self._feed(data)

    def _feed(self, data: bytes) -> None:
        self._raw += data
        shown = bytearray()
        raw = self._raw
        i = 0
        while i < len(raw):
            byte = raw[i]
            if byte != IAC:
                shown.append(byte)
                i += 1
                continue
            if i + 1 >= len(raw):
                break  # the rest of the command comes with the next read
            command = raw[i + 1]
            if command in (DO, DONT, WILL, WONT):
                if i + 2 >= len(raw):
                    break
                self._negotiate(command, raw[i + 2])
                i += 3
            elif command == SB:
                end = raw.find(bytes((IAC, SE)), i)
                if end < 0:
                    break
                self._subnegotiate(bytes(raw[i + 2:end]))
                i = end + 2
            elif command == IAC:
                shown.append(IAC)
                i += 2
            else:
                i += 2
        del raw[:i]
        text = shown.decode("utf-8", errors="replace")
        for _ in range(text.count(_CPR_REQUEST)):
            # prompt_toolkit asks where the cursor is; any answer lets it draw at once.
            self._sock.sendall(b"\x1b[1;1R")
        self.text += _ESCAPES.sub("", text)

    def _negotiate(self, command: int, option: int) -> None:
        if command == DO and option == TTYPE:
            self._sock.sendall(bytes((IAC, WILL, TTYPE)))
        elif command == DO and option == NAWS:
            width, height = 250, 60
            self._sock.sendall(bytes((IAC, WILL, NAWS, IAC, SB, NAWS)) + width.to_bytes(2, "big")
                               + height.to_bytes(2, "big") + bytes((IAC, SE)))

    def _subnegotiate(self, body: bytes) -> None:
        if body[:2] == bytes((TTYPE, TTYPE_SEND)):
            self._sock.sendall(bytes((IAC, SB, TTYPE, TTYPE_IS)) + b"vt100" + bytes((IAC, SE)))


def _connect(host: str, port: int) -> socket.socket | None:
    try:
        return socket.create_connection((host, port), timeout=5)
    except OSError:
        return None
