"""Uncommitted writes held apart from a persistent store until the commit covers them (as KIP-892).

``UncommittedWrites`` sits beneath the record cache and above a persistent bytes store (every
store kind: key-value, window, session, join, versioned). A write that goes down reaches it with the
input record that caused it (its *source*); it stays here, readable by the task at once, until a
commit covers that record. After each commit (``commit``) the covered writes go to the bytes store
in one durable write batch, so the store on disk only ever holds the state of a commit.

What a commit covers is what a restore would apply: the rule of ``streamloop.state.restore``
("changelog entries of uncommitted records do not count"), applied per write instead of per
changelog record. A key's newest covered write goes down; its older writes go away, covered or
not (a restore applying the changelog in order would end on that newest covered value too).

The checkpoint (the changelog offset a restore starts from) follows from the same facts. A
changelog offset ``E`` read from the broker (``candidate``) may be checkpointed once every write
appended before ``E`` was read is on disk or gone: then every changelog record below ``E`` is one
the disk holds, one a later covered write replaced, or one of a record processed again after a
crash. Until then the previous checkpoint stays; a busy task's checkpoint lags one commit.

Memory is bounded per stream thread (``statestore.uncommitted.max.bytes``, ``UncommittedBudget``):
past the bound the task asks for a commit early, as Kafka Streams does.

Caller: the stream thread's loop. Interactive queries may read from other threads: the dicts
read are replaced, never mutated after a commit, and the disk is written before they are.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, NamedTuple

from streamloop.state.bytes_stores import BytesStore, overlay

if TYPE_CHECKING:
    from streamloop.state.restore import ProcessedInput

_ABSENT = object()
_thread_id = threading.get_ident
# Bookkeeping per held write beyond its key and value bytes (the log tuple, the dict slots).
WRITE_OVERHEAD = 96
Source = tuple[str, int] | None
# Changelog offsets kept waiting to become safe to checkpoint (one per commit).
_CANDIDATES = 8
# Up to this many keys new since the last range are inserted one by one; more are sorted in.
_INSERT_MAX = 64


class UncommittedBudget:
    """The bytes of uncommitted writes a stream thread's tasks may hold (``statestore.uncommitted.max.bytes``,
    the thread's share); ``max_bytes`` < 0: unbounded. Past it, the writing task asks for a commit."""

    __slots__ = ("max_bytes", "held")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.held = 0

    def resize(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes

    @property
    def exceeded(self) -> bool:
        return 0 <= self.max_bytes < self.held


class Candidate(NamedTuple):
    """A changelog end offset read from the broker, and the last write appended before it was read."""

    offset: int
    seq: int


def covered(source: Source, processed: Mapping[str, ProcessedInput]) -> bool:
    """Whether the write (or changelog record) of ``source`` counts: the one rule of restore and commit.

    A write without a source (a punctuation's, an expiry's) counts; so does one from a topic the task
    has no commit for (nothing will process its record again)."""
    if source is None:
        return True
    done = processed.get(source[0])
    return done is None or done.covers(source[1])


class UncommittedWrites:
    """A persistent bytes store with the writes no commit covers yet held in memory in front of it."""

    persistent = True

    def __init__(self, base: BytesStore, budget: UncommittedBudget | None = None,
                 on_full: Callable[[], None] | None = None) -> None:
        self.base = base
        self.name = base.name
        self._budget = budget
        self._on_full = on_full
        # The newest value of each held key (None: deleted), and its keys in order for ranges
        # (``_keys``, always sorted) with the keys new since the last range apart (``_new``): they go
        # into order when a range needs them (``_sorted_keys``), not at each new key, which made a
        # commit interval of new keys quadratic when no range came.
        self._latest: dict[bytes, bytes | None] = {}
        self._keys: list[bytes] = []
        self._new: list[bytes] = []
        # Every held write in order: (seq, key, value, source).
        self._log: list[tuple[int, bytes, bytes | None, Source]] = []
        self.seq = 0
        self.bytes = 0
        self._writer: int | None = None
        # Changelog offsets read at commits, not yet safe to checkpoint (see ``checkpoint_offset``).
        self._candidates: list[Candidate] = []
        self.committed_writes = 0

    # -- the bytes store interface ----------------------------------------------------
    def get(self, key: bytes) -> bytes | None:
        value = self._latest.get(key, _ABSENT)
        if value is not _ABSENT:
            return value  # type: ignore[return-value]  # bytes, or None for a delete
        return self.base.get(key)

    def put(self, key: bytes, value: bytes | None, source: Source = None) -> None:
        self._writer = _thread_id()
        seq = self.seq = self.seq + 1
        self._log.append((seq, key, value, source))
        latest = self._latest
        if key not in latest:
            self._new.append(key)
        latest[key] = value
        size = len(key) + (len(value) if value is not None else 0) + WRITE_OVERHEAD
        self.bytes += size
        budget = self._budget
        if budget is not None:
            held = budget.held = budget.held + size
            if 0 <= budget.max_bytes < held and self._on_full is not None:  # ``budget.exceeded``, inline
                self._on_full()

    def range(self, low: bytes | None, high: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        latest = self._latest
        if threading.get_ident() == self._writer:
            keys = self._sorted_keys()
            start = 0 if low is None else bisect.bisect_left(keys, low)
            stop = len(keys) if high is None else bisect.bisect_right(keys, high)
            held = [(k, latest[k]) for k in keys[start:stop]]
        else:
            # One C-level copy (atomic under the GIL): the stream thread may write meanwhile.
            held = sorted((k, v) for k, v in list(latest.items())
                          if (low is None or k >= low) and (high is None or k <= high))
        return overlay(held, self.base.range(low, high))

    def _sorted_keys(self) -> list[bytes]:
        new = self._new
        if new:
            keys = self._keys
            if len(new) <= _INSERT_MAX:
                # A range after every few writes (a join's fetch, a session lookup): a binary search
                # and one C-level move per new key. Sorting instead compares every held key each time:
                # quadratic over a commit interval, most of such a workload's time.
                for key in new:
                    bisect.insort(keys, key)
            else:
                # Timsort: the sorted run so far and the keys appended since merge in linear time.
                keys.extend(new)
                keys.sort()
            self._new = []
        return self._keys

    def approximate_num_entries(self) -> int:
        return self.base.approximate_num_entries() + len(self._latest)

    def open(self) -> None:
        self.base.open()

    def flush(self) -> None:
        """Make what is on disk durable; held writes stay held (only a commit writes them)."""
        self.base.flush()

    def close(self) -> None:
        """Close the store; writes no commit covered are dropped (the records run again)."""
        self.discard()
        self.base.close()

    def wipe(self) -> None:
        self.discard()
        self._candidates = []
        self.base.wipe()

    def write_batch(self, entries: list[tuple[bytes, bytes | None]]) -> None:
        self.base.write_batch(entries)

    # -- commit ----------------------------------------------------------------------
    @property
    def held(self) -> int:
        """How many writes are held (none covered by a commit yet)."""
        return len(self._log)

    def commit(self, processed: Mapping[str, ProcessedInput]) -> int:
        """A commit covers ``processed``: write the covered writes to disk in one batch; returns how many keys."""
        log = self._log
        if not log:
            return 0
        batch: dict[bytes, bytes | None] = {}
        last_covered: dict[bytes, int] = {}
        uncovered = []
        for write in log:
            seq, key, value, source = write
            if covered(source, processed):
                batch[key] = value
                last_covered[key] = seq
            else:
                uncovered.append(write)
        if not batch:
            return 0
        # What stays: writes not covered, newer than their key's newest covered one.
        kept = [w for w in uncovered if w[0] > last_covered.get(w[1], 0)]
        # Disk first: a reader on another thread finds each key held or on disk, never neither.
        self.base.write_batch(list(batch.items()))
        kept_keys = {w[1] for w in kept}
        latest = self._latest
        self._latest = {k: latest[k] for k in latest if k in kept_keys}
        self._keys = [k for k in self._keys if k in kept_keys]  # in the order they had
        self._new = [k for k in self._new if k in kept_keys]
        self._log = kept
        self._release(sum(len(w[1]) + (len(w[2]) if w[2] is not None else 0) + WRITE_OVERHEAD for w in kept))
        self.committed_writes += len(batch)
        return len(batch)

    def discard(self) -> int:
        """Drop every held write (a dirty close, a transaction aborted); returns how many."""
        dropped = len(self._log)
        self._latest = {}
        self._keys = []
        self._new = []
        self._log = []
        self._release(0)
        return dropped

    def _release(self, remaining: int) -> None:
        if self._budget is not None:
            self._budget.held -= self.bytes - remaining
        self.bytes = remaining

    # -- checkpoint --------------------------------------------------------------------
    @property
    def checkpoint_behind(self) -> bool:
        """Whether a changelog offset read at a commit still waits to be checkpointed."""
        return bool(self._candidates)

    def candidate(self, offset: int) -> Candidate:
        """``offset``: the offset after the changelog's last acknowledged record; every write up to
        now had its record appended before it, or acknowledged after it (a checkpoint there
        restores that record again: never one less)."""
        return Candidate(offset, self.seq)

    def checkpoint_offset(self, fresh: Candidate) -> int | None:
        """The newest changelog offset safe to checkpoint now (``fresh`` or an earlier candidate), None
        when none is yet: safe once no write appended before it was read is still held."""
        candidates = self._candidates
        candidates.append(fresh)
        oldest_held = self._log[0][0] if self._log else self.seq + 1
        safe = [c for c in candidates if c.seq < oldest_held]
        if not safe:
            if len(candidates) > _CANDIDATES:
                # Bounded: the oldest (it becomes safe first) and the newest.
                self._candidates = [candidates[0], *candidates[-_CANDIDATES + 1:]]
            return None
        # Of candidates read with no write between them (equal seq), the later end is as safe.
        best = max(safe, key=lambda c: (c.seq, c.offset))
        self._candidates = [c for c in candidates if c.seq > best.seq][-_CANDIDATES:]
        return best.offset
