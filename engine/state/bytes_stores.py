"""The innermost layer of a state store: sorted bytes keys to bytes values, in memory or on disk.

Every store a task owns ends in one of these. The layers above add serdes, the
record cache and the changelog (``streamloop.state.store``). Keys sort as unsigned
bytes, as in RocksDB, so ``range`` means the same thing in both.

Reads may come from another thread (interactive queries) while the stream thread
writes. The in-memory store copies what it iterates in one C-level call, which
the GIL makes atomic; RocksDB supports concurrent readers itself.
"""

from __future__ import annotations

import bisect
import shutil
import threading
from collections.abc import Iterator
from typing import Any, Protocol

from streamloop.errors import MissingExtraError, StateStoreError, StoreLockedError
from streamloop.state.directory import make_private_dirs

_ABSENT = object()


class BytesStore(Protocol):
    name: str
    persistent: bool

    def get(self, key: bytes) -> bytes | None: ...

    def put(self, key: bytes, value: bytes | None, source: tuple[str, int] | None = None) -> None:
        """Store ``value`` under ``key``; ``None`` deletes the key. ``source``: the input record that
        caused the write (``streamloop.state.uncommitted`` holds it until a commit covers it)."""

    def write_batch(self, entries: list[tuple[bytes, bytes | None]]) -> None:
        """Apply ``entries`` at once and durably (a commit's covered writes)."""

    def range(self, low: bytes | None, high: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        """Entries with ``low <= key <= high`` (either bound may be open), in key order."""

    def approximate_num_entries(self) -> int: ...

    def open(self) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...

    def wipe(self) -> None:
        """Remove every entry (before a full restore)."""


class InMemoryBytesStore:
    persistent = False

    def __init__(self, name: str) -> None:
        self.name = name
        self._data: dict[bytes, bytes] = {}
        # The keys in order, kept sorted as keys come and go (a join or windowed store ranges
        # after nearly every put: sorting on each range made that quadratic). Only the writing
        # thread reads this list in place; a reader on another thread copies it first.
        self._keys: list[bytes] = []
        self._writer: int | None = None

    def get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def put(self, key: bytes, value: bytes | None, source: tuple[str, int] | None = None) -> None:
        self._writer = threading.get_ident()
        if value is None:
            if self._data.pop(key, None) is not None:
                keys = self._keys
                del keys[bisect.bisect_left(keys, key)]
            return
        if key not in self._data:
            bisect.insort(self._keys, key)
        self._data[key] = value

    def range(self, low: bytes | None, high: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        keys = self._keys
        if threading.get_ident() != self._writer:
            # One C-level copy (atomic under the GIL): the writer may insert while this reads.
            keys = list(keys)
        start = 0 if low is None else bisect.bisect_left(keys, low)
        stop = len(keys) if high is None else bisect.bisect_right(keys, high)
        data = self._data
        for key in keys[start:stop]:
            value = data.get(key)
            if value is not None:
                yield key, value

    def write_batch(self, entries: list[tuple[bytes, bytes | None]]) -> None:
        for key, value in entries:
            self.put(key, value)

    def scan(self, low: bytes | None, limit: int) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` entries from ``low`` on, in key order, copying no more keys than that
        (``range`` copies every key it covers first): a bounded step over a large store."""
        keys = self._keys
        if threading.get_ident() != self._writer:
            keys = list(keys)  # as in ``range``: the writer may insert while this reads
        start = 0 if low is None else bisect.bisect_left(keys, low)
        data = self._data
        return [(key, data[key]) for key in keys[start:start + limit] if key in data]

    def approximate_num_entries(self) -> int:
        return len(self._data)

    def open(self) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def wipe(self) -> None:
        self._data = {}
        self._keys = []


def require_rocksdict(store: str) -> None:
    """Raises ``MissingExtraError`` naming ``store`` when ``rocksdict`` (the 'rocksdb' extra) is missing."""
    try:
        import rocksdict  # noqa: F401
    except ImportError as exc:
        raise MissingExtraError(f"The persistent state store '{store}'", "rocksdb", "rocksdict",
                                "or keep it in memory: default.dsl.store='in_memory' for the DSL's stores, "
                                "Materialized(persistent=False) or a Stores.in_memory_* supplier for one store"
                                ) from exc


class RocksDBBytesStore:
    """A RocksDB database (through ``rocksdict``, the 'rocksdb' extra) in ``directory``; survives restarts.

    Writes collect in a dict and go to RocksDB in one write batch once ``PENDING_ENTRIES`` keys or
    ``PENDING_BYTES`` are pending, and at ``flush`` and ``close``: a put per update costs about as
    much as the rest of an aggregation's store work, a dict entry next to nothing. A task's writes
    reach it only at a commit (``streamloop.state.uncommitted`` holds them until then), in one
    logged and synced ``write_batch``; the pending dict serves a restore's and a standby's writes,
    which a checkpoint names only after ``flush``.
    """

    persistent = True
    PENDING_ENTRIES = 4096
    PENDING_BYTES = 1 << 20

    def __init__(self, name: str, directory: str) -> None:
        require_rocksdict(name)
        from rocksdict import Options, Rdict, WriteBatch, WriteOptions

        self.name = name
        self.directory = directory
        self._rdict = Rdict
        self._write_batch = WriteBatch
        self._options = Options(raw_mode=True)
        # No write-ahead log, as in Kafka Streams: the changelog topic is the log. Without a
        # checkpoint (a crash, a dirty close) the store is wiped and restored from the changelog,
        # and a clean close flushes before it checkpoints; the WAL would only double every put.
        self._write_options = WriteOptions()
        # A property at run time; rocksdict's type stubs declare it a method.
        setattr(self._write_options, "disable_wal", True)  # noqa: B010
        # A commit's write batch (``write_batch``) is the exception: logged and synced, so that the
        # store a crash leaves is the last commit's (the checkpoint names it; see
        # ``streamloop.state.uncommitted``). One sequential write per store and commit.
        self._durable = WriteOptions()
        setattr(self._durable, "sync", True)  # noqa: B010
        self._db: Any = None
        self._open = False
        # Writes not yet in RocksDB, applied in one write batch (see ``_write_pending``). Replaced,
        # never mutated after a batch, so a reader on another thread sees the old or the new.
        self._pending: dict[bytes, bytes | None] = {}
        self._pending_bytes = 0
        # The pending keys in order, for ranges on the writing thread (a join's fetch after each
        # put would otherwise sort all pending writes); other threads sort a copy of the dict.
        self._pending_keys: list[bytes] = []
        self._writer: int | None = None

    def open(self) -> None:
        """Open the database; raises ``StoreLockedError`` while another task instance still has it."""
        if self._open:
            return
        # RocksDB creates its files with its own mode (0644 less the umask); the 0700 directories
        # from state.dir down are what keep other users out.
        make_private_dirs(self.directory)
        try:
            self._db = self._rdict(self.directory, self._options)
            self._db.set_write_options(self._write_options)
        except Exception as exc:
            if "lock" in str(exc).lower():
                raise StoreLockedError(self.name, f"{self.directory} is still open elsewhere: {exc}") from exc
            raise StateStoreError(self.name, f"cannot open RocksDB in {self.directory}: {exc}") from exc
        self._open = True

    def get(self, key: bytes) -> bytes | None:
        pending = self._pending.get(key, _ABSENT)
        if pending is not _ABSENT:
            return pending  # type: ignore[return-value]  # bytes, or None for a delete
        return self._db.get(key)  # type: ignore[no-any-return]  # rocksdict returns Any; we store bytes

    def put(self, key: bytes, value: bytes | None, source: tuple[str, int] | None = None) -> None:
        self._writer = threading.get_ident()
        if key not in self._pending:
            bisect.insort(self._pending_keys, key)
        self._pending[key] = value
        # Overwrites count again: a bound on memory, not an exact size.
        self._pending_bytes += len(key) + (len(value) if value is not None else 0)
        if len(self._pending) >= self.PENDING_ENTRIES or self._pending_bytes >= self.PENDING_BYTES:
            self._write_pending()

    def _write_pending(self) -> None:
        pending = self._pending
        if not pending:
            return
        batch = self._write_batch(raw_mode=True)
        for key, value in pending.items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        self._db.write(batch, self._write_options)
        # Only now: a reader on another thread finds each key in the old dict or in RocksDB.
        self._pending = {}
        self._pending_keys = []
        self._pending_bytes = 0

    def range(self, low: bytes | None, high: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        pending: list[tuple[bytes, bytes | None]]
        if threading.get_ident() == self._writer:
            keys, data = self._pending_keys, self._pending
            start = 0 if low is None else bisect.bisect_left(keys, low)
            stop = len(keys) if high is None else bisect.bisect_right(keys, high)
            pending = [(k, data[k]) for k in keys[start:stop]]
        else:
            # One C-level copy (atomic under the GIL), so the stream thread may write meanwhile.
            pending = sorted((k, v) for k, v in list(self._pending.items())
                             if (low is None or k >= low) and (high is None or k <= high))
        return overlay(pending, self._stored_range(low, high))

    def write_batch(self, entries: list[tuple[bytes, bytes | None]]) -> None:
        """One RocksDB write batch through the write-ahead log, synced: a commit's writes survive a
        crash (of the process or the machine) before its checkpoint names them."""
        self._write_pending()
        batch = self._write_batch(raw_mode=True)
        for key, value in entries:
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        self._db.write(batch, self._durable)

    def delete_range(self, low: bytes, high: bytes) -> None:
        """Delete every key with ``low <= key < high`` at once (a segmented store's expired segments),
        logged and synced as ``write_batch`` is: rare, and a dropped range should stay dropped."""
        self._write_pending()
        self._db.delete_range(low, high, self._durable)

    def _stored_range(self, low: bytes | None, high: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        it = self._db.iter()
        if low is None:
            it.seek_to_first()
        else:
            it.seek(low)
        while it.valid():
            key = it.key()
            if high is not None and key > high:
                return
            yield key, it.value()
            it.next()

    def approximate_num_entries(self) -> int:
        try:
            stored = int(self._db.property_int_value("rocksdb.estimate-num-keys") or 0)
        except Exception:  # an estimate is best effort
            stored = 0
        return stored + len(self._pending)

    def flush(self) -> None:
        if self._open:
            self._write_pending()
            self._db.flush()

    def close(self) -> None:
        if self._open:
            self._open = False
            try:
                self._write_pending()
            finally:
                self._pending = {}
                self._pending_keys = []
                self._pending_bytes = 0
                self._db.close()

    def wipe(self) -> None:
        self._pending = {}
        self._pending_keys = []
        self._pending_bytes = 0
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)
        self.open()


def overlay(held: list[tuple[bytes, bytes | None]], stored: Iterator[tuple[bytes, bytes]]
            ) -> Iterator[tuple[bytes, bytes]]:
    """Merge ``held`` writes (sorted; None deletes) over ``stored`` entries (sorted), in key order."""
    if not held:
        yield from stored
        return
    current = next(stored, None)
    for key, value in held:
        while current is not None and current[0] < key:
            yield current
            current = next(stored, None)
        if current is not None and current[0] == key:
            current = next(stored, None)
        if value is not None:
            yield key, value
    while current is not None:
        yield current
        current = next(stored, None)
