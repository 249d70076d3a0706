"""Tasks whose input partitions change while they stay on this thread: a pattern source
(streamloop.topology.patterns) matched a topic created or deleted since the last rebalance.

A task is (sub-topology, partition) and reads that partition of each of its sub-topology's topics,
so a new matching topic adds a partition to tasks that keep running through a cooperative
rebalance, and a deleted one takes one away. Kafka Streams updates such a task's input partitions
in place (``Task#updateInputPartitions``); here the task closes cleanly (finish, commit) and is
created again with all its partitions, from its committed offsets (the task manager seeks the
partitions it keeps back to them: the consumer's position is past the records the closed task
fetched and did not process): the same records, one path for creating tasks.

Caller: the stream thread's rebalance listener (``streamloop.threads.loop``), only for a topology
that reads by pattern, before ``TaskManager.handle_assignment``. Eager rebalances revoke every
task first, so nothing changes under one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from streamloop.records import TopicPartition

if TYPE_CHECKING:
    from streamloop.logcontext import LogContext
    from streamloop.tasks.manager import TaskManager


async def close_changed_tasks(manager: TaskManager, assigned: Iterable[TopicPartition], timeout: float,  # noqa: ASYNC109
                              log: LogContext) -> None:
    """Close (cleanly) the tasks that stay here but get a partition they lack: ``assigned`` is the
    whole new assignment, so ``handle_assignment`` then creates them again with all of theirs.

    A task that lost the partition of a deleted topic was closed by its revocation already, and
    comes back the same way."""
    held = {tp for task in manager.tasks.values() for tp in task.partitions}
    changed = {manager.tasks[task_id] for tp in assigned
               if TopicPartition(tp.topic, tp.partition) not in held
               and (task_id := manager.task_id_of(tp)) in manager.tasks}
    if changed:
        log.debug("Input partitions of tasks %s changed (a pattern source's topics): closing them to "
                  "create them again", sorted(str(t.id) for t in changed))
        await manager.close_tasks(changed, clean=True, timeout=timeout)
