"""The store behind a ``GlobalKTable``: one instance per client holding every partition of its topic.

Kafka Streams keeps a global store outside the tasks: the global thread writes it
from the source topic (which is its log, so it has no changelog) and every stream
thread's processors read it. Here the same: ``GlobalStoreSpec`` describes one (made
by ``StreamsBuilder.global_table``, kept on the ``Topology``), ``open_global_stores``
opens the client's instances, and ``GlobalKeyValueStore.apply`` writes a record's bytes
as they are in the topic, as Kafka Streams' global restore does.

A persistent store keeps a checkpoint beside it (``<directory>/.checkpoint``: the topic offsets
it holds), written at a clean stop and removed at start, so a restart reads only the topic's
tail and a crash, which leaves none, reads it all again (as for a task's stores).

One writer (the global thread, or the test driver) and many readers on other threads:
a read is one ``get`` on the bytes store (a dict lookup in memory, which the GIL makes
atomic; RocksDB reads concurrently itself).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from streamloop.records import TopicPartition
from streamloop.serdes import Serde
from streamloop.state import checkpoint
from streamloop.state.bytes_stores import BytesStore, InMemoryBytesStore, RocksDBBytesStore
from streamloop.state.store import KeyValueStore
from streamloop.state.stores import StoreBuilder


@dataclass(frozen=True)
class GlobalStoreSpec:
    """A global table's store and where it comes from: ``topic``, read by the source ``source``
    through the processor ``processor`` (Kafka Streams' names, for ``describe``)."""

    builder: StoreBuilder
    topic: str
    source: str
    processor: str

    @property
    def name(self) -> str:
        return self.builder.name


class GlobalKeyValueStore(KeyValueStore):
    """A key-value store read from many threads at once and written only through ``apply``."""

    def _key(self, key: object) -> bytes:
        # KeyValueStore remembers the last key it serialised in two attributes; with readers on
        # several stream threads one could see another's key beside the wrong bytes.
        if key is None:
            raise ValueError(f"State store '{self.name}': keys must not be None")
        data = self.key_serde.serialize(key)
        if data is None:
            raise ValueError(f"State store '{self.name}': key {key!r} serializes to None")
        return data

    def apply(self, key: bytes | None, value: bytes | None) -> bool:
        """A record of the topic: ``value`` becomes the key's (None deletes it). A record without a
        key cannot be stored and is skipped (returns False), as Kafka Streams skips it."""
        if key is None:
            return False
        self.inner.put(key, value)
        self.writes += 1
        return True

    def put(self, key: object, value: object) -> None:
        # Only the topic changes a global table; a processor writing it would diverge from it.
        raise TypeError(f"Global store '{self.name}' is read-only: write to its topic instead")


def _never(_value: object = None) -> int:
    return -1


def _no_source() -> None:
    return None


def open_global_stores(specs: Iterable[GlobalStoreSpec], directory: str, default_persistent: bool,
                       default_key_serde: Serde, default_value_serde: Serde,
                       ) -> tuple[dict[str, GlobalKeyValueStore], dict[TopicPartition, int]]:
    """Open every global store (a persistent one under ``directory/<store>``) and return them with
    the offsets to read their topics from: a persistent store the checkpoint covers goes on where
    it stopped; every other store starts empty, read from the beginning (missing offsets: 0)."""
    offsets = checkpoint.read(directory)
    # Gone while running: a crash must not leave offsets the stores may have moved past or lost.
    checkpoint.remove(directory)
    stores: dict[str, GlobalKeyValueStore] = {}
    start: dict[TopicPartition, int] = {}
    try:
        for spec in specs:
            builder = spec.builder
            inner: BytesStore
            if builder.is_persistent(default_persistent):
                inner = RocksDBBytesStore(spec.name, os.path.join(directory, spec.name))
            else:
                inner = InMemoryBytesStore(spec.name)
            inner.open()
            kept = {tp: o for tp, o in offsets.items() if tp.topic == spec.topic} if inner.persistent else {}
            if kept:
                start.update(kept)
            else:
                inner.wipe()
            stores[spec.name] = GlobalKeyValueStore(
                spec.name, inner, builder.key_serde or default_key_serde, builder.value_serde or default_value_serde,
                None, None, f"global/{spec.name}", _never, _no_source)
    except BaseException:
        close_global_stores(stores.values())
        raise
    return stores, start


def checkpoint_global_stores(stores_by_topic: Mapping[str, GlobalKeyValueStore], directory: str,
                             positions: Mapping[TopicPartition, int]) -> None:
    """After a clean stop: flush the stores and record how far into its topic each persistent one is."""
    for store in stores_by_topic.values():
        store.flush()
    offsets = {tp: o for tp, o in positions.items() if stores_by_topic[tp.topic].persistent}
    if offsets:
        checkpoint.write(directory, offsets)


def close_global_stores(stores: Iterable[GlobalKeyValueStore]) -> None:
    for store in stores:
        store.close()
