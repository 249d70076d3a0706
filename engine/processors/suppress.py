"""The processor behind ``KTable.suppress``: a time-ordered buffer of the latest update per key.

As Kafka Streams' ``KTableSuppressProcessor``: each update goes into the buffer
under its *buffer time* (the window end for final results, else the record
timestamp); a key already held keeps its first buffer time and takes the new
value. Then, by stream time (the largest record timestamp seen here), every
entry whose buffer time is at most ``stream time - delay`` is emitted, oldest
first, and removed. A buffer over its limit emits its oldest entries early or
stops the application. Final results drop tombstones (a window that never
closed needs no delete); a time limit forwards them.

The buffer is a key-value store with a changelog holding the table store's own
key and value bytes plus the buffer and record times; its in-memory time order
is rebuilt from the store at the first record (after restoring) and after a
retried record's writes were undone.

An entry also keeps its key's *prior value*: the value its first held update
replaced, which is what the suppression last let through (when the table sends
old values; else None). As Kafka Streams' ``KTableSuppressProcessorSupplier``, it
is the suppressed table's value for a join while the key is held back
(``prior_value``), and the old value of the update when it goes out.
"""

from __future__ import annotations

import heapq
import logging
import struct
from collections.abc import Callable
from typing import Any

from streamloop.errors import BufferFullError
from streamloop.processors.api import BaseProcessor, ProcessorContext
from streamloop.processors.change import ChangeRecord, old_value_of
from streamloop.processors.window_close import CloseTime
from streamloop.records import Record
from streamloop.state.session_windows import SessionStore
from streamloop.state.store import KeyValueStore, WindowStore

log = logging.getLogger(__name__)

_HEAD = struct.Struct(">qqBH")  # buffer time, record timestamp, 1 if there is a value, header count
_HEADER = struct.Struct(">HI")  # a header's name length and value length
_PRIOR = struct.Struct(">I")  # the prior value's length, after the headers
_NO_DATA = 0xFFFFFFFF
_ENTRY_OVERHEAD = 24


def _prior_at(entry: bytes) -> int:
    """Where the prior value's length is in ``entry``: after its head and headers."""
    at = _HEAD.size
    for _ in range(_HEAD.unpack_from(entry)[3]):
        name_size, data_size = _HEADER.unpack_from(entry, at)
        at += _HEADER.size + name_size + (0 if data_size == _NO_DATA else data_size)
    return at


def _prior_bytes(entry: bytes) -> bytes | None:
    at = _prior_at(entry)
    (size,) = _PRIOR.unpack_from(entry, at)
    return None if size == _NO_DATA else entry[at + _PRIOR.size:at + _PRIOR.size + size]


def prior_value(buffer: KeyValueStore, key: bytes, value_serde: Any) -> tuple[bool, Any]:
    """``(True, value)`` when ``key`` (the table store's key bytes) is held back: ``value`` is what the
    suppression last let through, the suppressed table's value for it; ``(False, None)`` otherwise."""
    entry = buffer.get(key)
    if entry is None:
        return False, None
    prior = _prior_bytes(entry)
    return True, None if prior is None else value_serde.deserialize(prior)


def _codec(store: Any) -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
    """How the table's store encodes its keys: the buffer keeps them in the same bytes."""
    if isinstance(store, WindowStore):
        return (lambda w: store._composite(w.key, w.start)), store._decode_key
    if isinstance(store, SessionStore):
        return store._composite, store._decode_key
    if isinstance(store, KeyValueStore):
        return store._key, store.key_serde.deserialize
    raise TypeError(f"suppress() cannot buffer the updates of store {store!r}")


