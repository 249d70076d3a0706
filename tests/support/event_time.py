"""Event times for test records on real Kafka: near the broker's clock, or the broker deletes them.

A Kafka broker deletes a topic's records by their timestamps: a segment goes once its newest
record is older than the wall clock minus the topic's ``retention.ms``. The changelog topics
of windowed stores have ``cleanup.policy=compact,delete`` and ``retention.ms`` = the store's
retention + 1 day (as Kafka Streams'), and the log cleaner applies that to them every 15 s
(``log.cleaner.backoff.ms``). Records stamped in 1970 (``timestamp=1000``) are deleted there
within seconds, and a restart that restores the store in between finds an empty changelog.

A test whose windowed state must come back from its changelog stamps its records from
``recent_ms()`` on.
"""

from __future__ import annotations

import time

HOUR_MS = 3_600_000


def recent_ms(align_ms: int = HOUR_MS) -> int:
    """The wall clock, rounded down to a multiple of ``align_ms`` (so windows of up to that size
    start on it): at most ``align_ms`` in the past, well within a day."""
    now = int(time.time() * 1000)
    return now - now % align_ms
