"""CPU time of one OS thread of this process, read from ``/proc`` (Linux).

``/proc/self/task/<tid>/schedstat`` gives the nanoseconds a thread has run on a CPU, finer than
the clock ticks of ``stat``. A benchmark reads it for the thread it times (a stream thread, or a
peer's own loop thread), so the harness's work on other threads does not count.
"""

from __future__ import annotations

import threading


def thread_cpu_ns(native_id: int) -> int | None:
    """Nanoseconds thread ``native_id`` of this process has run so far; None once it has ended."""
    try:
        with open(f"/proc/self/task/{native_id}/schedstat") as stat:
            return int(stat.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def named_threads_cpu_ns(part: str) -> int | None:
    """Nanoseconds run by the live threads whose name holds ``part`` (None: no such thread)."""
    total = None
    for thread in threading.enumerate():
        if part not in thread.name or thread.native_id is None:
            continue
        ns = thread_cpu_ns(thread.native_id)
        if ns is not None:
            total = (total or 0) + ns
    return total
