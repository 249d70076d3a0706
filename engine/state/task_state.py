"""``TaskStateManager``: the state stores of one task — open, restore, flush, commit, checkpoint, close.

Persistent stores live under ``state.dir/<application.id>/<task id>/<store>``
with the task's checkpoint file beside them. Their writes are held in memory until a
commit covers them (``streamloop.state.uncommitted``), so the disk holds the state of
a commit, and the checkpoint, written after commits, names the changelog offset a
restore continues from: after a crash only the changelog's tail is read. Caller: the
task's coroutine and the task manager, both on the stream thread's loop.
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
from streamloop.state.segments import (
    MemorySegments,
    RocksDBSegments,
    SegmentedBytesStore,
    layout_reset,
    segment_interval,
)
from streamloop.state.session_windows import SessionStore
from streamloop.state.sliding_windows import TimestampedWindowStore
from streamloop.state.store import Journal, KeyValueStore, Source, StateStore, WindowStore
from streamloop.state.stores import StoreBuilder, StoreSupplier, StoreType
from streamloop.state.timestamped import TimestampedKeyValueStore, ValueAndTimestampSerde
from streamloop.state.ttl import TtlKeyValueStore, TtlTimestampedKeyValueStore
from streamloop.state.uncommitted import UncommittedBudget, UncommittedWrites
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
    # The thread's share of statestore.uncommitted.max.bytes (streamloop.state.uncommitted).
    uncommitted: UncommittedBudget | None = None


def _segmented_store(supplier: StoreSupplier, directory: str, persistent: bool) -> SegmentedBytesStore | None:
    """The segmented bytes store of a window, session or join-window store (None for other kinds).

    Each kind's suffix and retention, as its store keys and expires them: a window (key + start)
    is kept while its end is within the retention of the newest start; a session (key + end +
    start) while its end is; a join record (key + time + sequence) while its time is."""
    retention = supplier.retention_ms or 0
    if supplier.type is StoreType.WINDOW and supplier.retain_duplicates:
        suffix, span = 12, retention
    elif supplier.type is StoreType.WINDOW:
        retention = retention or 1
        suffix, span = 8, retention + (supplier.window_size_ms or 1) - 1
    elif supplier.type is StoreType.SESSION:
        retention = retention or 1
        suffix, span = 16, retention
    else:
        return None
    segments: MemorySegments | RocksDBSegments
    if persistent:
        segments = RocksDBSegments(RocksDBBytesStore(supplier.name, directory))
    else:
        segments = MemorySegments(supplier.name)
    return SegmentedBytesStore(supplier.name, segments, suffix=suffix, interval_ms=segment_interval(retention),
                               span_ms=span)


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
        budget: UncommittedBudget | None = None,
        request_commit: Callable[[], None] | None = None,
    ) -> None:
        self.task_id = task_id
        self.directory = os.path.join(state_dir, application_id, task_id)
        self.partition = partition
        self._log = logger
        self.stores: dict[str, StateStore] = {}
        self.changelogs: dict[str, TopicPartition] = {}
        # What the record in progress changed, to undo if it is retried (records in flight: a
        # journal that follows the record in flight, streamloop.tasks.record_slots.RecordJournals).
        self.journal = journal or Journal()
        self._source = source
        self.restored = 0
        self._budget = budget
        self._request_commit = request_commit
        # Which input records will not be processed again (set at restore, moved by each commit):
        # what a commit writes to disk, by the rule a restore applies.
        self.processed: dict[str, ProcessedInput] = {}
        # The changelog offsets the checkpoint file names (persistent stores only), and whether the
        # stores were restored: before that a changelog's end is no offset their disk is at.
        self._checkpointed: dict[TopicPartition, int] = {}
        self._restored = False
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
        persistent = builder.is_persistent(default_persistent)
        segmented = _segmented_store(builder.supplier, os.path.join(self.directory, name), persistent)
        if segmented is not None:
            inner = segmented
        elif persistent:
            inner = RocksDBBytesStore(name, os.path.join(self.directory, name))
        else:
            inner = InMemoryBytesStore(name)
        if persistent:
            inner = UncommittedWrites(inner, self._budget, self._request_commit)
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
        # What a commit writes to disk follows from it, a store without a changelog's too.
        self.processed = processed
        if not self.changelogs:
            return 0
        offsets = checkpoint.read(self.directory) if self.persistent else {}
        self._checkpointed = dict(offsets)
        ends = await consumer.end_offsets(list(self.changelogs.values()))
        self._log.debug("Restoring from changelog end offsets %s; input processed below %s",
                        {str(tp): o for tp, o in sorted(ends.items())},
                        {topic: p.offset for topic, p in sorted(processed.items())})
        total = 0
        restored_to: dict[TopicPartition, int] = {}
        for name, tp in self.changelogs.items():
            store = self.stores[name]
            end = ends.get(tp, 0)
            start = offsets.get(tp) if store.persistent else None
            if layout_reset(store.durable):
                start = None  # opening it found the layout of before segments and wiped it
            if start is None or start > end:
                if start is not None:
                    self._log.warning("Checkpoint of store '%s' is past its changelog's end (%d > %d): "
                                      "restoring in full", name, start, end)
                if self._checkpointed.pop(tp, None) is not None:
                    # Before the store is emptied: a crash mid-restore must not find its old offset.
                    checkpoint.write(self.directory, self._checkpointed)
                store.inner.wipe()
                start = 0
            applied, restored_end = await restore_store(store, tp, start, end, reader_factory, processed, listener)
            total += applied
            if store.persistent:
                restored_to[tp] = restored_end
            if end > start:
                self._log.info("Restored store '%s' from %s offsets %d..%d: %d update(s)", name, tp, start,
                               restored_end, applied)
        if restored_to:
            # The disk now holds every update that counts up to these offsets; those left out are
            # of records processed again, whose updates the changelog gets anew past them.
            for store in self.stores.values():
                store.flush()
            self._write_checkpoint({**self._checkpointed, **restored_to})
        self.restored = total
        self._restored = True
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

    def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> int:
        """The commit protocol committed ``offsets`` (its step 4): the persistent stores write the
        updates it covers to disk, one batch each; returns how many keys went down."""
        for tp, om in offsets.items():
            done = decode_completed(om.offset, om.metadata) if om.metadata else set()
            self.processed[tp.topic] = ProcessedInput(om.offset, frozenset(done))
        written = 0
        for store in self.stores.values():
            held = store.uncommitted
            if held is not None:
                written += held.commit(self.processed)
        return written

    def discard_uncommitted(self) -> int:
        """Drop the writes no commit covered (a transaction aborted): their records run again."""
        return sum(s.uncommitted.discard() for s in self.stores.values() if s.uncommitted is not None)

    def checkpoint_commit(self, acked_ends: Mapping[TopicPartition, int]) -> dict[TopicPartition, int] | None:
        """After a commit: ``acked_ends``, the offset after each changelog's last acknowledged record
        (``Producer.acked_ends``). Each persistent store's checkpoint moves to the newest of these it
        may name (``UncommittedWrites.checkpoint_offset``);
        returns the checkpoint to write (``write_checkpoint_file``), None when it stays. Nothing while
        the stores restore: their disk is not at the changelog's end yet."""
        if not self._restored:
            return None
        moved = dict(self._checkpointed)
        for name, tp in self.changelogs.items():
            held = self.stores[name].uncommitted
            if held is None or tp not in acked_ends:
                continue
            offset = held.checkpoint_offset(held.candidate(acked_ends[tp]))
            if offset is not None:
                moved[tp] = offset
        return moved if moved != self._checkpointed else None

    async def write_checkpoint_file(self, offsets: dict[TopicPartition, int]) -> None:
        """Write a checkpoint ``checkpoint_commit`` returned, off the loop: its fsync would hold every
        task of the thread. Caller: the commit protocol, which closes no task meanwhile."""
        await anyio.to_thread.run_sync(checkpoint.write, self.directory, offsets)
        self._checkpointed = dict(offsets)

    async def write_checkpoint(self, end_offsets: Mapping[TopicPartition, int]) -> None:
        """A standby's: its persistent stores hold every update up to these changelog offsets."""
        if not self.persistent:
            return
        for store in self.stores.values():
            store.flush()
        self._write_checkpoint({tp: end_offsets[tp] for name, tp in self.changelogs.items()
                                if self.stores[name].persistent and tp in end_offsets})

    def _write_checkpoint(self, offsets: dict[TopicPartition, int]) -> None:
        checkpoint.write(self.directory, offsets)
        self._checkpointed = dict(offsets)

    @property
    def checkpoint_behind(self) -> bool:
        """Whether a store's checkpoint waits for a later commit (a busy commit's writes were held)."""
        return any(s.uncommitted.checkpoint_behind for s in self.stores.values() if s.uncommitted is not None)

    @property
    def checkpointed(self) -> dict[TopicPartition, int]:
        """The changelog offsets the checkpoint file names (a copy)."""
        return dict(self._checkpointed)

    # -- close --------------------------------------------------------------------
    def close(self, clean: bool) -> None:
        """Close every store. Writes no commit covered are dropped; the disk and its checkpoint stay
        at the last commit, clean or not (a restart restores the changelog's tail)."""
        for store in self.stores.values():
            try:
                store.close()
            except Exception:  # one store failing to close must not keep the others open
                self._log.exception("Error closing store '%s'", store.name)

    def wipe(self) -> None:
        """Delete the task's local state (after a corrupted store or under exactly-once)."""
        shutil.rmtree(self.directory, ignore_errors=True)

