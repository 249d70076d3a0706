"""Loopback ports for the servers tests start: brokers, Spark masters, consoles, web UIs.

Below the ephemeral range (32768+ on Linux), always. A port picked from the ephemeral range and
closed again, for a subprocess to bind seconds later, can meanwhile become the local port of a
client's outgoing connection (every Kafka client of the other test processes makes them); and a
stopped broker's port can be taken by a client's own reconnecting socket (a TCP self-connect),
after which the broker cannot bind it again on restart. The range is wide so that servers of
several test processes on one machine rarely pick the same port; a clash is the caller's to retry.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterable

__all__ = ["PORT_RANGE", "NoFreePort", "free_port", "free_ports"]

PORT_RANGE = range(20_000, 32_000)
_random = random.Random()


class NoFreePort(RuntimeError):
    """Every port tried in ``PORT_RANGE`` was in use."""


def free_port(exclude: Iterable[int] = ()) -> int:
    """A loopback port in ``PORT_RANGE`` that nothing listens on or is bound to right now."""
    taken = set(exclude)
    for _ in range(200):
        port = _random.choice(PORT_RANGE)
        if port in taken:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise NoFreePort(f"no free loopback port in {PORT_RANGE.start}-{PORT_RANGE.stop - 1}")


def free_ports(count: int) -> list[int]:
    """``count`` different free ports, as :func:`free_port`."""
    ports: list[int] = []
    for _ in range(count):
        ports.append(free_port(ports))
    return ports
