"""``ThreadRegistry``: thread indices (lowest free one reused), trimming of DEAD threads, cache shares.

The threads are light fakes with what the registry reads: ``index``,
``state.state``, ``is_alive``, ``is_current`` and ``resize_cache``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from streamloop.state.uncommitted import UncommittedBudget
from streamloop.threads.registry import ThreadRegistry
from streamloop.threads.stream_thread import StreamThreadState

S = StreamThreadState


@dataclass
class FakeState:
    state: StreamThreadState


@dataclass
class FakeThread:
    index: int
    state: FakeState = field(default_factory=lambda: FakeState(S.RUNNING))
    cache_size: int | None = None
    os_thread: threading.Thread | None = None
    uncommitted: UncommittedBudget = field(default_factory=lambda: UncommittedBudget(-1))

    @property
    def is_alive(self) -> bool:
        return self.state.state.is_alive()

    @property
    def is_current(self) -> bool:
        return threading.current_thread() is self.os_thread

    def resize_cache(self, size: int) -> None:
        self.cache_size = size

    def becomes(self, state: StreamThreadState) -> FakeThread:
        self.state.state = state
        return self


def registry_with(*threads: FakeThread) -> ThreadRegistry:
    registry = ThreadRegistry()
    for thread in threads:
        registry.add(thread)  # type: ignore[arg-type]
    return registry


def start_threads(registry: ThreadRegistry, count: int) -> list[FakeThread]:
    """What the client does per new thread: take the next index, then register the thread."""
    made = []
    for _ in range(count):
        thread = FakeThread(registry.next_index())
        registry.add(thread)  # type: ignore[arg-type]
        made.append(thread)
    return made


# -- indices ----------------------------------------------------------------------------------------


def test_first_thread_gets_index_one() -> None:
    assert ThreadRegistry().next_index() == 1


def test_new_threads_get_consecutive_indices() -> None:
    registry = ThreadRegistry()

    assert [t.index for t in start_threads(registry, 3)] == [1, 2, 3]


def test_added_thread_reuses_lowest_free_index() -> None:
    registry = ThreadRegistry()
    one, _two, three = start_threads(registry, 3)
    registry.remove(one)  # type: ignore[arg-type]
    registry.remove(three)  # type: ignore[arg-type]

    assert [t.index for t in start_threads(registry, 3)] == [1, 3, 4]


def test_dead_threads_are_trimmed_and_free_their_index() -> None:
    registry = ThreadRegistry()
    one, two = start_threads(registry, 2)
    one.becomes(S.DEAD)

    assert registry.next_index() == 1
    assert registry.snapshot() == [two]


def test_a_thread_pending_shutdown_keeps_its_index_until_it_is_dead() -> None:
    registry = ThreadRegistry()
    (dying,) = start_threads(registry, 1)
    dying.becomes(S.PENDING_SHUTDOWN)

    (replacement,) = start_threads(registry, 1)
    assert replacement.index == 2

    dying.becomes(S.DEAD)
    assert registry.next_index() == 1


def test_trim_dead_keeps_every_thread_that_is_not_dead() -> None:
    threads = [FakeThread(i + 1, FakeState(state)) for i, state in enumerate(S)]
    registry = registry_with(*threads)

    registry.trim_dead()

    assert [t.state.state for t in registry.snapshot()] == [s for s in S if s is not S.DEAD]


# -- membership -------------------------------------------------------------------------------------


def test_removing_a_thread_that_is_not_registered_does_nothing() -> None:
    kept = FakeThread(1)
    registry = registry_with(kept)

    registry.remove(FakeThread(2))  # type: ignore[arg-type]

    assert registry.snapshot() == [kept]


def test_alive_leaves_out_threads_shutting_down_or_dead() -> None:
    running = FakeThread(1)
    starting = FakeThread(2, FakeState(S.STARTING))
    registry = registry_with(running, starting, FakeThread(3, FakeState(S.PENDING_SHUTDOWN)),
                             FakeThread(4, FakeState(S.DEAD)))

    assert registry.alive() == [running, starting]


def test_snapshot_is_a_copy_unaffected_by_later_changes() -> None:
    first = FakeThread(1)
    registry = registry_with(first)
    snapshot = registry.snapshot()

    registry.add(FakeThread(2))  # type: ignore[arg-type]
    registry.remove(first)  # type: ignore[arg-type]

    assert snapshot == [first]
    assert len(list(registry)) == 1


def test_current_is_the_thread_the_caller_runs_on() -> None:
    mine = FakeThread(2, os_thread=threading.current_thread())
    registry = registry_with(FakeThread(1, os_thread=threading.Thread(target=lambda: None)), mine)

    assert registry.current() is mine


def test_current_is_none_outside_every_stream_thread() -> None:
    registry = registry_with(FakeThread(1, os_thread=threading.Thread(target=lambda: None)))

    assert registry.current() is None


# -- cache shares -------------------------------------------------------------------------------------


def test_cache_is_split_evenly_over_alive_threads() -> None:
    threads = [FakeThread(1), FakeThread(2), FakeThread(3)]
    registry = registry_with(*threads)

    share = registry.resize_caches(100)

    assert share == 33
    assert [t.cache_size for t in threads] == [33, 33, 33]


def test_the_bound_of_uncommitted_writes_is_split_like_the_cache_and_unbounded_stays_unbounded() -> None:
    threads = [FakeThread(1), FakeThread(2)]
    registry = registry_with(*threads)

    registry.resize_caches(100, 64)
    assert [t.uncommitted.max_bytes for t in threads] == [32, 32]
    registry.resize_caches(100, -1)
    assert [t.uncommitted.max_bytes for t in threads] == [-1, -1]


def test_threads_shutting_down_get_no_share_of_the_cache() -> None:
    running, leaving = FakeThread(1), FakeThread(2, FakeState(S.PENDING_SHUTDOWN), cache_size=50)
    registry = registry_with(running, leaving)

    assert registry.resize_caches(100) == 100

    assert running.cache_size == 100
    assert leaving.cache_size == 50


def test_without_alive_threads_the_share_is_the_whole_cache() -> None:
    assert ThreadRegistry().resize_caches(1024) == 1024
