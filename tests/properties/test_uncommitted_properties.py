"""Uncommitted writes held until a commit, checkpoints after commits and tail restores, against a
pure-Python model (``streamloop.state.uncommitted``).

A random run of one persistent store: records of one input partition read a key and write a new
value that depends on the value read (a count-like read-modify-write), punctuations write without a
record, commits cover a prefix of the records processed (the commit's snapshot; records past it may
already have written), each commit reads the changelog's end (possibly short of what was appended:
the broker's acknowledgements lag) and moves the checkpoint, and crashes drop whatever the store
holds in memory (one may come between a commit of the offsets and its stores' writes). After each
crash the store restores only the changelog from its checkpoint, and processing starts again at the
committed offset. The model:

- after every commit, the disk holds exactly what a full restore of the changelog would give under
  that commit (a crash leaves the store at the last commit);
- after every crash, the tail restore gives what a full restore would (from an empty store);
- without punctuations, that is the state of processing the committed records once each, in order;
- a task reads its own uncommitted writes.
"""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from streamloop.state.bytes_stores import InMemoryBytesStore
from streamloop.state.restore import ProcessedInput
from streamloop.state.uncommitted import UncommittedBudget, UncommittedWrites, covered

EXAMPLES = int(os.environ.get("STREAMLOOP_UNCOMMITTED_EXAMPLES", "300"))
TOPIC = "in"
KEYS = [b"a", b"b", b"c", b"d"]

Entry = tuple[bytes, "bytes | None", "tuple[str, int] | None"]


def update(previous: bytes | None, offset: int) -> bytes | None:
    """A record's new value from the value it read: every record's effect shows in the result."""
    if offset % 11 == 10:
        return None  # a delete now and then
    return b"%d" % ((int(previous or b"0") * 7 + offset + 1) % 10_007)


def key_of(offset: int, salt: int) -> bytes:
    """The key a record writes: its own (processing is deterministic, as a restore assumes: a full
    restore applies the first attempt of a record run again, too)."""
    return KEYS[(offset * 3 + salt) % len(KEYS)]


def full_restore(changelog: list[Entry], committed: int) -> dict[bytes, bytes]:
    """A store restored from offset 0 of the changelog: the entries that count, in order."""
    state: dict[bytes, bytes] = {}
    processed = {TOPIC: ProcessedInput(committed, frozenset())}
    for key, value, source in changelog:
        if covered(source, processed):
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
    return state


def contents(store: InMemoryBytesStore | UncommittedWrites) -> dict[bytes, bytes]:
    return dict(store.range(None, None))


RECORD = st.tuples(st.just("record"), st.just(0))
operations = st.lists(
    st.one_of(
        # Records are most of a run (the other operations come between them).
        RECORD, RECORD, RECORD,
        # How many of the records processed the commit's snapshot leaves out; the end's lag.
        st.tuples(st.just("commit"), st.integers(0, 2), st.integers(0, 2)),
        # The offsets are committed, and the process dies before its stores write the commit.
        st.tuples(st.just("commit-and-crash"), st.integers(0, 2)),
        st.tuples(st.just("punctuate"), st.integers(0, 3)),
        st.tuples(st.just("crash"), st.just(0)),
    ),
    min_size=10, max_size=80,
)


@settings(max_examples=EXAMPLES, deadline=None)
@given(ops=operations, punctuations=st.booleans(), salt=st.integers(0, 3))
def test_tail_restores_equal_full_restores_and_the_disk_is_the_last_commit(
        ops: list[tuple], punctuations: bool, salt: int) -> None:
    disk = InMemoryBytesStore("s")  # what survives a crash
    budget = UncommittedBudget(-1)
    store = UncommittedWrites(disk, budget)
    changelog: list[Entry] = []
    checkpoint = 0
    broker_end = 0  # the changelog's end as the broker last reported it
    committed = 0  # the committed offset: records below it are never processed again
    next_offset = 0  # the next record to process
    # The state of processing each record once, in order, as each commit saw it.
    exact: dict[bytes, bytes] = {}
    exact_at: dict[int, dict[bytes, bytes]] = {0: {}}

    def write(key: bytes, value: bytes | None, source: tuple[str, int] | None) -> None:
        store.put(key, value, source)
        changelog.append((key, value, source))
        assert store.get(key) == value  # a task reads its own uncommitted writes

    for op in ops:
        kind = op[0]
        if kind == "record":
            offset = next_offset
            key = key_of(offset, salt)
            value = update(store.get(key), offset)
            write(key, value, (TOPIC, offset))
            if offset >= max(exact_at):
                # First time this offset runs (after a crash it runs again from the committed one).
                if value is None:
                    exact.pop(key, None)
                else:
                    exact[key] = value
                exact_at[offset + 1] = dict(exact)
            next_offset += 1
        elif kind == "punctuate" and punctuations:
            key = KEYS[op[1]]
            write(key, update(store.get(key), 1000 + len(changelog)), None)
        elif kind == "commit":
            # The snapshot covers a prefix of what was processed; later records may have written.
            committed = max(committed, next_offset - op[1])
            store.commit({TOPIC: ProcessedInput(committed, frozenset())})
            assert contents(disk) == full_restore(changelog, committed), "the disk is not the last commit"
            # The changelog's end as the broker reports it: up to ``lag`` appends not acknowledged yet.
            broker_end = max(broker_end, len(changelog) - op[2])
            moved = store.checkpoint_offset(store.candidate(broker_end))
            if moved is not None:
                assert moved >= checkpoint
                checkpoint = moved
        elif kind == "commit-and-crash" or kind == "crash":
            if kind == "commit-and-crash":
                committed = max(committed, next_offset - op[1])
            store.discard()
            store = UncommittedWrites(disk, budget)
            processed = {TOPIC: ProcessedInput(committed, frozenset())}
            for key, value, source in changelog[checkpoint:]:
                if covered(source, processed):
                    disk.put(key, value)
            checkpoint = broker_end = len(changelog)
            assert contents(disk) == full_restore(changelog, committed), "the tail restore differs from a full one"
            if not punctuations:
                assert contents(disk) == exact_at[committed], "not the committed records applied once each"
            next_offset = committed
    assert budget.held == store.bytes
