"""The test driver's side of sources by pattern (``streamloop.topology.patterns``): a topic piped
into (``create_input_topic``, ``pipe_raw``) that a source's pattern matches becomes a source topic
then, as a topic created while an application runs does after the next rebalance. Its partitions
(``partitions=`` of the driver, else one) join the tasks of its sub-topology: a task that gains
one is revoked (committed, closed) and assigned again with all of its partitions."""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamloop import config as cfg
from streamloop.records import TopicPartition
from streamloop.topology.patterns import check_task_limits, pattern_topics

if TYPE_CHECKING:
    from streamloop.testing.driver import TopologyTestDriver


def adopt_pattern_topic(driver: TopologyTestDriver, topic: str) -> bool:
    """True if a pattern source reads ``topic`` now (it was made a source topic here); False if no
    pattern matches it. Raises ``TopologyError`` for a topic two patterns match."""
    topology = driver.topology
    if not topology.has_patterns or not topology.resolve_patterns([*pattern_topics(topology), topic]):
        return False
    check_task_limits(topology, {t: len(driver._log(t).partitions) for t in pattern_topics(topology)})
    new = [TopicPartition(topic, p) for p in range(len(driver._log(topic).partitions))]
    driver._all_partitions.extend(new)
    driver._runner.run(_regroup(driver, new))
    return True


async def _regroup(driver: TopologyTestDriver, new: list[TopicPartition]) -> None:
    manager = driver._manager
    changed = {manager.tasks[task_id] for tp in new if (task_id := manager.task_id_of(tp)) in manager.tasks}
    kept = sorted(tp for task in changed for tp in task.partitions)
    for task in changed:
        task.finished.set()  # the driver runs its tasks itself: none is in the middle of a record
    await manager.handle_revocation(kept, timeout=1.0)
    driver._assign([*kept, *new])
    if driver.config[cfg.APPLICATION_SERVER]:
        driver._metadata.on_change({driver._metadata.this_host: set(driver._all_partitions)}, {})