class SuppressProcessor(BaseProcessor):
    send_old_values = False  # set when a table operation downstream needs the values updates replace

    def __init__(self, buffer_store: str, table_store: str, final_results: bool, delay_ms: int,
                 max_records: int | None, max_bytes: int | None, shut_down_when_full: bool,
                 closing: CloseTime | None = None) -> None:
        self.buffer_store = buffer_store
        self.table_store = table_store
        self.final_results = final_results
        self.delay_ms = delay_ms
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.shut_down_when_full = shut_down_when_full
        self.observed_time = -1
        self.emitted = 0
        # With a wall-clock close (final results only): the persisted close time of its last
        # emission on the wall clock, and the updates dropped for windows closed already.
        self.closing = closing
        self.dropped = 0

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.buffer: KeyValueStore = context.get_state_store(self.buffer_store)
        table = self._table = context.get_state_store(self.table_store)
        self._encode_key, self._decode_key = _codec(table)
        self._value_serde = table.value_serde
        self.buffer.undo_listener = self._stale
        if self.closing is not None:
            self.closing.init(context, self._on_wall_clock, self._stale)
        # Loaded at the first record: a task restores its stores after its processors' init.
        self._loaded = False

    def _stale(self) -> None:
        self._loaded = False

    def observe_stream_time(self, time: int) -> None:
        if time > self.observed_time:
            self.observed_time = time

    def _load(self) -> None:
        """The time order of what the buffer store holds (restored from its changelog)."""
        self._times: dict[bytes, int] = {}
        self._order: list[tuple[int, bytes]] = []
        self._bytes = 0
        for key, value in self.buffer.all():
            buffer_time = _HEAD.unpack_from(value)[0]
            self._times[key] = buffer_time
            self._order.append((buffer_time, key))
            self._bytes += len(key) + len(value) + _ENTRY_OVERHEAD
        heapq.heapify(self._order)
        if self.closing is not None:
            self.observe_stream_time(self.closing.restored())
        self._loaded = True

    def _on_wall_clock(self, now: int) -> None:
        """The input went quiet: the windows whose end plus grace is past ``now`` close."""
        # The table's updates still in its cache came before the quiet: they go in first.
        self._table.flush_cache()
        if not self._loaded:
            self._load()
        if now <= self.observed_time or self.closing is None:
            return
        self.observe_stream_time(now)
        held = len(self._times)
        self._enforce()
        if len(self._times) < held:
            self.closing.save(self.observed_time)

    def process(self, record: Record) -> None:
        if not self._loaded:
            self._load()
        if record.key is None:
            return
        key = self._encode_key(record.key)
        buffer_time = self._times.get(key)
        if self.closing is not None:
            self.closing.arrived()
            if buffer_time is None and record.key.end <= self.observed_time - self.delay_ms:
                # Closed on the wall clock (the aggregation before, on stream time, still took it).
                if record.value is None:
                    return  # a closed window's tombstone: final results drop those anyway
                self.dropped += 1
                log.warning("Dropping an update of a closed window %s in suppression '%s' (closed up to "
                            "%d, delay %d ms)", record.key, self.buffer_store, self.observed_time,
                            self.delay_ms)
                return
        self.observe_stream_time(record.timestamp)
        if buffer_time is None:
            buffer_time = record.key.end if self.final_results else record.timestamp
            self._times[key] = buffer_time
            heapq.heappush(self._order, (buffer_time, key))
            prior_value = old_value_of(record)
            prior = None if prior_value is None else self._value_serde.serialize(prior_value)
        else:
            old = self.buffer.get(key)
            self._bytes -= len(key) + len(old) + _ENTRY_OVERHEAD
            prior = _prior_bytes(old)  # the key's first held update's: what went out before it
        value = record.value
        headers = tuple(record.headers)
        parts = [_HEAD.pack(buffer_time, record.timestamp, value is not None, len(headers))]
        for name, data in headers:
            raw_name = name.encode()
            # A header without a value (Kafka allows it) is marked by the largest length.
            parts += [_HEADER.pack(len(raw_name), _NO_DATA if data is None else len(data)), raw_name, data or b""]
        parts += [_PRIOR.pack(_NO_DATA if prior is None else len(prior)), prior or b""]
        if value is not None:
            parts.append(self._value_serde.serialize(value))
        entry = b"".join(parts)
        self.buffer.put(key, entry)
        self._bytes += len(key) + len(entry) + _ENTRY_OVERHEAD
        self._enforce()

    def _enforce(self) -> None:
        expiry = self.observed_time - self.delay_ms
        order = self._order
        while order and order[0][0] <= expiry:
            self._emit_oldest()
        if self._over_capacity():
            if self.shut_down_when_full:
                raise BufferFullError(
                    f"Suppression buffer '{self.buffer_store}' is full ({len(self._times)} records, "
                    f"{self._bytes} bytes) and is configured to shut down when full")
            while self._over_capacity():
                self._emit_oldest()

    def _over_capacity(self) -> bool:
        return (self.max_records is not None and len(self._times) > self.max_records) or \
            (self.max_bytes is not None and self._bytes > self.max_bytes)

    def _emit_oldest(self) -> None:
        buffer_time, key = heapq.heappop(self._order)
        if self._times.get(key) != buffer_time:
            return  # emitted already (an entry of an earlier buffering of the key)
        del self._times[key]
        entry = self.buffer.get(key)
        self.buffer.put(key, None)
        self._bytes -= len(key) + len(entry) + _ENTRY_OVERHEAD
        _, timestamp, has_value, count = _HEAD.unpack_from(entry)
        if not has_value and self.final_results:
            return  # a final result of nothing: the window's earlier values were never emitted
        at = _HEAD.size
        headers: list[tuple[str, Any]] = []
        for _ in range(count):
            name_size, data_size = _HEADER.unpack_from(entry, at)
            at += _HEADER.size
            name = entry[at:at + name_size].decode()
            at += name_size
            if data_size == _NO_DATA:
                headers.append((name, None))
                continue
            headers.append((name, entry[at:at + data_size]))
            at += data_size
        (prior_size,) = _PRIOR.unpack_from(entry, at)
        at += _PRIOR.size
        prior = None if prior_size == _NO_DATA else entry[at:at + prior_size]
        at += 0 if prior is None else prior_size
        value = self._value_serde.deserialize(entry[at:]) if has_value else None
        self.emitted += 1
        # As Kafka Streams: the key's latest update goes out with its own timestamp and headers, and
        # replaces what went out before it.
        if self.send_old_values:
            old_value = None if prior is None else self._value_serde.deserialize(prior)
            self.context.forward(ChangeRecord(self._decode_key(key), value, timestamp, tuple(headers), old_value))
        else:
            self.context.forward(Record(self._decode_key(key), value, timestamp, tuple(headers)))
