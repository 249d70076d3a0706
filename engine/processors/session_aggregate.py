"""The processor behind ``windowed_by(SessionWindows...)`` aggregations.

Per record, as Kafka Streams' ``KStreamSessionWindowAggregate``: find the key's
sessions within the inactivity gap of the record, merge their aggregates (with
the merger) into one session spanning them and the record, remove the merged
sessions (each removal goes downstream as a tombstone for its ``Windowed`` key),
and store the new aggregate. A record whose merged session would end before the
close time (stream time - gap - grace) is late and dropped. Updates go downstream
with the session's end as their timestamp.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamloop.processors.stateful import _WindowedAggregate
from streamloop.records import Record
from streamloop.state.session_windows import SessionStore, SessionWindows
from streamloop.state.windows import Windowed


class SessionWindowAggregateProcessor(_WindowedAggregate):
    def __init__(self, store_name: str, windows: SessionWindows, initializer: Callable[[], Any],
                 aggregator: Callable[[Any, Any, Any], Any], merger: Callable[[Any, Any, Any], Any]) -> None:
        super().__init__(store_name, initializer, aggregator)
        self.windows = windows
        self.merger = merger

    def _forward(self, key: Any, value: Any, timestamp: int) -> None:
        self.context.forward(Record(key, value, key.end))

    def process(self, record: Record) -> None:
        # Kafka Streams drops only records without a key here: the aggregator sees None values.
        if not self._admit(record, needs_value=False):
            return
        timestamp = record.timestamp
        windows = self.windows
        close_time = self.observed_time - windows.close_after_ms
        store: SessionStore = self.store
        gap = windows.inactivity_gap_ms
        merged = store.find_sessions(record.key, timestamp - gap, timestamp + gap)
        aggregate = self.initializer()
        start = end = timestamp
        for session, value in merged:
            aggregate = self.merger(record.key, aggregate, value)
            start, end = min(start, session.start), max(end, session.end)
        if end < close_time:
            self._drop(record, f"late: session [{start}, {end}] closed (stream time {self.observed_time}, "
                               f"gap {gap} ms, grace {windows.grace_ms} ms)")
            return
        if (start, end) != (timestamp, timestamp):
            # As Kafka Streams: every merged session goes, even one the new session equals (its
            # tombstone then its new value go downstream, coalesced by the cache if there is one).
            for session, _ in merged:
                store.remove(session)
        self._store_session(Windowed(record.key, start, end), self.aggregator(record.key, record.value, aggregate))

    def _store_session(self, session: Windowed, aggregate: Any) -> None:
        self.store.put(session, aggregate)
