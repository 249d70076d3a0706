"""Restoring a task's stores from their changelogs before the task processes a record.

For each logged store: read its changelog partition from the checkpointed offset
(persistent stores with a valid checkpoint: after a crash too, the tail since about
the last commit) or from the start (after wiping the store) up to the end offset seen
when restoring began, and apply each update to the bytes store on disk directly (no
cache, no changelog, no forwarding, nothing held uncommitted). Updates caused
by input records at or past the task's committed offsets are left out: those
records are processed again next (see ``streamloop.state.changelog``). Records the changelog
no longer has (below its log start: a windowed store's changelog deletes by time) are not
read; the reader starts at the log start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import NamedTuple, Protocol

from streamloop.records import TopicPartition
from streamloop.state.changelog import decode_source
from streamloop.state.store import StateStore
from streamloop.state.uncommitted import covered
from streamloop.transport.base import Consumer

log = logging.getLogger(__name__)

class ProcessedInput(NamedTuple):
    """Which records of an input partition will not be processed again: those below ``offset``
    and, with records in flight, the ``done`` ones above it (from the commit metadata)."""

    offset: int
    done: frozenset[int]

    def covers(self, offset: int) -> bool:
        return offset < self.offset or offset in self.done


class Restored(NamedTuple):
    """What ``restore_store`` did: the updates applied, and the changelog offset it read up to."""

    applied: int
    end: int


class StateRestoreListener(Protocol):
    """Told about each store restore (Kafka Streams' ``StateRestoreListener``); runs on the stream thread."""

    def on_restore_start(self, partition: TopicPartition, store: str, start_offset: int, end_offset: int) -> None: ...

    def on_batch_restored(self, partition: TopicPartition, store: str, batch_end_offset: int,
                          restored: int) -> None: ...

    def on_restore_end(self, partition: TopicPartition, store: str, total_restored: int) -> None: ...

async def restore_store(
    store: StateStore,
    partition: TopicPartition,
    start: int,
    end: int,
    reader_factory: Callable[[], Consumer],
    committed: Mapping[str, ProcessedInput],
    listener: StateRestoreListener | None,
    poll_ms: int = 100,
) -> Restored:
    """Apply ``partition``'s records from ``start`` to ``end`` to the store's disk (beneath what it
    holds uncommitted: ``StateStore.durable``); the rule of what counts is ``uncommitted.covered``."""
    if listener is not None:
        listener.on_restore_start(partition, store.name, start, end)
    applied = left_out = 0
    # The first offset the reader got to: past ``start`` when the records below it are gone.
    first: int | None = None
    if start < end:
        reader = reader_factory()
        await reader.start()
        try:
            reader.assign([partition])
            reader.seek(partition, start)
            put = store.durable.put
            position = start
            while position < end:
                batch = await reader.poll(poll_ms)
                count = 0
                for record in batch.get(partition, ()):
                    if record.offset >= end:
                        break
                    if first is None:
                        first = record.offset
                    if covered(decode_source(record.headers), committed):
                        put(record.key, record.value)  # type: ignore[arg-type]  # a changelog record has a key
                        count += 1
                    else:
                        left_out += 1
                    position = record.offset + 1
                if not batch:
                    # A compacted topic may have no record at end - 1; the reader's position tells. So
                    # does a fetch below the log start (retention deleted the records): it resets there.
                    position = max(position, await reader.position(partition))
                    if first is None and position > start:
                        first = position
                applied += count
                if listener is not None and count:
                    listener.on_batch_restored(partition, store.name, position, count)
                if position >= end:
                    # Some Kafka-protocol brokers answer ListOffsets "latest" short of the end
                    # (the first offset of the last batch + 1); the fetch responses' end is right.
                    # Nothing else writes to this changelog partition while we own the task.
                    reported = reader.fetched_end(partition)
                    if reported is not None and reported > end:
                        log.info("Changelog %s goes on to offset %d past the %d ListOffsets reported; "
                                 "restoring up to it", partition, reported, end)
                        end = reported
                        reader.seek(partition, position)  # the records past the old end were dropped
        finally:
            await reader.close(leave_group=False)
    if first is not None and first > start:
        # Routine for a windowed store (its changelog deletes old windows by time), and a sign of
        # records stamped far in the past when a restore finds nothing at all.
        log.debug("Changelog %s has nothing from offset %d to %d (deleted by its retention, or compacted away): "
                  "restored %d update(s) from offset %d to %d", partition, start, first, applied, first, end)
    if left_out:
        log.debug("Left out %d update(s) of %s: their input records are past the commit and run again",
                  left_out, partition)
    if listener is not None:
        listener.on_restore_end(partition, store.name, applied)
    return Restored(applied, max(end, start))
