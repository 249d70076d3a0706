"""Where the leader puts each stateful task's standby replicas (``num.standby.replicas``).

Kafka Streams' ``HighAvailabilityTaskAssignor`` places standbys per client (instance): a task's
standbys go to instances other than its active's and other than each other's, the least loaded
first, and a client that held the task before (and so has its state on disk) is preferred.
Simplified here:

- the active placement is the existing sticky ``balance``; no "warm-up" replicas and no moving
  an active to a caught-up instance (``acceptable.recovery.lag``): actives stay where they are;
- standbys are spread over members (stream threads), constrained per instance (process id);
- "sticky" means: a member that had the task before (as standby or active) gets it again while
  its load is within one of the least loaded candidate, which bounds the imbalance stickiness
  may cause to one task per member;
- no rack awareness (``rack.aware.assignment.tags``).

A task gets fewer standbys than asked when there are not enough other instances (as in Kafka
Streams, which logs it); with one instance it gets none.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from streamloop.ids import TaskId

log = logging.getLogger(__name__)


def assign_standbys(
    active: Mapping[str, Sequence[TaskId]],
    process_of: Mapping[str, str],
    stateful: Sequence[TaskId],
    replicas: int,
    previous: Mapping[str, Sequence[TaskId]] | None = None,
) -> dict[str, list[TaskId]]:
    """The standby tasks of each member.

    ``active``: each member's active tasks; ``process_of``: each member's instance (process id);
    ``stateful``: the tasks to replicate; ``previous``: the tasks (active or standby) each member
    held before, for stickiness.
    """
    result: dict[str, list[TaskId]] = {m: [] for m in active}
    if replicas <= 0 or not active:
        return result
    previous = previous or {}
    had = {m: set(previous.get(m, ())) for m in active}
    owner = {task: member for member, tasks in active.items() for task in tasks}
    # Load counts active and standby tasks alike: both take a thread's time and disk.
    load = {m: len(tasks) for m, tasks in active.items()}
    short: list[TaskId] = []
    for task in sorted(stateful):
        if task not in owner:
            continue
        used = {process_of[owner[task]]}
        for _ in range(replicas):
            candidates = [m for m in sorted(active) if process_of[m] not in used]
            if not candidates:
                short.append(task)
                break
            least = min(load[m] for m in candidates)
            sticky = [m for m in candidates if task in had[m] and load[m] <= least + 1]
            chosen = sticky[0] if sticky else next(m for m in candidates if load[m] == least)
            result[chosen].append(task)
            load[chosen] += 1
            used.add(process_of[chosen])
    if short:
        instances = len(set(process_of[m] for m in active))
        log.warning("num.standby.replicas is %d but only %d instance(s) are in the group: tasks %s have fewer "
                    "standbys", replicas, instances, [str(t) for t in short])
    for tasks in result.values():
        tasks.sort()
    return result
