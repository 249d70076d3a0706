"""The README's first application against a broker that answers group requests late, in figures.

Used by ``benchmarks/faults.py`` ("late coordinator" rows). The application is the README's:
``filter`` → ``map_values`` → ``to``, 2 stream threads, 4 partitions, 20 000 records, with the
client's default group timing (``heartbeat.interval.ms`` 3 s, ``session.timeout.ms`` 45 s). The
broker is Apache Kafka at its default group settings behind the late proxy
(``tests/support/late_broker.py``): every successful JoinGroup answer is held ``delay_s``, the
leader's SyncGroup answer 0.5 s and a follower's 1.5 s.

Figures: the generations the group went through until it settled, seconds to RUNNING with every
task assigned, JoinGroup requests from the application after that (must be 0: no generation is
started by our own client once settled), records lost (must be 0), and seconds until every record
was processed.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any

from streamloop.testing import eventually_async
from streamloop.transport import open_transport
from tests.support.cluster import Cluster
from tests.support.convergence import ClientWatch, create_topics, new_client, processed, produce
from tests.support.late_broker import GroupDelays, late_kafka

RECORDS = 20_000
PARTITIONS = 4
THREADS = 2


class _Names:
    def __init__(self) -> None:
        self.suffix = uuid.uuid4().hex[:8]

    def __call__(self, base: str) -> str:
        return f"{base}-{self.suffix}"

    @property
    def app(self) -> str:
        return f"late-{self.suffix}"


async def late_coordinator(delay_s: float, records: int = RECORDS) -> dict[str, Any]:
    delays = GroupDelays(join_s=delay_s, leader_sync_s=0.5, follower_sync_s=1.5)
    round_s = delay_s + delays.follower_s
    # Kafka's initial rebalance delay (3 s, once more for the second member) plus two rounds.
    bound_s = 6.0 + 2 * round_s + 5.0
    names = _Names()
    settled_s: float | None = None
    done_s: float | None = None
    joins_after = 0
    with late_kafka() as kafka:
        cluster = Cluster(open_transport({"bootstrap.servers": kafka.bootstrap}), kafka.bootstrap)
        topics = await create_topics(cluster, names, PARTITIONS)
        await produce(cluster, topics, 0, records)
        streams = new_client(cluster, names, topics, THREADS, heartbeat_interval_ms=3_000, session_timeout_ms=45_000)
        watch = ClientWatch(streams)
        kafka.set_delays(delays)
        started = time.monotonic()
        await streams.start_async()
        try:
            with contextlib.suppress(TimeoutError):
                await eventually_async(lambda: watch.settled(THREADS, PARTITIONS), bound_s, interval=0.05)
                settled_s = time.monotonic() - started
            generations = len(kafka.record.generations(names.app))
            if settled_s is not None:
                quiet_from = time.monotonic()

                async def all_processed() -> bool:
                    return len(await processed(cluster, topics)) >= records
                with contextlib.suppress(TimeoutError):
                    await eventually_async(all_processed, max(round_s, 30.0), interval=0.5)
                    done_s = time.monotonic() - started
                joins_after = len(kafka.record.join_requests_since(quiet_from, group_id=names.app))
            deaths = sum(m.value for m in streams.metrics() if m.name == "failed-stream-threads")
        finally:
            kafka.set_delays(GroupDelays())
            await streams.close_async(timeout=30)
        seen = await processed(cluster, topics)
    lost = records - len(seen & set(range(records)))
    return {
        "faults": 1, "lost": lost, "stalled": int(settled_s is None or done_s is None),
        "thread_deaths": int(deaths), "recover_s": None if settled_s is None else round(settled_s, 1),
        "note": (f"{generations} generations until settled; RUNNING after "
                 f"{'-' if settled_s is None else f'{settled_s:.1f} s'} (bound {bound_s:.0f} s); "
                 f"{joins_after} JoinGroups of ours after; all records after "
                 f"{'-' if done_s is None else f'{done_s:.1f} s'}"),
    }
