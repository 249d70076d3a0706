"""What a global table does with one record of its topic, as Kafka Streams' global task does.

While the table bootstraps, records are copied into the store as bytes (Kafka Streams'
global restore of a DSL table). After that each record is read with the table's serdes
first: one that cannot be read goes to ``default.deserialization.exception.handler``;
``CONTINUE`` skips it (logged by the handler, counted here), any other answer fails the
global thread with a ``DeserializationError`` (a global table has no task to pause), and
the client goes to ERROR, as in Kafka Streams.
"""

from __future__ import annotations

from typing import Any

from streamloop.errors import DeserializationError
from streamloop.handlers.context import ErrorContext
from streamloop.handlers.responses import Answer
from streamloop.records import ConsumerRecord
from streamloop.state.global_store import GlobalKeyValueStore


class GlobalUpdates:
    """``handler``: the deserialization exception handler (None: records are not read, only copied)."""

    def __init__(self, handler: Any | None) -> None:
        self._handler = handler
        self.skipped = 0

    def apply(self, store: GlobalKeyValueStore, record: ConsumerRecord, read: bool) -> bool:
        """Write ``record`` to ``store`` (``read``: after reading it with the serdes); False if skipped."""
        if read and self._handler is not None:
            what = "key"
            try:
                if record.key is not None:
                    store.key_serde.deserialize(record.key)
                what = "value"
                if record.value is not None:
                    store.value_serde.deserialize(record.value)
            except Exception as exc:
                error = DeserializationError(None, record.topic, record.partition, record.offset, what, exc)
                context = ErrorContext(None, record.topic, record.partition, record.offset, record.timestamp,
                                       tuple(record.headers), record.key, record.value, store.name)
                if self._handler.handle(context, record, exc) is Answer.CONTINUE:
                    self.skipped += 1
                    return False
                raise error from exc
        return store.apply(record.key, record.value)
