"""Changelog topics: where a store's updates go so another instance can rebuild it.

The topic is ``<application.id>-<store>-changelog``, compacted (windowed stores
also delete by time), with one partition per task of the owning sub-topology. Each
update goes to the partition of its task, with a header naming the input record
(``topic:offset``) that caused it. Restoring uses that header to leave out the
updates of input records past the committed offset: those records will be
processed again, and applying their first attempt too would count them twice.
"""

from __future__ import annotations

from collections.abc import Callable

from streamloop.records import Headers

SOURCE_HEADER = "streamloop.source"

Append = Callable[[str, int, bytes, "bytes | None", int, Headers], None]


def changelog_topic(application_id: str, store: str) -> str:
    return f"{application_id}-{store}-changelog"


def topic_configs(windowed: bool, retention_ms: int | None) -> dict[str, str]:
    if windowed and retention_ms is not None:
        # A day on top, as Kafka Streams' windowstore.changelog.additional.retention.ms.
        return {"cleanup.policy": "compact,delete", "retention.ms": str(retention_ms + 86_400_000)}
    return {"cleanup.policy": "compact"}


def encode_source(source: tuple[str, int] | None) -> Headers:
    if source is None:
        return ()
    return ((SOURCE_HEADER, f"{source[0]}:{source[1]}".encode()),)


def decode_source(headers: Headers) -> tuple[str, int] | None:
    for name, value in headers:
        if name == SOURCE_HEADER and value is not None:
            topic, _, offset = value.decode().rpartition(":")
            try:
                return topic, int(offset)
            except ValueError:
                return None
    return None


class Changelogger:
    """Appends one store's updates to its changelog partition through the thread's producer."""

    __slots__ = ("topic", "partition", "_append")

    def __init__(self, topic: str, partition: int, append: Append) -> None:
        self.topic = topic
        self.partition = partition
        self._append = append

    def log(self, key: bytes, value: bytes | None, timestamp: int, source: tuple[str, int] | None) -> None:
        self._append(self.topic, self.partition, key, value, timestamp if timestamp > 0 else 0, encode_source(source))
