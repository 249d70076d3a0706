"""The innermost layer of a state store: sorted bytes keys to bytes values, in memory or on disk.

Every store a task owns ends in one of these. The layers above add serdes, the
record cache and the changelog (``engine.state.store``). Keys sort as unsigned
bytes, as in RocksDB, so ``range`` means the same thing in both.

Reads may come from another thread (interactive queries) while the stream thread
writes. The in-memory store copies what it iterates in one C-level call, which
the GIL makes atomic; RocksDB supports concurrent readers itself.
"""

from __future__ import annotations

import bisect
import shutil
from collections.abc import Iterator
from typing import Any, Protocol

from engine.errors import MissingExtraError, StateStoreError
from engine.state.directory import make_private_dirs


class StoreLockedError(StateStoreError):
    """The store's files are still held by the task's previous owner in this process (it is closing)."""


class BytesStore(Protocol):
    name: str
    persistent: bool

    def get(self, key: bytes) -> bytes | None: ...

    def put(self, key: bytes, value: bytes | None) -> None:
        """Store ``value`` under ``key``; ``None`` deletes the key."""

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
        # Sorted keys with the key-set version they were made at; rebuilt by the first range
        # after the key set changed. A reader on another thread may store a stale pair: the
        # version check makes the next range ignore it.
        self._version = 0
        self._sorted: tuple[int, list[bytes]] = (0, [])

    def get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def put(self, key: bytes, value: bytes | None) -> None:
        if value is None:
            if self._data.pop(key, None) is not None:
                self._version += 1
            return
        if key not in self._data:
            self._version += 1
        self._data[key] = value

    def range(self, low: bytes | None, high: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        version, keys = self._sorted
        if version != self._version:
            version = self._version
            keys = sorted(self._data)
            self._sorted = (version, keys)
        start = 0 if low is None else bisect.bisect_left(keys, low)
        stop = len(keys) if high is None else bisect.bisect_right(keys, high)
        data = self._data
        for key in keys[start:stop]:
            value = data.get(key)
            if value is not None:
                yield key, value

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
        self._version += 1


def require_rocksdict(store: str) -> None:
    """Raises ``MissingExtraError`` naming ``store`` when ``rocksdict`` (the 'rocksdb' extra) is missing."""
    try:
        import rocksdict  # noqa: F401
    except ImportError as exc:
        raise MissingExtraError(f"The persistent state store '{store}'", "rocksdb", "rocksdict",
                                "or keep it in memory: default.dsl.store='in_memory' for the DSL's stores, "
                                "Materialized(persistent=False) or a Stores.in_memory_* supplier for one store") from exc


class RocksDBBytesStore:
    """A RocksDB database (through ``rocksdict``, the 'rocksdb' extra) in ``directory``; survives restarts."""

    persistent = True

    def __init__(self, name: str, directory: str) -> None:
        require_rocksdict(name)
        from rocksdict import Options, Rdict, WriteOptions

        self.name = name
        self.directory = directory
        self._rdict = Rdict
        self._options = Options(raw_mode=True)
        # No write-ahead log, as in Kafka Streams: the changelog topic is the log. Without a
        # checkpoint (a crash, a dirty close) the store is wiped and restored from the changelog,
        # and a clean close flushes before it checkpoints; the WAL would only double every put.
        self._write_options = WriteOptions()
        # A property at run time; rocksdict's type stubs declare it a method.
        setattr(self._write_options, "disable_wal", True)  # noqa: B010
        self._db: Any = None
        self._open = False

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
        return self._db.get(key)  # type: ignore[no-any-return]

    def put(self, key: bytes, value: bytes | None) -> None:
        if value is None:
            try:
                del self._db[key]
            except KeyError:
                pass
            return
        self._db[key] = value

    def range(self, low: bytes | None, high: bytes | None) -> Iterator[tuple[bytes, bytes]]:
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
            return int(self._db.property_int_value("rocksdb.estimate-num-keys") or 0)
        except Exception:  # noqa: BLE001 - an estimate is best effort
            return 0

    def flush(self) -> None:
        if self._open:
            self._db.flush()

    def close(self) -> None:
        if self._open:
            self._open = False
            self._db.close()

    def wipe(self) -> None:
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)
        self.open()
