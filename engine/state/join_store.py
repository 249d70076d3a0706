"""The window store of one side of a stream-stream join: every record, duplicates kept.

Kafka Streams keeps a join side's records in a window store with
``retainDuplicates``: two records of one key with one timestamp are both kept,
under the stored key ``key + timestamp + sequence number``. Here that is the
serialized key, the timestamp (8 bytes big-endian) and a 4-byte sequence number,
so one key's records are adjacent, in time order, and in arrival order within a
timestamp.

A record is kept for the join window plus the grace period (``retention_ms``) of
the store's stream time (the largest timestamp put): a put older than that is
dropped as late, and a fetch leaves out what is older. The boundary itself is
kept, so window bounds stay inclusive (Kafka Streams' in-memory store drops it,
its RocksDB store keeps a whole segment more; both make a zero-size window never
join).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from streamloop.state.store import WindowStore
from streamloop.state.windows import Windowed

_TS = struct.Struct(">q")
_SEQ = struct.Struct(">I")
_SUFFIX = _TS.size + _SEQ.size
_SEQ_MASK = 0xFFFFFFFF


class JoinWindowStore(WindowStore):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Both unknown until first used: after a restore they come from what the store holds.
        self._observed: int | None = None
        self._seq = 0

    def _stream_time(self) -> int:
        if self._observed is None:
            # Once per store instance, after any restore: the restored records carry the time.
            observed, seq = -1, -1
            for stored, _value in self._range(None, None):
                if len(stored) > _SUFFIX:
                    observed = max(observed, _TS.unpack(stored[-_SUFFIX:-_SEQ.size])[0])
                    seq = max(seq, _SEQ.unpack(stored[-_SEQ.size:])[0])
            self._observed, self._seq = observed, (seq + 1) & _SEQ_MASK
            self.observed_time = observed
        return self._observed

    def put(self, key: Any, value: Any, window_start: int) -> None:
        """Keep ``value`` of ``key`` at time ``window_start`` beside any others; None only moves stream time.

        A record older than the retention is dropped (see the module doc)."""
        observed = max(self._stream_time(), window_start)
        self._observed = self.observed_time = observed
        if window_start < observed - self.retention_ms or value is None:
            return
        seq = self._seq
        self._seq = (seq + 1) & _SEQ_MASK
        stored = self._composite(key, window_start) + _SEQ.pack(seq)
        self._write(stored, self.value_serde.serialize(value))

    def is_expired(self, timestamp: int) -> bool:
        """Whether a record at ``timestamp`` would be dropped as late now."""
        return timestamp < self._stream_time() - self.retention_ms

    def fetch(self, key: Any, window_start: int) -> Any:
        """The first value of ``key`` at exactly ``window_start`` (None if none)."""
        for _ts, value in self.fetch_range(key, window_start, window_start):
            return value
        return None

    def fetch_range(self, key: Any, time_from: int, time_to: int) -> Iterator[tuple[int, Any]]:
        """``(timestamp, value)`` of ``key``'s records within ``[time_from, time_to]``, oldest first."""
        self._check_open()
        time_from = max(time_from, self._stream_time() - self.retention_ms, 0)
        if time_to < time_from:
            return
        raw_key = self._key(key)
        low = raw_key + _TS.pack(time_from) + _SEQ.pack(0)
        high = raw_key + _TS.pack(time_to) + _SEQ.pack(_SEQ_MASK)
        size = len(raw_key) + _SUFFIX
        decode = self.value_serde.deserialize
        for stored, value in self._range(low, high):
            if len(stored) == size:
                yield _TS.unpack(stored[-_SUFFIX:-_SEQ.size])[0], decode(value)

    def fetch_all(self, time_from: int, time_to: int) -> Iterator[tuple[Windowed, Any]]:
        self._check_open()
        time_from = max(time_from, self._stream_time() - self.retention_ms)
        for stored, value in self._range(None, None):
            start = _TS.unpack(stored[-_SUFFIX:-_SEQ.size])[0]
            if time_from <= start <= time_to:
                yield self._decode_key(stored), self.value_serde.deserialize(value)

    def expire(self) -> int:
        """Drop the records past the retention (locally; the changelog's retention drops them there)."""
        if self._observed is None:
            # Not used since it was opened: it may still be restoring (a commit expires the stores of
            # a restoring task too), and reading its time and sequence now would miss what is still
            # to come. As a base window store before its first put, nothing has expired yet.
            return 0
        if self._segments is not None:
            # The segments now wholly past the retention, without reading the store; returns how many.
            # Persistent: the segments move with what each commit writes (``SegmentedBytesStore.write_batch``):
            # dropping by the time of writes no commit covers yet would leave a disk no commit had.
            return 0 if self.uncommitted is not None else self._segments.advance(self._stream_time())
        horizon = self._stream_time() - self.retention_ms
        # A sweep reads the whole store: once per window size of stream time, as the base store does.
        if horizon <= 0 or self._stream_time() - self._expired_at < max(self.window_size_ms, 1):
            return 0
        self._expired_at = self._stream_time()
        stale = [k for k, _ in self._range(None, None) if _TS.unpack(k[-_SUFFIX:-_SEQ.size])[0] < horizon]
        for key in stale:
            self.inner.put(key, None)
        return len(stale)

    def _decode_key(self, key: bytes) -> Windowed:
        start = _TS.unpack(key[-_SUFFIX:-_SEQ.size])[0]
        return Windowed(self.key_serde.deserialize(key[:-_SUFFIX]), start, start + self.window_size_ms)
