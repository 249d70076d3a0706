"""aiokafka clients kept by a Spark Python worker across the ranges it reads and writes
(``range_fetch``, ``range_write``).

Spark reuses its Python workers from task to task (``spark.python.worker.reuse``, on by default),
so a worker that read one range of a partition is likely to read the next. Starting an aiokafka
client costs a connection, a metadata round trip and, for a consumer, the first fetch's set-up:
paid once per worker here instead of once per range. Each client lives on its worker's one
private event loop, which runs only while a range is read or written (this is a Spark task's
thread, never a loop of ours). A client whose call failed is closed and dropped, so the retry of
the Spark task starts afresh.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar

__all__ = ["borrowed"]

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_clients: dict[tuple[str, tuple[tuple[str, Any], ...]], Any] = {}


def _worker_loop() -> asyncio.AbstractEventLoop:
    global _loop
    if _loop is None or _loop.is_closed():
        _loop = asyncio.new_event_loop()
        atexit.register(_close_all)
    return _loop


def run(coroutine: Awaitable[T]) -> T:
    """Run ``coroutine`` on the worker's loop (call inside ``borrowed``)."""
    return _worker_loop().run_until_complete(coroutine)


@contextlib.contextmanager
def borrowed(kind: str, options: Mapping[str, Any], start: Callable[[], Awaitable[Any]]) -> Iterator[Any]:
    """The worker's started client of ``kind`` for ``options`` (``start()`` makes one when there is
    none); it is closed and forgotten if the block raises. One block at a time per worker: Spark
    runs one task at a time in a Python worker, and the lock keeps a second thread (a local
    session's workers are processes, but nothing here relies on it) from sharing the loop."""
    key = (kind, tuple(sorted((k, v) for k, v in options.items() if isinstance(v, str | int | float | bool))))
    with _lock:
        client = _clients.pop(key, None)
        if client is None:
            client = run(start())
        try:
            yield client
        except BaseException:
            _stop(client)
            raise
        _clients[key] = client


def _stop(client: Any) -> None:
    # A broken client is being dropped: the error that matters is the block's own.
    with contextlib.suppress(Exception):
        run(client.stop())


def _close_all() -> None:
    with _lock:
        for client in _clients.values():
            _stop(client)
        _clients.clear()
        if _loop is not None and not _loop.is_closed():
            _loop.close()
