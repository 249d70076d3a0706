"""The test driver's global tables: their stores, written as records are piped to their topics.

A ``KafkaStreams`` client fills a global table on its global thread; the driver has no
threads, so ``pipe_input`` to a global table's topic writes the store at once (as Kafka's
``TopologyTestDriver`` runs its global state task), and every task reads the same stores.
Records are read as a running client's global thread reads them (streamloop.state.global_updates):
one the serdes cannot read goes to the deserialization exception handler, and unless it
answers ``CONTINUE`` the call raises ``DeserializationError``.
"""

from __future__ import annotations

from streamloop import config as cfg
from streamloop.config import StreamsConfig, load_handler
from streamloop.records import FetchedRecord
from streamloop.state.global_store import GlobalKeyValueStore, close_global_stores, open_global_stores
from streamloop.state.global_updates import GlobalUpdates
from streamloop.tasks import wiring
from streamloop.topology.topology import Topology


class DriverGlobalTables:
    def __init__(self, topology: Topology, config: StreamsConfig, state_dir: str) -> None:
        specs = list(topology.global_stores.values())
        # The driver's state directory is new: no checkpoint, every store starts empty.
        self.stores: dict[str, GlobalKeyValueStore]
        self.stores, _start = open_global_stores(
            specs, f"{state_dir}/global", config[cfg.DEFAULT_DSL_STORE] == "rocksDB",
            wiring.default_serde(config, cfg.DEFAULT_KEY_SERDE), wiring.default_serde(config, cfg.DEFAULT_VALUE_SERDE))
        self._by_topic = {spec.topic: self.stores[spec.name] for spec in specs}
        self.updates = GlobalUpdates(load_handler(config, cfg.DEFAULT_DESERIALIZATION_EXCEPTION_HANDLER))

    def reads(self, topic: str) -> bool:
        return topic in self._by_topic

    def apply(self, record: FetchedRecord) -> None:
        self.updates.apply(self._by_topic[record.topic], record, read=True)

    def close(self) -> None:
        close_global_stores(self.stores.values())
