"""The processor of ``stream.join(global_table, key_selector, joiner)`` and ``left_join``.

Kafka Streams' ``KStreamKTableJoinProcessor`` with a key mapper (KIP-962 semantics, 3.7+): a
record without a value is dropped; ``key_selector(key, value)`` gives the key to look up in
the global table; an inner join forwards ``joiner(value, table_value)`` only when the table
has that key, a left join always (None for a missing row or a None lookup key). The
record keeps its key, timestamp and headers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from streamloop.processors.api import BaseProcessor, ProcessorContext
from streamloop.records import Record

log = logging.getLogger(__name__)


class GlobalTableJoinProcessor(BaseProcessor):
    def __init__(self, store_name: str, key_selector: Callable[[Any, Any], Any],
                 joiner: Callable[[Any, Any], Any], left: bool) -> None:
        self.store_name = store_name
        self.key_selector = key_selector
        self.joiner = joiner
        self.left = left
        self.dropped = 0

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._get = context.get_state_store(self.store_name).get

    def process(self, record: Record) -> None:
        lookup = None if record.value is None else self.key_selector(record.key, record.value)
        if record.value is None or (lookup is None and not self.left):
            self.dropped += 1
            log.warning("Skipping a record of %s-%s offset %s in the join with global store '%s': "
                        "null join key or value", self.context.topic, self.context.partition,
                        self.context.offset, self.store_name)
            return
        other = None if lookup is None else self._get(lookup)
        if other is None and not self.left:
            return
        self.context.forward(Record(record.key, self.joiner(record.value, other), record.timestamp,
                                    record.headers))
