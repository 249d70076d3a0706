"""State stores: what tables are made of, with changelogs, the record cache and queries."""

from engine.state.join_windows import JoinWindows
from engine.state.query import ReadOnlyKeyValueStore, ReadOnlyWindowStore
from engine.state.restore import StateRestoreListener
from engine.state.session_windows import ReadOnlySessionStore, SessionStore, SessionWindows
from engine.state.sliding_windows import SlidingWindows
from engine.state.store import KeyValueStore, StateStore, WindowStore
from engine.state.stores import Materialized, StoreBuilder, Stores, StoreSupplier, StoreType
from engine.state.timestamped import TimestampedKeyValueStore, ValueAndTimestamp
from engine.state.versioned import VersionedKeyValueStore, VersionedRecord
from engine.state.windows import TimeWindows, Windowed

__all__ = [
    "JoinWindows",
    "KeyValueStore",
    "Materialized",
    "ReadOnlyKeyValueStore",
    "ReadOnlySessionStore",
    "ReadOnlyWindowStore",
    "SessionStore",
    "SessionWindows",
    "SlidingWindows",
    "StateRestoreListener",
    "StateStore",
    "StoreBuilder",
    "StoreSupplier",
    "StoreType",
    "Stores",
    "TimeWindows",
    "TimestampedKeyValueStore",
    "ValueAndTimestamp",
    "VersionedKeyValueStore",
    "VersionedRecord",
    "WindowStore",
    "Windowed",
]
