"""How a user describes a state store: ``Stores`` makes suppliers and builders, ``Materialized``
names and tunes the store of a DSL aggregation.

Kafka Streams spells these ``Stores.persistentKeyValueStore("counts")`` and
``Stores.keyValueStoreBuilder(supplier, keySerde, valueSerde)``; here they are
snake_case with the same meaning. A builder is a description: every task that
runs a processor connected to it gets its own store instance.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import timedelta
from enum import Enum

from streamloop.errors import TopologyError
from streamloop.serdes import Serde, as_serde
from streamloop.state.ttl import DEFAULT_SWEEP_ENTRIES, ExpiryClock, TimeToLive

_LEGAL_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


class StoreType(Enum):
    KEY_VALUE = "key-value"
    WINDOW = "window"
    SESSION = "session"


@dataclass(frozen=True)
class StoreSupplier:
    """What kind of bytes store to open: ``persistent`` (RocksDB) or in memory (None: the config's
    ``default.dsl.store``)."""

    name: str
    persistent: bool | None
    type: StoreType = StoreType.KEY_VALUE
    retention_ms: int | None = None
    window_size_ms: int | None = None
    # A window store whose values carry the largest record timestamp of their window (sliding windows);
    # a key-value store whose values carry a timestamp (streamloop.state.timestamped).
    timestamped: bool = False
    # Window stores only: keep every record of a key and timestamp (a stream-stream join's sides).
    retain_duplicates: bool = False
    # Key-value stores only: keep each key's versions for ``retention_ms`` (streamloop.state.versioned).
    versioned: bool = False


@dataclass(frozen=True)
class StoreBuilder:
    """A store with its serdes and layers; ``None`` serdes take the defaults from the config.

    Caching is off by default (as for Kafka Streams' builders) and on for the DSL's
    stores; logging (a changelog topic ``<application.id>-<name>-changelog``) is on.
    """

    supplier: StoreSupplier
    key_serde: Serde | None = None
    value_serde: Serde | None = None
    caching: bool = False
    logging: bool = True
    # Entries expire (streamloop.state.ttl); key-value stores only, not versioned ones.
    ttl: TimeToLive | None = None

    def __post_init__(self) -> None:
        if self.ttl is not None and (self.supplier.type is not StoreType.KEY_VALUE or self.supplier.versioned):
            kind = "versioned" if self.supplier.versioned else self.supplier.type.value
            raise TopologyError(f"Store '{self.supplier.name}' is a {kind} store: a time to live (with_ttl) is "
                                "for key-value stores (a window store's retention expires its windows)")

    @property
    def name(self) -> str:
        return self.supplier.name

    def is_persistent(self, default_persistent: bool) -> bool:
        """RocksDB or in memory: the supplier's choice, else ``default.dsl.store``'s."""
        return default_persistent if self.supplier.persistent is None else self.supplier.persistent

    @property
    def type(self) -> StoreType:
        return self.supplier.type

    def with_caching_enabled(self) -> StoreBuilder:
        return replace(self, caching=True)

    def with_caching_disabled(self) -> StoreBuilder:
        return replace(self, caching=False)

    def with_logging_enabled(self) -> StoreBuilder:
        return replace(self, logging=True)

    def with_logging_disabled(self) -> StoreBuilder:
        return replace(self, logging=False)

    def with_ttl(self, ttl: timedelta | int, *, by: ExpiryClock | str = "record_time",
                 sweep_interval: timedelta | int | None = None,
                 sweep_entries: int | None = None) -> StoreBuilder:
        """Entries expire ``ttl`` (a timedelta or ms) after they were written, by ``"record_time"``
        (stream time) or ``"wall_clock"``; ``streamloop.state.ttl`` has the details."""
        return replace(self, ttl=_ttl(self.name, ttl, by, sweep_interval, sweep_entries))


def check_store_name(name: object) -> str:
    if not isinstance(name, str) or not _LEGAL_NAME.match(name):
        raise TopologyError(f"Store name {name!r} is not legal: use letters, digits, '.', '_' and '-' "
                            "(it becomes part of a topic name)")
    return name


def _positive(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise TopologyError(f"{what} must be an int > 0, got {value!r}")
    return value


class Stores:
    """Factory of store suppliers and builders (Kafka Streams' ``Stores``)."""

    @staticmethod
    def persistent_key_value_store(name: str) -> StoreSupplier:
        return StoreSupplier(check_store_name(name), persistent=True)

    @staticmethod
    def in_memory_key_value_store(name: str) -> StoreSupplier:
        return StoreSupplier(check_store_name(name), persistent=False)

    @staticmethod
    def persistent_timestamped_key_value_store(name: str) -> StoreSupplier:
        """A RocksDB key-value store whose values keep a timestamp (``streamloop.state.timestamped``)."""
        return StoreSupplier(check_store_name(name), persistent=True, timestamped=True)

    @staticmethod
    def persistent_versioned_key_value_store(name: str, history_retention_ms: int) -> StoreSupplier:
        """A RocksDB store of each key's values over time, kept ``history_retention_ms`` (KIP-889)."""
        return _versioned_supplier(name, True, history_retention_ms)

    @staticmethod
    def in_memory_versioned_key_value_store(name: str, history_retention_ms: int) -> StoreSupplier:
        """As ``persistent_versioned_key_value_store``, in memory (restored from its changelog)."""
        return _versioned_supplier(name, False, history_retention_ms)

    @staticmethod
    def persistent_window_store(name: str, retention_ms: int, window_size_ms: int) -> StoreSupplier:
        return _window_supplier(name, True, retention_ms, window_size_ms)

    @staticmethod
    def in_memory_window_store(name: str, retention_ms: int, window_size_ms: int) -> StoreSupplier:
        return _window_supplier(name, False, retention_ms, window_size_ms)

    @staticmethod
    def key_value_store_builder(supplier: StoreSupplier, key_serde: Serde | type | None = None,
                                value_serde: Serde | type | None = None) -> StoreBuilder:
        if supplier.type is not StoreType.KEY_VALUE:
            raise TopologyError(f"Store '{supplier.name}' is a {supplier.type.value} store, not a key-value store")
        return _builder(supplier, key_serde, value_serde)

    @staticmethod
    def timestamped_key_value_store_builder(supplier: StoreSupplier, key_serde: Serde | type | None = None,
                                            value_serde: Serde | type | None = None) -> StoreBuilder:
        """A ``TimestampedKeyValueStore`` over any key-value supplier: values read back as
        ``ValueAndTimestamp``; ``value_serde`` is the values' own serde."""
        if supplier.type is not StoreType.KEY_VALUE:
            raise TopologyError(f"Store '{supplier.name}' is a {supplier.type.value} store, not a key-value store")
        return _builder(replace(supplier, timestamped=True), key_serde, value_serde)

    @staticmethod
    def versioned_key_value_store_builder(supplier: StoreSupplier, key_serde: Serde | type | None = None,
                                          value_serde: Serde | type | None = None) -> StoreBuilder:
        """A ``VersionedKeyValueStore`` (``streamloop.state.versioned``); never cached, as in Kafka Streams."""
        if not supplier.versioned:
            raise TopologyError(f"Store '{supplier.name}' is not a versioned store: make its supplier with "
                                "Stores.persistent_versioned_key_value_store or in_memory_versioned_key_value_store")
        return _builder(supplier, key_serde, value_serde)

    @staticmethod
    def window_store_builder(supplier: StoreSupplier, key_serde: Serde | type | None = None,
                             value_serde: Serde | type | None = None) -> StoreBuilder:
        if supplier.type is not StoreType.WINDOW:
            raise TopologyError(f"Store '{supplier.name}' is a {supplier.type.value} store, not a window store")
        return _builder(supplier, key_serde, value_serde)


def _versioned_supplier(name: str, persistent: bool, history_retention_ms: int) -> StoreSupplier:
    if isinstance(history_retention_ms, bool) or not isinstance(history_retention_ms, int) or history_retention_ms < 0:
        raise TopologyError(f"history_retention_ms of versioned store '{name}' must be an int >= 0, "
                            f"got {history_retention_ms!r}")
    return StoreSupplier(check_store_name(name), persistent, retention_ms=history_retention_ms, versioned=True)


def _window_supplier(name: str, persistent: bool, retention_ms: int, window_size_ms: int) -> StoreSupplier:
    _positive(retention_ms, f"retention_ms of window store '{name}'")
    _positive(window_size_ms, f"window_size_ms of window store '{name}'")
    if retention_ms < window_size_ms:
        raise TopologyError(f"retention_ms of window store '{name}' ({retention_ms}) must not be smaller "
                            f"than its window size ({window_size_ms})")
    return StoreSupplier(check_store_name(name), persistent, StoreType.WINDOW, retention_ms, window_size_ms)


def _builder(supplier: StoreSupplier, key_serde: Serde | type | None,
             value_serde: Serde | type | None) -> StoreBuilder:
    ks = None if key_serde is None else as_serde(key_serde, f"key serde of store '{supplier.name}'")
    vs = None if value_serde is None else as_serde(value_serde, f"value serde of store '{supplier.name}'")
    return StoreBuilder(supplier, ks, vs)


@dataclass(frozen=True)
class Materialized:
    """The store behind a DSL table: its name (queryable with ``KafkaStreams.store``), kind and serdes.

    ``persistent=None`` follows the config key ``default.dsl.store``.
    """

    name: str | None = None
    persistent: bool | None = None
    key_serde: Serde | type | None = None
    value_serde: Serde | type | None = None
    caching: bool = True
    logging: bool = True
    ttl: TimeToLive | None = None

    @classmethod
    def as_(cls, name: str) -> Materialized:
        return cls(name=check_store_name(name))

    def with_ttl(self, ttl: timedelta | int, *, by: ExpiryClock | str = "record_time",
                 sweep_interval: timedelta | int | None = None,
                 sweep_entries: int | None = None) -> Materialized:
        """The table's rows expire ``ttl`` after their last update (``StoreBuilder.with_ttl``); an
        expired row is deleted and the delete forwarded downstream, as any other."""
        return replace(self, ttl=_ttl(self.name or "(unnamed)", ttl, by, sweep_interval, sweep_entries))


def _ttl(store: str, ttl: timedelta | int, by: ExpiryClock | str, sweep_interval: timedelta | int | None,
         sweep_entries: int | None) -> TimeToLive:
    return TimeToLive.of(store, ttl, by, sweep_interval,
                         DEFAULT_SWEEP_ENTRIES if sweep_entries is None else sweep_entries)
