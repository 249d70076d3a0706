"""``TaskStateManager``: the state stores of one task — open, restore, flush, checkpoint, close.

Persistent stores live under ``state.dir/<application.id>/<task id>/<store>``
with the task's checkpoint file beside them. Caller: the task's coroutine and
the task manager, both on the stream thread's loop.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import anyio

from streamloop.completed_offsets import decode_completed
from streamloop.errors import StateStoreError, StoreLockedError
from streamloop.logcontext import LogContext
from streamloop.records import TopicPartition
from streamloop.serdes import Serde
from streamloop.state import checkpoint
from streamloop.state.bytes_stores import BytesStore, InMemoryBytesStore, RocksDBBytesStore
from streamloop.state.cache import ThreadCache
from streamloop.state.changelog import Append, Changelogger, changelog_topic
from streamloop.state.join_store import JoinWindowStore
from streamloop.state.restore import ProcessedInput, StateRestoreListener, restore_store
from streamloop.state.session_windows import SessionStore
from streamloop.state.sliding_windows import TimestampedWindowStore
from streamloop.state.store import Journal, KeyValueStore, Source, StateStore, WindowStore
from streamloop.state.stores import StoreBuilder, StoreType
from streamloop.state.timestamped import TimestampedKeyValueStore, ValueAndTimestampSerde
from streamloop.state.ttl import TtlKeyValueStore, TtlTimestampedKeyValueStore
from streamloop.state.versioned import VersionedKeyValueStore
from streamloop.transport.base import Consumer, OffsetAndMetadata

log = logging.getLogger(__name__)

@dataclass
class StateSettings:
    """What a stream thread's task manager needs to give its tasks state stores."""

    state_dir: str
    default_persistent: bool
    cache: ThreadCache
    reader_factory: Callable[[], Consumer]
    restore_listener: StateRestoreListener | None = None
    # The client's global tables' stores (streamloop.state.global_store), read by every task.
    global_stores: Mapping[str, StateStore] = field(default_factory=dict)


