"""Versioned key-value stores (KIP-889): each key's values over time, readable as of a timestamp.

``Stores.persistent_versioned_key_value_store(name, history_retention_ms)`` (or
``in_memory_versioned_key_value_store``) with ``Stores.versioned_key_value_store_builder``.
The semantics are Kafka Streams' ``VersionedKeyValueStore``:

- ``put(key, value, timestamp)`` adds a version (a None value: a tombstone). It returns
  ``PUT_RETURN_CODE_VALID_TO_UNDEFINED`` when the version is the key's latest, the timestamp of
  the next newer version (when the new one stops being valid) when it is not, or
  ``PUT_RETURN_CODE_NOT_PUT`` when it is older than the history kept (the store's observed
  stream time, the largest timestamp put so far, minus ``history_retention_ms``).
- ``get(key)`` is the latest version; ``get(key, as_of_timestamp)`` the version valid then (the
  newest at or before it), None when that is a tombstone or older than the history kept.
- ``delete(key, timestamp)`` puts a tombstone and returns the version it ends.

Storage: one entry per key holding its versions (newest first), in the bytes store and in the
changelog alike, so that a restore brings the whole history back; versions that no query can
reach any more (valid only before the history kept) are dropped when the key is written. Not
cached (as in Kafka Streams), and not queryable through ``KafkaStreams.store`` (Kafka Streams
offers it only through interactive queries v2).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from streamloop.state.store import StateStore

PUT_RETURN_CODE_VALID_TO_UNDEFINED = -1
PUT_RETURN_CODE_NOT_PUT = -(2**63)

_VERSION = struct.Struct(">qi")  # timestamp, value length (-1: a tombstone)

Version = tuple[int, bytes | None]  # (timestamp, value bytes or None)


@dataclass(frozen=True, slots=True)
class VersionedRecord:
    """A version of a key's value: valid from ``timestamp`` until ``valid_to`` (None: still valid)."""

    value: Any
    timestamp: int
    valid_to: int | None = None


def encode_versions(versions: list[Version]) -> bytes | None:
    """Newest first; None when no version is left (the key goes)."""
    if not versions:
        return None
    parts = []
    for timestamp, value in versions:
        parts.append(_VERSION.pack(timestamp, -1 if value is None else len(value)))
        if value is not None:
            parts.append(value)
    return b"".join(parts)


def decode_versions(data: bytes | None) -> list[Version]:
    versions: list[Version] = []
    if data is None:
        return versions
    at = 0
    while at < len(data):
        timestamp, length = _VERSION.unpack_from(data, at)
        at += _VERSION.size
        if length < 0:
            versions.append((timestamp, None))
        else:
            versions.append((timestamp, data[at:at + length]))
            at += length
    return versions


class VersionedKeyValueStore(StateStore):
    """A task's versioned key-value store; see the module docstring."""

    def __init__(self, *args: Any, history_retention_ms: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.history_retention_ms = history_retention_ms
        # The largest timestamp put so far; None until read back from the store (after a restore,
        # it is the newest version of any key: a version newer than all others is never dropped).
        self._observed: int | None = None

    @property
    def observed_stream_time(self) -> int:
        if self._observed is None:
            self._observed = max((decode_versions(v)[0][0] for _k, v in self.inner.range(None, None)), default=-1)
        return self._observed

    def _horizon(self) -> int:
        return self.observed_stream_time - self.history_retention_ms

    def put(self, key: Any, value: Any, timestamp: int) -> int:
        """Add the version ``value`` of ``key`` valid from ``timestamp`` (None: a tombstone)."""
        self._check_open()
        if isinstance(timestamp, bool) or not isinstance(timestamp, int) or timestamp < 0:
            raise ValueError(f"Versioned store '{self.name}': timestamps must be ints >= 0, got {timestamp!r}")
        if timestamp < self._horizon():
            return PUT_RETURN_CODE_NOT_PUT
        key_bytes = self._key(key)
        versions = decode_versions(self._get(key_bytes))
        data = None if value is None else self.value_serde.serialize(value)
        # Newest first: the new version goes before the first one not newer than it; one at the
        # same timestamp is replaced.
        index = next((i for i, (t, _v) in enumerate(versions) if t <= timestamp), len(versions))
        if index < len(versions) and versions[index][0] == timestamp:
            versions[index] = (timestamp, data)
        else:
            versions.insert(index, (timestamp, data))
        valid_to = PUT_RETURN_CODE_VALID_TO_UNDEFINED if index == 0 else versions[index - 1][0]
        self._observed = max(self.observed_stream_time, timestamp)
        self._write(key_bytes, encode_versions(self._reachable(versions)))
        return valid_to

    def _reachable(self, versions: list[Version]) -> list[Version]:
        """The versions a query can still reach: those valid at or after the horizon (a version is
        valid until the next newer one), less an older tombstone valid at the horizon (reading it
        or nothing is the same, and no put can go below the horizon to be ended by it). The newest
        version stays, tombstone or not: the observed stream time is read back from it."""
        horizon = self._horizon()
        kept: list[Version] = []
        for version in versions:
            kept.append(version)
            if version[0] <= horizon:
                break  # valid at the horizon; every older version ended before it
        if len(kept) > 1 and kept[-1][1] is None and kept[-1][0] <= horizon:
            kept.pop()
        return kept

    def delete(self, key: Any, timestamp: int) -> VersionedRecord | None:
        """A tombstone at ``timestamp``; returns the version valid just before it (None if none)."""
        old = self.get(key, timestamp)
        self.put(key, None, timestamp)
        return old

    def get(self, key: Any, as_of_timestamp: int | None = None) -> VersionedRecord | None:
        """The latest version, or the one valid at ``as_of_timestamp``; None for a tombstone, no
        version, or a time older than the history kept."""
        self._check_open()
        versions = decode_versions(self._get(self._key(key)))
        if as_of_timestamp is not None and as_of_timestamp < self._horizon():
            return None
        newer: int | None = None
        for timestamp, data in versions:
            if as_of_timestamp is None or timestamp <= as_of_timestamp:
                if data is None:
                    return None
                return VersionedRecord(self.value_serde.deserialize(data), timestamp, newer)
            newer = timestamp
        return None

    def _undo(self, *args: Any, **kwargs: Any) -> None:
        super()._undo(*args, **kwargs)
        self._observed = None  # read back: the undone put may have moved it

    def approximate_num_entries(self) -> int:
        return self.inner.approximate_num_entries()
