"""Session windows: per key, records closer than an inactivity gap fall into one session.

A session is ``[start, end]`` with both ends inclusive: the first and the last
record timestamp in it. A record within the gap of existing sessions merges them
into one (Kafka Streams' ``SessionWindows``). The session store keeps one entry
per session, keyed ``key bytes + end + start`` (8 bytes big-endian each) so that a
key's sessions are adjacent and ordered by end, which is what a merge looks up;
a task's session store is segmented by session end (``streamloop.state.segments``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from streamloop.state.segments import SegmentedBytesStore
from streamloop.state.store import StateStore, exact_classes
from streamloop.state.windows import Windowed, millis

_TIMES = struct.Struct(">qq")
_MAX = 2**63 - 1


@dataclass(frozen=True)
class SessionWindows:
    """Sessions split by ``inactivity_gap_ms`` of silence; ``grace_ms`` admits out-of-order records."""

    inactivity_gap_ms: int
    grace_ms: int

    @classmethod
    def of_inactivity_gap_with_no_grace(cls, inactivity_gap_ms: int) -> SessionWindows:
        return cls.of_inactivity_gap_and_grace(inactivity_gap_ms, 0)

    @classmethod
    def of_inactivity_gap_and_grace(cls, inactivity_gap_ms: int, grace_ms: int) -> SessionWindows:
        return cls(millis(inactivity_gap_ms, "Session inactivity gap", 1), millis(grace_ms, "Session grace", 0))

    @property
    def retention_ms(self) -> int:
        """How long a session stays in its store after its end: until it is closed, plus one gap in
        which a record at the close time may still merge with it."""
        return 2 * self.inactivity_gap_ms + self.grace_ms

    @property
    def close_after_ms(self) -> int:
        """A session is closed once stream time passes its end by this much (gap + grace, as Kafka
        Streams' ``KStreamSessionWindowAggregate`` and its suppression count it)."""
        return self.inactivity_gap_ms + self.grace_ms


class SessionStore(StateStore):
    """A task's session store (Kafka Streams' ``SessionStore``): values per ``Windowed(key, start, end)``."""

    def __init__(self, *args: Any, retention_ms: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.retention_ms = retention_ms
        self.observed_time = -1
        self._expired_at = -1
        durable = self.durable
        self._segments = durable if isinstance(durable, SegmentedBytesStore) else None
        # A session whose key the key serde gives back unchanged goes down as the object written,
        # not decoded from the bytes just encoded (``StateStore._down``).
        self._session_key_classes = exact_classes(self.key_serde)
        self._exact_keys = frozenset({Windowed})

    def _live_from(self) -> int:
        """The oldest session end within the retention of the newest end put (here or beneath: a restore's)."""
        observed = self.observed_time
        segments = self._segments
        if segments is not None and segments.observed > observed:
            observed = segments.observed
        return observed - self.retention_ms

    def _newest_end(self) -> int:
        """No session here ends later: the newest end put (here or beneath: a restore's)."""
        segments = self._segments
        if segments is None:
            return _MAX  # a store that does not track the times written beneath it
        return max(self.observed_time, segments.observed)

    def put(self, session: Windowed, value: Any) -> None:
        """Store ``value`` for the session; ``None`` removes it."""
        if session.end > self.observed_time:
            self.observed_time = session.end
        data = None if value is None else self.value_serde.serialize(value)
        if session.key.__class__ in self._session_key_classes:
            self._write(self._composite(session), data, session, value)
        else:
            self._write(self._composite(session), data)

    def remove(self, session: Windowed) -> None:
        self.put(session, None)

    def fetch_session(self, key: Any, start: int, end: int) -> Any:
        """The value of ``key``'s session ``[start, end]`` (None if there is none)."""
        self._check_open()
        if end < self._live_from():
            return None
        return self._decode_value(self._get(self._composite(Windowed(key, start, end))))

    def find_sessions(self, key: Any, earliest_end: int, latest_start: int) -> list[tuple[Windowed, Any]]:
        """``key``'s sessions ending at or after ``earliest_end`` and starting at or before ``latest_start``,
        by end time."""
        self._check_open()
        raw = self._key(key)
        low = raw + _TIMES.pack(max(earliest_end, self._live_from(), 0), 0)
        # Up to the newest end stored, not the largest time: the keys that merely start with this
        # key's bytes sort between the two (a lookup of customer-1 read every held write of
        # customer-10 to customer-199 before the length check below dropped them), not below it.
        high = raw + _TIMES.pack(self._newest_end(), _MAX)
        found = []
        for stored, value in self._range(low, high):
            # Another key whose bytes start with this key's has a different length (see WindowStore).
            if len(stored) != len(raw) + 16:
                continue
            end, start = _TIMES.unpack(stored[-16:])
            if start <= latest_start:
                found.append((Windowed(key, start, end), self._decode_value(value)))
        return found

    def fetch(self, key: Any) -> list[tuple[Windowed, Any]]:
        """Every session of ``key``, by end time."""
        return self.find_sessions(key, 0, _MAX)

    def all(self) -> Iterator[tuple[Windowed, Any]]:
        self._check_open()
        live_from = self._live_from()
        for stored, value in self._range(None, None):
            if _TIMES.unpack(stored[-16:])[0] >= live_from:
                yield self._decode_key(stored), self._decode_value(value)

    def expire(self) -> int:
        """Drop sessions that ended more than the retention before the latest session end."""
        if self._segments is not None:
            # The segments now wholly past it, without reading the store; returns how many.
            # Persistent: the segments move with what each commit writes (``SegmentedBytesStore.write_batch``):
            # dropping by the time of writes no commit covers yet would leave a disk no commit had.
            return 0 if self.uncommitted is not None else self._segments.advance(self.observed_time)
        horizon = self.observed_time - self.retention_ms
        if horizon <= 0 or self.observed_time - self._expired_at < self.retention_ms:
            return 0
        self._expired_at = self.observed_time
        stale = [k for k, _ in self._range(None, None) if _TIMES.unpack(k[-16:])[0] < horizon]
        for key in stale:
            self.inner.put(key, None)
        return len(stale)

    def _decode_key(self, key: bytes) -> Windowed:
        end, start = _TIMES.unpack(key[-16:])
        return Windowed(self.key_serde.deserialize(key[:-16]), start, end)

    def _composite(self, session: Windowed) -> bytes:
        if session.start < 0 or session.end < session.start:
            raise ValueError(f"State store '{self.name}': session [{session.start}, {session.end}] is not valid")
        return self._key(session.key) + _TIMES.pack(session.end, session.start)


class ReadOnlySessionStore:
    """Interactive queries of a session store over all of this client's (or driver's) tasks."""

    def __init__(self, name: str, stores: Callable[[], list[StateStore]]) -> None:
        self.name = name
        self._stores = stores

    def _instances(self) -> list[SessionStore]:
        return [s for s in self._stores() if isinstance(s, SessionStore) and s.open]

    def fetch(self, key: Any) -> list[tuple[Windowed, Any]]:
        """Every session of ``key`` (a key lives in one task), by end time."""
        for store in self._instances():
            sessions = store.fetch(key)
            if sessions:
                return sessions
        return []

    def fetch_session(self, key: Any, start: int, end: int) -> Any:
        for store in self._instances():
            value = store.fetch_session(key, start, end)
            if value is not None:
                return value
        return None

    def find_sessions(self, key: Any, earliest_end: int, latest_start: int) -> list[tuple[Windowed, Any]]:
        for store in self._instances():
            sessions = store.find_sessions(key, earliest_end, latest_start)
            if sessions:
                return sessions
        return []

    def all(self) -> list[tuple[Windowed, Any]]:
        return [item for store in self._instances() for item in store.all()]