class TaskStateManager:
    def __init__(
        self,
        task_id: str,
        application_id: str,
        state_dir: str,
        partition: int,
        builders: Iterable[StoreBuilder],
        default_persistent: bool,
        default_key_serde: Serde,
        default_value_serde: Serde,
        append: Append,
        cache: ThreadCache | None,
        timestamp: Callable[[], int],
        source: Source,
        logger: LogContext,
        journal: Journal | None = None,
    ) -> None:
        self.task_id = task_id
        self.directory = os.path.join(state_dir, application_id, task_id)
        self.partition = partition
        self._log = logger
        self.stores: dict[str, StateStore] = {}
        self.changelogs: dict[str, TopicPartition] = {}
        # What the record in progress changed, to undo if it is retried (records in flight: a
        # journal that follows the record in flight, streamloop.tasks.in_flight.RecordJournals).
        self.journal = journal or Journal()
        self._source = source
        self.restored = 0
        try:
            for builder in builders:
                self.stores[builder.name] = self._open(
                    builder, default_persistent, default_key_serde, default_value_serde, application_id, append,
                    cache, timestamp, source)
        except BaseException:
            self.close(clean=False)
            raise
        for store in self.stores.values():
            store.journal = self.journal

    def _open(self, builder: StoreBuilder, default_persistent: bool, default_key_serde: Serde,
              default_value_serde: Serde, application_id: str, append: Append, cache: ThreadCache | None,
              timestamp: Callable[[], int], source: Source) -> StateStore:
        name = builder.name
        inner: BytesStore
        if builder.is_persistent(default_persistent):
            inner = RocksDBBytesStore(name, os.path.join(self.directory, name))
        else:
            inner = InMemoryBytesStore(name)
        changelog = None
        if builder.logging:
            tp = TopicPartition(changelog_topic(application_id, name), self.partition)
            self.changelogs[name] = tp
            changelog = Changelogger(tp.topic, tp.partition, append)
        value_serde = builder.value_serde or default_value_serde
        args = (name, inner, builder.key_serde or default_key_serde, value_serde, changelog,
                cache if builder.caching else None, f"{self.task_id}/{name}", timestamp, source)
        supplier = builder.supplier
        if builder.type is StoreType.WINDOW and supplier.retain_duplicates:
            # A join window of size 0 without grace keeps records for 0 ms: no ``or 1`` here.
            return JoinWindowStore(*args, window_size_ms=supplier.window_size_ms or 1,
                                   retention_ms=supplier.retention_ms or 0)
        if builder.type is StoreType.WINDOW:
            kind = TimestampedWindowStore if supplier.timestamped else WindowStore
            return kind(*args, window_size_ms=supplier.window_size_ms or 1, retention_ms=supplier.retention_ms or 1)
        if builder.type is StoreType.SESSION:
            return SessionStore(*args, retention_ms=supplier.retention_ms or 1)
        if supplier.versioned:
            # Never cached (as in Kafka Streams): each put goes down, with its changelog record.
            return VersionedKeyValueStore(name, inner, builder.key_serde or default_key_serde, value_serde,
                                          changelog, None, f"{self.task_id}/{name}", timestamp, source,
                                          history_retention_ms=supplier.retention_ms or 0)
        if supplier.timestamped:
            # Values are stored with their timestamps, in the changelog too: a restore brings both back.
            timestamped = (name, inner, builder.key_serde or default_key_serde, ValueAndTimestampSerde(value_serde),
                           changelog, cache if builder.caching else None, f"{self.task_id}/{name}", timestamp, source)
            if builder.ttl is not None:
                return TtlTimestampedKeyValueStore(*timestamped, ttl=builder.ttl)
            return TimestampedKeyValueStore(*timestamped)
        if builder.ttl is not None:
            return TtlKeyValueStore(*args, ttl=builder.ttl)
        return KeyValueStore(*args)

    @property
    def persistent(self) -> bool:
        return any(s.persistent for s in self.stores.values())

    @property
    def caching(self) -> bool:
        return any(s.caching for s in self.stores.values())

    def store(self, name: str) -> StateStore:
        try:
            return self.stores[name]
        except KeyError:
            raise StateStoreError(name, f"is not a store of task {self.task_id}") from None

    # -- restore ---------------------------------------------------------------------
    async def restore(self, consumer: Consumer, reader_factory: Callable[[], Consumer],
                      inputs: Iterable[TopicPartition], listener: StateRestoreListener | None,
                      first_buffered: Callable[[TopicPartition], int | None] = lambda _tp: None,
                      committed: Mapping[TopicPartition, OffsetAndMetadata | None] | None = None) -> int:
        """Bring every logged store up to its changelog's end; returns the updates applied.

        ``committed``: the inputs' committed positions, as the task read them when it started
        (read here when not given). ``first_buffered(tp)`` is the offset of the first record
        already fetched for the task, if any: where processing starts when nothing is committed yet.
        """
        await self.open_stores()
        if not self.changelogs:
            return 0
        offsets = checkpoint.read(self.directory) if self.persistent else {}
        ends = await consumer.end_offsets(list(self.changelogs.values()))
        processed: dict[str, ProcessedInput] = {}
        for tp in inputs:
            om = committed[tp] if committed is not None and tp in committed else await consumer.committed(tp)
            if om is not None:
                done = decode_completed(om.offset, om.metadata) if om.metadata else set()
                processed[tp.topic] = ProcessedInput(om.offset, frozenset(done))
                continue
            # Nothing committed: processing starts at the reset position (auto.offset.reset);
            # an update from a record before it will not be made again, so it is applied.
            start = first_buffered(tp)
            if start is None:
                start = await consumer.position(tp)
            processed[tp.topic] = ProcessedInput(start, frozenset())
        self._log.debug("Restoring from changelog end offsets %s; input processed below %s",
                        {str(tp): o for tp, o in sorted(ends.items())},
                        {topic: p.offset for topic, p in sorted(processed.items())})
        total = 0
        for name, tp in self.changelogs.items():
            store = self.stores[name]
            end = ends.get(tp, 0)
            start = offsets.get(tp) if store.persistent else None
            if start is None or start > end:
                if start is not None:
                    self._log.warning("Checkpoint of store '%s' is past its changelog's end (%d > %d): "
                                      "restoring in full", name, start, end)
                store.inner.wipe()
                start = 0
            applied = await restore_store(store, tp, start, end, reader_factory, processed, listener)
            total += applied
            if end > start:
                self._log.info("Restored store '%s' from %s offsets %d..%d: %d update(s)", name, tp, start, end,
                               applied)
        # From here on the local state moves ahead of any checkpoint: a crash must restore in full.
        checkpoint.remove(self.directory)
        self.restored = total
        return total

    async def open_stores(self, patience_s: float = 60.0) -> None:
        """Open the stores; a store still held by the task's previous owner here is retried."""
        deadline = time.monotonic() + patience_s
        for store in self.stores.values():
            while True:
                try:
                    store.inner.open()
                    break
                except StoreLockedError:
                    if time.monotonic() > deadline:
                        raise
                    await anyio.sleep(0.05)

    # -- the record in progress ----------------------------------------------------
    def begin_record(self) -> None:
        self.journal.begin(self._source)

    def end_record(self) -> None:
        self.journal.end()

    def record_hooks(self) -> tuple[Callable[[], None], Callable[[], None]]:
        """``begin_record`` and ``end_record`` as direct calls on the journal, for the per-record path
        (one call fewer each, per record; the journal is the manager's for its whole life)."""
        return functools.partial(self.journal.begin, self._source), self.journal.end

    def undo_record(self) -> int:
        """The record will run again (a timeout retry, or a resume after PAUSE): undo its updates."""
        undone = self.journal.undo()
        if undone:
            self._log.debug("Undid %d store update(s) of a record that will be processed again", undone)
        return undone

    # -- commit ---------------------------------------------------------------------
    def flush_caches(self) -> int:
        """Send the caches' dirty updates down (forwarding them); caller: the task, between records."""
        flushed = 0
        for store in self.stores.values():
            flushed += store.flush_cache()
            store.expire()
        return flushed

    async def write_checkpoint(self, end_offsets: Mapping[TopicPartition, int]) -> None:
        """After the last commit of a clean close: the persistent stores hold everything up to
        these changelog offsets, and nothing more. (Never while the task runs: its local state
        moves ahead of the commit, and a kill must then lead to a full restore.)"""
        if not self.persistent:
            return
        for store in self.stores.values():
            store.flush()
        offsets = {tp: end_offsets[tp] for name, tp in self.changelogs.items()
                   if self.stores[name].persistent and tp in end_offsets}
        checkpoint.write(self.directory, offsets)

    # -- close --------------------------------------------------------------------
    def close(self, clean: bool) -> None:
        """Close every store. After a dirty close the local state may be ahead of the commit: no checkpoint."""
        if not clean:
            # Before the stores close: a thread waiting for their locks must not find it.
            checkpoint.remove(self.directory)
        for store in self.stores.values():
            try:
                store.close()
            except Exception:  # one store failing to close must not keep the others open
                self._log.exception("Error closing store '%s'", store.name)

    def wipe(self) -> None:
        """Delete the task's local state (after a corrupted store or under exactly-once)."""
        shutil.rmtree(self.directory, ignore_errors=True)

