"""A stream thread's rebalance listener: what it does when the group takes partitions away and
gives them, and the facts of its membership that decide when it joins again.

The consumer calls ``on_partitions_revoked``, ``on_join_registered`` and ``on_partitions_assigned``
on the thread's loop (``streamloop.transport.base.RebalanceListener``). ``GroupListener`` keeps the
generation this thread is in and the siblings' joins it already rejoined for
(``streamloop.tasks.membership``), why it asked to rejoin, the partitions a cooperative assignment
made it hand over, and the wait for a follow-up rebalance; the poll loop
(``streamloop.threads.loop.ThreadLoop``) asks it to rejoin and to look for the follow-up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamloop import config as cfg
from streamloop.ids import TaskId
from streamloop.records import TopicPartition
from streamloop.recovery import ShutdownRequested
from streamloop.tasks.assignor import ShutdownRequest
from streamloop.tasks.input_changes import close_changed_tasks
from streamloop.tasks.membership import FollowUpWait, GenerationWatch
from streamloop.threads.states import StreamThreadState

if TYPE_CHECKING:
    from streamloop.threads.loop import ThreadLoop
    from streamloop.threads.stream_thread import StreamThread


class GroupListener:
    """Caller: the thread's consumer (its rebalance callbacks) and its loop, all on that loop."""

    def __init__(self, loop: ThreadLoop, thread: StreamThread) -> None:
        self._loop = loop
        self._thread = thread
        self._config = thread.config
        self._log = thread.log
        # The generation this thread is in, and the siblings' joins it already rejoined for.
        self.generation = GenerationWatch(thread.membership)
        # Why this thread asked to rejoin, for the log of its next join (None: the coordinator asked).
        self._rejoin_reason: str | None = None
        # Cooperative: partitions revoked by the assignment under way, after this thread's JoinGroup
        # was answered (the follow-up join is this thread's to make).
        self._handing_over = 0
        self.follow_up = FollowUpWait(self._config[cfg.RETRY_BACKOFF_MS], self._config[cfg.HEARTBEAT_INTERVAL_MS])

    def request_rejoin(self, reason: str) -> None:
        consumer = self._loop.consumer
        if consumer is not None:
            self._rejoin_reason = self._rejoin_reason or reason
            consumer.request_rejoin()

    def rejoin_if_stale(self) -> bool:
        """Rejoin now if a sibling's join or departure makes this thread's generation stale."""
        thread = self._thread
        changes = self.generation.stale((t.membership, t.is_alive) for t in thread.siblings())
        if not changes:
            return False
        reason = ", ".join(change.describe() for change in changes)
        self._log.debug("Generation %s is stale (%s): rejoining now rather than at the next heartbeat",
                        self.generation.number, reason)
        self.request_rejoin(reason)
        return True

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        thread = self._thread
        thread.state.maybe_transition_to(StreamThreadState.PARTITIONS_REVOKED)
        if revoked and not self.generation.settled:
            # Cooperative: partitions lost in the assignment under way; the follow-up join comes next.
            # (Revoked before a JoinGroup, by a member dropped from the group, it is reset when the
            # coordinator registers the join: no follow-up comes of that.)
            self._handing_over = len(revoked)
        self._begin_join()
        manager = thread.view.manager
        if manager is not None and revoked:
            self._log.debug("Partitions revoked: %s", sorted(str(tp) for tp in revoked))
            if thread.assignor.shutdown is ShutdownRequest.CARRIED_ON_EXIT:
                # A failed thread still in the group (carrying a shutdown request): no commit.
                await manager.shutdown(clean=False, timeout=0)
            else:
                await manager.handle_revocation(revoked, self._config.seconds(cfg.REQUEST_TIMEOUT_MS))
            # The assignor's owned tasks stay as they were: the rejoin's subscription names the
            # tasks whose state this thread holds, so the leader can keep them here (sticky).
            self._thread.view.publish_tasks()

    def _begin_join(self) -> None:
        """Before a JoinGroup: count a new join, and tell the siblings once the coordinator has it."""
        self.follow_up.end()
        if not self.generation.begin_join():
            return  # the join under way, retried
        thread = self._thread
        joins = thread.membership.joining
        reason, self._rejoin_reason = self._rejoin_reason, None
        reason = reason or ("first join" if joins == 1 else "the group coordinator started a rebalance")
        self._log.debug("Joining the group (join %d): %s", joins, reason)
        thread.rebalances.started(joins, reason)
        if self._loop.consumer is not None and self._loop.consumer.member_id is not None:
            self.on_join_registered()  # a known member: the coordinator waits for it already

    def on_join_registered(self) -> None:
        """The coordinator has this thread's join: the siblings whose generation it makes stale rejoin now."""
        self._handing_over = 0
        if self.generation.registered():
            self._thread.on_membership_change(self._thread)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        thread = self._thread
        thread.state.maybe_transition_to(StreamThreadState.PARTITIONS_ASSIGNED)
        if thread.assignor.shutdown is ShutdownRequest.ANSWERED:
            self._log.error("The application is shutting down on request of one of its instances")
            self._loop.recovery.report(ShutdownRequested())
            thread.on_shutdown_requested(thread)
            thread.state.maybe_transition_to(StreamThreadState.PENDING_SHUTDOWN)
            return
        if self._loop.asked_to_stop:
            # As Kafka Streams: a thread on its way out (its consumer may be closing, which can still
            # complete a rebalance) creates no tasks; they would restore through a closed consumer.
            self._log.debug("Skipping task creation: the thread is shutting down")
            return
        manager = thread.view.manager
        if self._loop.standbys is not None:
            # First: a standby promoted to active here releases its stores to the new active task.
            await self._loop.standbys.update(thread.assignor.standby_tasks, self._inputs_of)
        if manager is not None:
            self._log.debug("Partitions assigned: %s", sorted(str(tp) for tp in assigned))
            if thread.topology.has_patterns:
                # A topic a pattern matched since changes the partitions of tasks that stay here.
                await close_changed_tasks(manager, assigned, self._config.seconds(cfg.REQUEST_TIMEOUT_MS), self._log)
            manager.handle_assignment(assigned)
            self.publish_tasks()
        generation = self._loop.consumer.generation if self._loop.consumer is not None else None
        self.generation.settle(generation, thread.assignor.roster)
        thread.rebalances.completed(generation)
        if self._handing_over:
            # The transport rejoins for the follow-up that hands the lost partitions to their new
            # owners: the join starts now, so the siblings hear of it before this callback returns.
            self._rejoin_reason = f"hands {self._handing_over} partition(s) over (cooperative follow-up)"
            self._handing_over = 0
            self._begin_join()
            return
        if self.rejoin_if_stale():
            return  # not RUNNING: the group is about to rebalance
        if thread.assignor.follow_up:
            # Cooperative: the tasks run on, but the group settles only in the follow-up rebalance.
            self._log.debug("Waiting for the follow-up rebalance that moves the withheld tasks")
            self.follow_up.begin(thread.clock.monotonic_ms())
            return
        thread.state.maybe_transition_to(StreamThreadState.RUNNING)

    def publish_tasks(self) -> None:
        view = self._thread.view
        view.publish_tasks()
        if view.manager is not None:
            self._thread.assignor.owned_tasks = sorted(view.manager.tasks)
        if self._loop.standbys is not None:
            view.publish_standbys(self._loop.standbys.tasks.values())
            self._thread.assignor.owned_standby_tasks = sorted(self._loop.standbys.tasks)

    def _inputs_of(self, task_id: TaskId) -> list[TopicPartition]:
        sub = self._thread.topology.subtopologies[task_id.subtopology]
        return [TopicPartition(topic, task_id.partition) for topic in sub.source_topics]
