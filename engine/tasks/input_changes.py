"""Tasks whose input partitions change while they stay on this thread: a pattern source
(streamloop.topology.patterns) matched a topic created or deleted since the last rebalance.

A task is (sub-topology, partition) and reads that partition of each of its sub-topology's topics,
so a new matching topic adds a partition to tasks that keep running through a cooperative
rebalance, and a deleted one takes one away. Kafka Streams updates such a task's input partitions
in place (``Task#updateInputPartitions``); here the task closes cleanly (finish, commit) and is
created again with all its partitions, from its committed offsets: the same records, one path
for creating tasks.

Caller: the stream thread's rebalance listener (``streamloop.threads.loop``), only for a topology
that reads by pattern. Eager rebalances revoke every task first, so nothing changes under one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from streamloop.records import TopicPartition

if TYPE_CHECKING:
    from streamloop.tasks.manager import TaskManager
    from streamloop.transport.base import Consumer


def left_over(manager: TaskManager, revoked: Iterable[TopicPartition]) -> set[TopicPartition]:
    """The partitions of tasks that lose some (``revoked``) but not all of theirs: the
    revocation closes the whole task, and the rest must get their task again."""
    lost = {TopicPartition(tp.topic, tp.partition) for tp in revoked}
    rest: set[TopicPartition] = set()
    for task in manager.tasks.values():
        held = set(task.partitions)
        if held & lost:
            rest |= held - lost
    return rest


async def regroup_changed_inputs(manager: TaskManager, consumer: Consumer | None, assigned: Iterable[TopicPartition],
                                 timeout: float, kept: Iterable[TopicPartition] = ()) -> set[TopicPartition]:  # noqa: ASYNC109
    """The partitions to create tasks for: ``assigned``, plus those of kept tasks that got more
    (closed here first) and ``kept`` (``left_over`` of the revocation) still assigned."""
    result = {TopicPartition(tp.topic, tp.partition) for tp in assigned}
    held = {tp: task for task in manager.tasks.values() for tp in task.partitions}
    grown = {manager.tasks[task_id] for tp in result if tp not in held
             and (task_id := manager.task_id_of(tp)) in manager.tasks}
    if grown:
        partitions = {tp for task in grown for tp in task.partitions}
        await manager.close_tasks(grown, clean=True, timeout=timeout)
        result |= partitions
    if consumer is not None:
        still = consumer.assignment()
        result |= {tp for tp in kept if tp in still and tp not in held}
    return result
