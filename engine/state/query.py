"""Interactive queries: read-only views over one store's instances in all of this client's tasks.

``KafkaStreams.store(name)`` returns one of these. Each call looks up the tasks
that run now, so a view stays valid across rebalances; a key lives in exactly
one task. Safe to call from any thread or event loop: reads never change a store
(see ``streamloop.state.store``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from typing import Any

from streamloop.state.store import KeyValueStore, StateStore, WindowStore
from streamloop.state.windows import Windowed

StoresOf = Callable[[], list[StateStore]]


class ReadOnlyKeyValueStore:
    def __init__(self, name: str, stores: StoresOf) -> None:
        self.name = name
        self._stores = stores

    def _instances(self) -> list[KeyValueStore]:
        # A store closing (its task moving away) is left out rather than read half-closed.
        return [s for s in self._stores() if isinstance(s, KeyValueStore) and s.open]

    def get(self, key: Any) -> Any:
        """The key's value (None if no local task has it)."""
        for store in self._instances():
            value = store.get(key)
            if value is not None:
                return value
        return None

    def range(self, low: Any, high: Any) -> Iterator[tuple[Any, Any]]:
        """Entries from ``low`` to ``high`` (inclusive, None is open) of all local tasks, in key-bytes order."""
        instances = self._instances()
        if not instances:
            return iter(())
        first = instances[0]
        lo = None if low is None else first._key(low)
        hi = None if high is None else first._key(high)
        merged = heapq.merge(*(s._range(lo, hi) for s in instances))
        decode_key, decode_value = first.key_serde.deserialize, first.value_serde.deserialize
        return ((decode_key(k), decode_value(v)) for k, v in merged)

    def all(self) -> Iterator[tuple[Any, Any]]:
        return self.range(None, None)

    def approximate_num_entries(self) -> int:
        return sum(s.approximate_num_entries() for s in self._instances())


class ReadOnlyWindowStore:
    def __init__(self, name: str, stores: StoresOf) -> None:
        self.name = name
        self._stores = stores

    def _instances(self) -> list[WindowStore]:
        return [s for s in self._stores() if isinstance(s, WindowStore) and s.open]

    def fetch(self, key: Any, window_start: int) -> Any:
        for store in self._instances():
            value = store.fetch(key, window_start)
            if value is not None:
                return value
        return None

    def fetch_range(self, key: Any, time_from: int, time_to: int) -> list[tuple[int, Any]]:
        """``(window_start, value)`` of the key's windows starting within ``[time_from, time_to]``."""
        result: list[tuple[int, Any]] = []
        for store in self._instances():
            result.extend(store.fetch_range(key, time_from, time_to))
        return sorted(result, key=lambda item: item[0])

    def fetch_all(self, time_from: int, time_to: int) -> list[tuple[Windowed, Any]]:
        result: list[tuple[Windowed, Any]] = []
        for store in self._instances():
            result.extend(store.fetch_all(time_from, time_to))
        return result

    def all(self) -> list[tuple[Windowed, Any]]:
        return self.fetch_all(0, 2**63 - 1)
