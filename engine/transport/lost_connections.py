"""Connections a client lost track of, collected while the event loop they belong to still runs.

aiokafka can lose a connection when a client's start or a request fails half-way against a broker
that is down or frozen (aio-libs/aiokafka#715, open): nothing refers to it any more, but it sits in
a reference cycle. Collected while its loop runs, its ``__del__`` closes the socket; collected after
the loop closed, the socket stays open until the process ends and each part of it warns.

A full collection holds the GIL for as long as the whole heap takes to scan (a second in a large
service), so it stops every other thread of the process, heartbeats included. So a stream thread
collects at its end only when its transport said a connection may have been lost on that thread
(``note``), not at every end (a replaced or removed thread, a rebalance test's hundreds).
"""

from __future__ import annotations

import gc
import threading

__all__ = ["collect", "note"]

_seen = threading.local()


def note() -> None:
    """Caller: a transport, on the thread whose client failed in a way that can lose a connection."""
    _seen.lost = True


def collect() -> bool:
    """Collect garbage if ``note`` was called on this thread since the last collection; whether it did."""
    if not getattr(_seen, "lost", False):
        return False
    _seen.lost = False
    gc.collect()
    return True
