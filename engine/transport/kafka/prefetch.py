"""Take what aiokafka already fetched for a partition, before it is paused.

aiokafka keeps one fetched response per partition and hands it out through ``getmany``
in slices of ``max_records``. Pausing a partition makes the next ``getmany`` throw the
rest of that response away (``FetchResult.check_assignment``), and on resume the broker
sends it again while the stream thread waits. Back-pressure pauses often (every time a
buffer reaches ``buffered.records.per.partition``), so the engine takes that rest into
the task's buffer first: nothing fetched is discarded, and the buffer exceeds the limit
by at most one fetch of the partition (``max.partition.fetch.bytes``). The Java consumer
keeps a paused partition's completed fetch for the same reason (KAFKA-7548).

aiokafka has no public call for this; the fetcher's private state is read defensively
and a version without it simply pauses as before.
"""

from __future__ import annotations

from typing import Any

try:  # private API: absent or moved in another aiokafka version means "take nothing"
    from aiokafka.consumer.fetcher import FetchResult as _FetchResult
except ImportError:  # pragma: no cover - depends on the installed aiokafka
    _FetchResult = None


def take_prefetched(consumer: Any, tp: Any) -> list[Any]:
    """The records of ``tp`` fetched but not yet returned by ``getmany``, consumed (the
    consumer's position moves past them); empty when there are none or they cannot be read.

    Must run before ``pause(tp)``: aiokafka returns nothing for a paused partition. A fetch
    error stays where it is, for the next ``getmany`` to raise.
    """
    fetcher = getattr(consumer, "_fetcher", None)
    pending = getattr(fetcher, "_records", None)
    if _FetchResult is None or not isinstance(pending, dict):
        return []
    result: Any = pending.get(tp)
    if type(result) is not _FetchResult:
        return []
    taken: list[Any] = result.getall()  # checks assignment and position like getmany does
    if not result.has_more():
        # What getmany does once a response is used up: forget it and wake the fetch routine,
        # which otherwise holds back every fetch from this partition's broker while it waits.
        del pending[tp]
        notify = getattr(fetcher, "_notify", None)
        waiter = getattr(fetcher, "_wait_consume_future", None)
        if notify is not None:
            notify(waiter)
    return taken
