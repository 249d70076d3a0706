"""State stores: what tables are made of, with changelogs, the record cache and queries."""

from streamloop.state.join_windows import JoinWindows
from streamloop.state.query import ReadOnlyKeyValueStore, ReadOnlyWindowStore
from streamloop.state.restore import StateRestoreListener
from streamloop.state.session_windows import ReadOnlySessionStore, SessionStore, SessionWindows
from streamloop.state.sliding_windows import SlidingWindows
from streamloop.state.store import KeyValueStore, StateStore, WindowStore
from streamloop.state.stores import Materialized, StoreBuilder, Stores, StoreSupplier, StoreType
from streamloop.state.timestamped import TimestampedKeyValueStore, ValueAndTimestamp
from streamloop.state.versioned import VersionedKeyValueStore, VersionedRecord
from streamloop.state.windows import TimeWindows, Windowed

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
