"""Leaving the group on close: LeaveGroup v3 (KIP-345) for a static member, or staying in it.

Static membership
    ``group_instance_id`` is sent (JoinGroup v5); a member restarted with the
    same id within ``session_timeout_ms`` gets its partitions back without a
    rebalance. aiokafka never sends LeaveGroup for a static member (its
    LeaveGroup is v0/v1, which cannot name an instance id), and its admin
    client cannot remove group members. So ``KafkaConsumer.close`` with
    ``leave_group=True`` sends LeaveGroup v3 itself for a static member (a
    members list naming ``group_instance_id``, what the Java Admin's
    ``removeMembersFromConsumerGroup`` sends): the member leaves at once and
    the group rebalances. With ``leave_group=False`` a static member stays in
    the group until its session times out.

``close(leave_group=False)``
    aiokafka has no option for it; :func:`replace_leave_step` replaces the coordinator's
    leave step for that one close (a private aiokafka attribute), so the member
    stays in the group until its session times out.
"""

from __future__ import annotations

import logging
from typing import Any

from aiokafka import errors as aioerrors
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Int16, Int32, Schema, String

from streamloop.transport.kafka.errors import describe, error_name

__all__ = ["replace_leave_step"]

log = logging.getLogger(__name__)


def replace_leave_step(coordinator: Any, leave_group: bool, group_instance_id: str | None) -> None:
    """Make the closing consumer's leave step follow ``leave_group``, for a static member too.

    aiokafka's ``close()`` sends LeaveGroup for a dynamic member and never for a static one; it
    runs the step (``_maybe_leave_group``) after the coordination and heartbeat tasks have
    stopped, so nothing can rejoin the group after the member left.
    """
    if coordinator is None or not hasattr(coordinator, "_maybe_leave_group"):
        return
    if not leave_group:

        async def _stay_in_group() -> None:
            return None

        coordinator._maybe_leave_group = _stay_in_group
    elif group_instance_id is not None:

        async def _leave_static() -> None:
            await _leave_group_as_static_member(coordinator, group_instance_id)

        coordinator._maybe_leave_group = _leave_static


class _LeaveGroupResponse_v3(Response):  # type: ignore[misc]  # aiokafka ships no types
    API_KEY = 13
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        (
            "members",
            Array(
                ("member_id", String("utf-8")),
                ("group_instance_id", String("utf-8")),  # nullable
                ("error_code", Int16),
            ),
        ),
    )


class _LeaveGroupRequest_v3(RequestStruct):  # type: ignore[misc]  # aiokafka ships no types
    API_KEY = 13
    API_VERSION = 3
    RESPONSE_TYPE = _LeaveGroupResponse_v3
    SCHEMA = Schema(
        ("group_id", String("utf-8")),
        (
            "members",
            Array(("member_id", String("utf-8")), ("group_instance_id", String("utf-8"))),
        ),
    )


class _StaticLeaveGroupRequest(Request[_LeaveGroupRequest_v3]):  # type: ignore[misc]  # aiokafka ships no types
    """LeaveGroup for one static member; v3 is the first version that names instance ids.

    Raises ``NotImplementedError`` from ``prepare`` when the broker does not
    support v3 (Kafka < 2.4).
    """

    API_KEY = 13

    def __init__(self, group_id: str, member_id: str, group_instance_id: str) -> None:
        self.group_id = group_id
        self.member_id = member_id
        self.group_instance_id = group_instance_id

    def build(self, request_struct_class: type[_LeaveGroupRequest_v3]) -> _LeaveGroupRequest_v3:
        return request_struct_class(self.group_id, [(self.member_id, self.group_instance_id)])


async def _leave_group_as_static_member(coordinator: Any, group_instance_id: str) -> None:
    """The leave step of a closing static member: LeaveGroup v3 naming its instance id.

    Best effort, like aiokafka's own: a failure is logged and the member then
    leaves when its session times out.
    """
    try:
        if coordinator.generation > 0 and coordinator.member_id:
            request = _StaticLeaveGroupRequest(
                coordinator.group_id, coordinator.member_id, group_instance_id
            )
            try:
                response = await coordinator._send_req(request)
            except (aioerrors.KafkaError, NotImplementedError) as exc:
                log.error(
                    "LeaveGroup of static member %s (group %s) failed: %s; it stays in the "
                    "group until its session times out",
                    group_instance_id,
                    coordinator.group_id,
                    describe(exc),
                )
                return
            codes = [response.error_code, *(member[2] for member in response.members)]
            errors = [error_name(code) for code in codes if code != 0]
            if errors:
                log.error(
                    "LeaveGroup of static member %s (group %s) answered %s",
                    group_instance_id,
                    coordinator.group_id,
                    ", ".join(errors),
                )
            else:
                log.info(
                    "Static member %s left group %s", group_instance_id, coordinator.group_id
                )
    finally:
        coordinator.reset_generation()

