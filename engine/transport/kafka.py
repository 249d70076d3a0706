"""The Kafka transport: the protocols of :mod:`engine.transport.base` over aiokafka.

How aiokafka behaves matters to the engine; the points below were checked in
aiokafka 0.14's source (``consumer/group_coordinator.py``, ``consumer/fetcher.py``,
``producer/sender.py``, ``producer/message_accumulator.py``).

Group membership and rebalance callbacks
    aiokafka runs the group protocol in a background task of the consumer's
    loop (the *coordination task*), not inside ``getmany``. The rebalance
    listener is awaited by that task: ``on_partitions_revoked`` (eager, every
    owned partition, also with an empty set on the first join) before the
    JoinGroup request, then, after SyncGroup, the assignor's ``on_assignment``
    and ``on_partitions_assigned``. So the callbacks can run whenever the
    engine's loop is idle at an ``await`` (during ``poll`` but also during a
    ``flush`` or ``commit``), never in another thread.
    ``getmany`` returns nothing from the start of a rebalance until the new
    assignment arrives, and it never returns records fetched under an older
    assignment. On top of that :meth:`KafkaConsumer.poll` adds two guarantees:
    it returns after ``timeout_ms`` even while a rebalance is in progress
    (aiokafka's ``getmany`` would wait for the assignment however long it
    takes), and it never returns records of a new assignment before
    ``on_partitions_assigned`` has finished (records fetched too early are put
    back with a seek and fetched again by a later ``poll``). So ``poll`` must
    not be called from inside ``on_partitions_assigned``.
    aiokafka logs and swallows exceptions raised by the listener. This
    transport records the first exception of the engine's listener or
    assignor and raises it from the next ``poll``.

Heartbeats and ``max_poll_interval_ms``
    Heartbeats are a coroutine on the same loop, so CPU-bound work on the loop
    delays them. If ``poll`` is not called for ``max_poll_interval_ms``, the
    heartbeat task makes the member leave the group.

Static membership
    ``group_instance_id`` is sent (JoinGroup v5); a member restarted with the
    same id within ``session_timeout_ms`` gets its partitions back without a
    rebalance. aiokafka never sends LeaveGroup for a static member (its
    LeaveGroup is v0/v1, which cannot name an instance id), and its admin
    client cannot remove group members. So :meth:`KafkaConsumer.close` with
    ``leave_group=True`` sends LeaveGroup v3 itself for a static member (a
    members list naming ``group_instance_id``, what the Java Admin's
    ``removeMembersFromConsumerGroup`` sends): the member leaves at once and
    the group rebalances. With ``leave_group=False`` a static member stays in
    the group until its session times out.

``request_rejoin()``
    Uses the coordinator's private ``request_rejoin()`` (aiokafka has no
    ``enforceRebalance``). A follower that rejoins with an unchanged
    subscription gets its old assignment back without a group rebalance, so
    the transport puts a rejoin counter in front of the assignor's user data
    (stripped again before ``GroupAssignor.assign`` sees it); every
    ``request_rejoin()`` changes it and so rebalances the whole group.

``close(leave_group=False)``
    aiokafka has no option for it; this transport replaces the coordinator's
    leave step for that one close (a private aiokafka attribute), so the member
    stays in the group until its session times out.

Producer ordering
    aiokafka has at most one produce request in flight per broker and mutes a
    partition while a batch of it is in flight; failed batches are put back at
    the head of their partition's queue. Batches of one partition are therefore
    written in the order they were handed to ``send_batch``.

Timeouts and retriable errors
    aiokafka signals timeouts as ``KafkaTimeoutError`` (batch expiry after
    ``request_timeout_ms``, ``end_offsets``), ``RequestTimedOutError`` (broker
    side, retriable), ``NodeNotReadyError``/``KafkaConnectionError`` (retriable)
    and builtin ``TimeoutError`` (``asyncio`` timeouts). A produce to a topic
    that does not exist fails after ``request_timeout_ms`` with
    ``UnknownTopicOrPartitionError`` (metadata never shows the topic). While a
    broker restarts, a batch whose request timeout passes before the new
    leader is known fails with ``LeaderNotAvailableError`` or
    ``NotLeaderForPartitionError`` (retriable: aiokafka retries them itself
    only until the batch expires). They reach the engine wrapped
    (``ProduceError``, ``TransportError``) with ``retriable`` set and the
    aiokafka exception as ``__cause__``; :func:`is_retriable` is the one
    place that classifies them.

Transactions (exactly-once)
    With ``ProducerSettings.transactional_id`` the aiokafka producer is
    transactional: ``start`` sends InitProducerId (fencing older producers of
    the id and aborting their open transaction), a transaction begins with the
    first batch handed over, and ``commit_transaction`` flushes, sends
    AddOffsetsToTxn + TxnOffsetCommit and EndTxn. aiokafka 0.14 sends
    TxnOffsetCommit **v0**: group id, transactional id, producer id and epoch,
    offsets — no generation id, member id or group instance id, so the group
    coordinator cannot fence a zombie member (KIP-447); only the
    transactional.id fences. aiokafka sends EndTxn without waiting for batches
    in flight, so ``commit_transaction`` waits for every ack first and
    ``abort_transaction`` waits for them (bounded) too. It also waits for the
    end of a transaction without a deadline: both calls are bounded by
    ``request_timeout_ms`` here. Fencing (ProducerFenced, InvalidProducerEpoch,
    TransactionCoordinatorFenced) surfaces as ``ProducerFencedError``.

Security
    Kafka's ``security.protocol``, ``sasl.*`` and ``ssl.*`` keys become aiokafka options in
    :mod:`engine.transport.security`. aiokafka's bootstrap catches every connection error,
    a refused SASL login (``SaslAuthenticationFailed``) and a failed TLS handshake
    (``SSLCertVerificationError``) included, logs it and raises only ``KafkaConnectionError``
    "Unable to bootstrap", which reads as a timeout. So when a secured client cannot
    start, the transport connects once more to each bootstrap address and raises
    ``AuthenticationError`` (not retried) if that connection is refused, or, over TLS, closed
    by the broker before its first answer (a client certificate it requires is missing or not
    trusted). A refusal by a
    broker other than the bootstrap ones, or after the client started, is still reported
    as a lost connection (``NodeNotReadyError``).

Topic auto-creation
    aiokafka's own metadata requests (consumer and producer) allow broker-side
    auto-creation. :meth:`KafkaAdmin.partition_counts` never asks for a topic
    by name, so it cannot create one.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import ssl
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import errors as aioerrors
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.conn import collect_hosts, create_conn
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Int16, Int32, Schema, String
from aiokafka.structs import OffsetAndMetadata as AioOffsetAndMetadata
from aiokafka.structs import TopicPartition as AioTopicPartition

from engine.errors import (
    AuthenticationError,
    CommitFailedError,
    ConfigError,
    IllegalStateError,
    ProduceError,
    ProducerFencedError,
    StartupTimeoutError,
    StreamsTimeoutError,
    TaskTimeoutError,
    TransportError,
)
from engine.records import ConsumerRecord, Headers, TopicPartition
from engine.transport.base import (
    ConsumerSettings,
    GroupAssignor,
    MemberAssignment,
    MemberSubscription,
    OffsetAndMetadata,
    ProducerSettings,
    RebalanceListener,
)
from engine.transport.prefetch import take_prefetched
from engine.transport.security import CLIENT_KINDS, is_security_key, security_options, unused_security_keys

__all__ = [
    "KafkaAdmin",
    "KafkaConsumer",
    "KafkaProducer",
    "KafkaTransport",
    "is_retriable",
]

log = logging.getLogger(__name__)

# Error codes of CreateTopics/DeleteTopics responses that are not failures here.
_TOPIC_ALREADY_EXISTS = aioerrors.TopicAlreadyExistsError.errno
_UNKNOWN_TOPIC = aioerrors.UnknownTopicOrPartitionError.errno

# Another producer initialised our transactional.id (or the transaction timed out on the broker).
_FENCED_ERRORS: tuple[type[BaseException], ...] = (
    aioerrors.ProducerFenced,
    aioerrors.InvalidProducerEpoch,
    aioerrors.TransactionCoordinatorFenced,
)

# The errors that end a retry (a deadline ran out, or credentials the broker refused): never
# retried themselves, even though what they were raised from was (a refused TLS handshake is
# raised from the connection error it showed up as).
_FINAL_ERRORS: tuple[type[BaseException], ...] = (StreamsTimeoutError, TaskTimeoutError, StartupTimeoutError,
                                                   AuthenticationError)


def is_retriable(exc: BaseException) -> bool:
    """Whether ``exc``, or the error it was raised from, is worth retrying under a deadline.

    The one classification of client errors in the engine (``engine.tasks.timeouts.is_timeout``
    is this function). Retriable: an engine ``TransportError`` marked ``retriable``; the builtin
    ``TimeoutError`` (asyncio timeouts, a slow processor); aiokafka's ``KafkaTimeoutError`` (a batch
    expired after ``request_timeout_ms``) and every aiokafka error whose ``retriable`` attribute is
    set, Kafka's ``RetriableException`` family: connection loss (``KafkaConnectionError``,
    ``NodeNotReadyError``), request timeouts, leader changes (``LeaderNotAvailableError``,
    ``NotLeaderForPartitionError``), coordinator moves (``NotCoordinatorError``,
    ``CoordinatorNotAvailableError``, ``CoordinatorLoadInProgressError``), stale metadata and
    ``UnknownTopicOrPartitionError`` (a topic's metadata not there yet).
    Not retriable: ``TaskTimeoutError``, ``StartupTimeoutError`` and ``StreamsTimeoutError`` (a
    deadline ran out), and an error merely *seen while handling* a retriable one (``__context__``
    is not followed).
    """
    current: BaseException | None = exc
    for _ in range(6):
        if current is None or isinstance(current, _FINAL_ERRORS):
            return False
        if isinstance(current, TransportError) and current.retriable:
            return True
        if isinstance(current, (TimeoutError, aioerrors.KafkaTimeoutError)):
            return True
        if isinstance(current, aioerrors.KafkaError) and current.retriable:
            return True
        current = current.__cause__
    return False


def _describe(exc: BaseException) -> str:
    text = str(exc)
    name = type(exc).__name__
    return f"{name}: {text}" if text and text != name else name


def _transport_error(exc: BaseException, what: str) -> TransportError:
    err = TransportError(f"{what} failed: {_describe(exc)}")
    err.retriable = is_retriable(exc)
    return err


async def _start_or_clean_up(
    start: Callable[[], Awaitable[Any]], stop: Callable[[], Awaitable[Any]], what: str,
    options: Mapping[str, object],
) -> None:
    """Start an aiokafka client; if that fails, release what it opened and report a TransportError
    (an ``AuthenticationError`` when the broker refused the client's credentials)."""
    try:
        await start()
    except BaseException as exc:
        await stop()
        if isinstance(exc, aioerrors.KafkaConnectionError):
            await _raise_if_refused(options)
        if isinstance(exc, aioerrors.KafkaError):
            raise _transport_error(exc, what) from exc
        raise


_SASL_REFUSALS: tuple[type[BaseException], ...] = (
    aioerrors.SaslAuthenticationFailed,
    aioerrors.AuthenticationFailedError,
    aioerrors.UnsupportedSaslMechanismError,
    aioerrors.IllegalSaslStateError,
)
_CONNECTION_OPTIONS = frozenset(inspect.signature(create_conn).parameters) - {"host", "port"}


async def _raise_if_refused(options: Mapping[str, object]) -> None:
    """Raise ``AuthenticationError`` if the bootstrap servers refuse the client's credentials.

    aiokafka's bootstrap logs each address's error and then raises only "Unable to bootstrap"
    (a ``KafkaConnectionError``, retried as a timeout). One more connection to each address
    tells a refused login or TLS handshake apart from an unreachable broker.
    """
    if options.get("security_protocol", "PLAINTEXT") == "PLAINTEXT":
        return
    kwargs = {k: v for k, v in options.items() if k in _CONNECTION_OPTIONS}
    timeout = float(options.get("request_timeout_ms", 40_000)) / 1000  # type: ignore[arg-type]
    client_id = str(options.get("client_id"))
    for host, port, _family in collect_hosts(options["bootstrap_servers"]):
        try:
            conn = await asyncio.wait_for(create_conn(host, port, **kwargs), timeout)
        except _SASL_REFUSALS as exc:
            raise AuthenticationError(str(options.get("sasl_mechanism")), client_id, str(exc) or _describe(exc)) from exc
        except ssl.SSLError as exc:
            raise AuthenticationError("SSL", client_id, _describe(exc)) from exc
        except aioerrors.KafkaConnectionError as exc:
            # Connected, then closed by the broker before its first answer: over TLS that is how a
            # broker with ssl.client.auth=required refuses a missing or untrusted client certificate.
            if options.get("ssl_context") is not None:
                raise AuthenticationError("SSL", client_id, "the broker closed the connection after the TLS "
                                          "handshake: it requires a client certificate that it trusts "
                                          "(ssl.keystore.location)") from exc
            continue
        except (OSError, aioerrors.KafkaError, asyncio.TimeoutError):
            continue  # not a refusal: the usual TransportError says the broker is unreachable
        conn.close()


def _aio_tp(tp: tuple[str, int]) -> AioTopicPartition:
    return tp if type(tp) is AioTopicPartition else AioTopicPartition(tp[0], tp[1])


def _our_tps(tps: Any) -> set[TopicPartition]:
    return {TopicPartition(tp[0], tp[1]) for tp in tps}


# -- pass-through options ---------------------------------------------------------------

# Kafka's dotted names mostly map to aiokafka's keyword names with "." -> "_".
_ALIASES = {"batch_size": "max_batch_size"}
_RESERVED = frozenset(
    {
        "self",
        "loop",
        "topics",
        "api_version",
        "bootstrap_servers",
        "group_id",
        "enable_auto_commit",
        "key_deserializer",
        "value_deserializer",
        "key_serializer",
        "value_serializer",
        "partition_assignment_strategy",
        "transactional_id",
    }
)


def _coerce(value: object, default: object) -> object:
    if isinstance(value, str):
        if isinstance(default, bool):
            low = value.strip().lower()
            if low in ("true", "false"):
                return low == "true"
        elif isinstance(default, int) and value.strip().lstrip("-").isdigit():
            return int(value)
    return value


def _client_kwargs(cls: type, raw: Mapping[str, object]) -> dict[str, object]:
    """Turn pass-through keys (``fetch.max.wait.ms`` or ``fetch_max_wait_ms``) into kwargs of ``cls``.

    Kafka's security keys (``sasl.jaas.config`` …) are left out: :func:`security_options` maps them.
    """
    params = inspect.signature(cls.__init__).parameters  # type: ignore[misc]
    out: dict[str, object] = {}
    for key, value in raw.items():
        if is_security_key(key):
            continue
        name = key.replace(".", "_").replace("-", "_")
        name = _ALIASES.get(name, name)
        if name in _RESERVED:
            raise ConfigError(key, f"is set by the engine and cannot be passed to {cls.__name__}")
        param = params.get(name)
        if param is None or param.kind in (
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        ):
            hint = ("; Kafka's security keys (security.protocol, sasl.jaas.config, ssl.truststore.location, …) "
                    "are listed in docs/security.md") if name.startswith(("ssl_", "sasl_")) else ""
            raise ConfigError(key, f"is not an option of aiokafka's {cls.__name__}{hint}")
        out[name] = _coerce(value, param.default)
    return out


# -- LeaveGroup v3 (KIP-345): leaving by group.instance.id ----------------------------------


class _LeaveGroupResponse_v3(Response):
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


class _LeaveGroupRequest_v3(RequestStruct):
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


class _StaticLeaveGroupRequest(Request[_LeaveGroupRequest_v3]):
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
    """Replaces aiokafka's leave step (``_maybe_leave_group``) of a closing static member.

    aiokafka runs it in ``close()`` after the coordination and heartbeat tasks
    have stopped, so nothing can rejoin the group after the member left.
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
                    _describe(exc),
                )
                return
            codes = [response.error_code, *(member[2] for member in response.members)]
            errors = [aioerrors.for_code(code).__name__ for code in codes if code != 0]
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


# -- consumer -----------------------------------------------------------------------------


# The subscription user data on the wire is the engine's bytes behind a short
# header carrying this member's request_rejoin() count. The broker starts a
# rebalance when a follower rejoins only if its subscription changed (a leader
# always triggers one), so request_rejoin() bumps the count to make sure the
# whole group rebalances, as Kafka Streams does with its "unique field".
_USER_DATA_MAGIC = b"\xffSL"


def _wrap_user_data(rejoin_count: int, user_data: bytes) -> bytes:
    return _USER_DATA_MAGIC + (rejoin_count & 0xFFFFFFFF).to_bytes(4, "big") + user_data


def _unwrap_user_data(wire: bytes | None) -> bytes:
    data = bytes(wire or b"")
    if data.startswith(_USER_DATA_MAGIC) and len(data) >= len(_USER_DATA_MAGIC) + 4:
        return data[len(_USER_DATA_MAGIC) + 4 :]
    return data  # a member that does not use this transport


class _AssignorAdapter(AbstractPartitionAssignor):
    """Adapts the engine's :class:`GroupAssignor` to aiokafka's assignor interface.

    aiokafka calls these through the objects in ``partition_assignment_strategy``
    (``assignor.name``, ``assignor.metadata(topics)``, ``assignor.assign(cluster,
    members)`` on the leader, ``assignor.on_assignment(assignment)``), so an
    instance with instance methods works although the base declares classmethods.
    """

    def __init__(self, assignor: GroupAssignor, owner: KafkaConsumer) -> None:
        self._assignor = assignor
        self._owner = owner

    @property
    def name(self) -> str:
        return self._assignor.name

    def metadata(self, topics: Any) -> ConsumerProtocolMemberMetadata:
        ordered = sorted(topics)
        try:
            user_data = self._assignor.subscription_user_data(ordered) or b""
        except Exception as exc:
            raise self._owner._callback_failed(exc, "subscription_user_data") from exc
        wire = _wrap_user_data(self._owner._rejoin_count, bytes(user_data))
        return ConsumerProtocolMemberMetadata(0, ordered, wire)

    def assign(
        self, cluster: Any, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        subscriptions = {
            member_id: MemberSubscription(
                member_id, tuple(meta.subscription), _unwrap_user_data(meta.user_data)
            )
            for member_id, meta in members.items()
        }
        partitions_per_topic: dict[str, int] = {}
        for topic in sorted({t for s in subscriptions.values() for t in s.topics}):
            partitions = cluster.partitions_for_topic(topic)
            if partitions:
                partitions_per_topic[topic] = len(partitions)
        try:
            result = self._assignor.assign(subscriptions, partitions_per_topic)
        except Exception as exc:
            raise self._owner._callback_failed(exc, "assign") from exc
        out: dict[str, ConsumerProtocolMemberAssignment] = {}
        for member_id in members:
            assignment = result.get(member_id) or MemberAssignment(())
            by_topic: dict[str, list[int]] = defaultdict(list)
            for tp in assignment.partitions:
                by_topic[tp[0]].append(tp[1])
            out[member_id] = ConsumerProtocolMemberAssignment(
                0,
                [(topic, sorted(parts)) for topic, parts in sorted(by_topic.items())],
                bytes(assignment.user_data or b""),
            )
        return out

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        # Called right after aiokafka installed the new assignment and before
        # the listener's on_partitions_assigned: close the poll gate now.
        self._owner._assignment_started()
        ours = MemberAssignment(
            tuple(TopicPartition(topic, p) for topic, parts in assignment.assignment for p in parts),
            bytes(assignment.user_data or b""),
        )
        try:
            self._assignor.on_assignment(ours)
        except Exception as exc:
            self._owner._assignment_finished()
            raise self._owner._callback_failed(exc, "on_assignment") from exc


class _ListenerAdapter(ConsumerRebalanceListener):
    """Adapts the engine's :class:`RebalanceListener` (engine ``TopicPartition`` sets)."""

    def __init__(self, listener: RebalanceListener | None, owner: KafkaConsumer) -> None:
        self._listener = listener
        self._owner = owner

    async def on_partitions_revoked(self, revoked: Any) -> None:
        if self._listener is None:
            return
        try:
            await self._listener.on_partitions_revoked(_our_tps(revoked))
        except Exception as exc:
            self._owner._callback_failed(exc, "on_partitions_revoked")

    async def on_partitions_assigned(self, assigned: Any) -> None:
        try:
            if self._listener is not None:
                await self._listener.on_partitions_assigned(_our_tps(assigned))
        except Exception as exc:
            self._owner._callback_failed(exc, "on_partitions_assigned")
        finally:
            self._owner._assignment_finished()


class KafkaConsumer:
    """A group consumer (``settings`` given) or a groupless reader (``settings`` None)."""

    def __init__(
        self,
        bootstrap_servers: str,
        common: Mapping[str, object],
        settings: ConsumerSettings | None,
        client_id: str,
        read_committed: bool = False,
        security: Sequence[tuple[str, Mapping[str, object]]] = (),
    ) -> None:
        self._read_committed = read_committed
        self._security = tuple(security)
        self._bootstrap = bootstrap_servers
        self._common = dict(common)
        self._settings = settings
        self._client_id = client_id
        self._consumer: AIOKafkaConsumer | None = None
        self._closed = False
        self._subscription: tuple[list[str], _ListenerAdapter] | None = None
        self._manual: list[AioTopicPartition] | None = None
        self._callback_error: BaseException | None = None
        self._gate: asyncio.Future[None] | None = None
        self._rejoin_count = 0
        # Validate pass-through options early (at construction, not at start).
        self._kwargs = self._build_kwargs()

    @property
    def options(self) -> Mapping[str, object]:
        """The keyword arguments the aiokafka consumer is made with (secrets included: never log them)."""
        return dict(self._kwargs)

    def _build_kwargs(self) -> dict[str, object]:
        s = self._settings
        kwargs: dict[str, object] = {
            "bootstrap_servers": self._bootstrap,
            "client_id": self._client_id,
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest" if s is None else s.auto_offset_reset,
        }
        if s is None and self._read_committed:
            kwargs["isolation_level"] = "read_committed"
        if s is not None:
            kwargs.update(
                group_id=s.group_id,
                group_instance_id=s.group_instance_id,
                max_poll_interval_ms=s.max_poll_interval_ms,
                # As in the Java client: the broker waits up to max.poll.interval.ms
                # for members to rejoin (aiokafka's default is the session timeout).
                rebalance_timeout_ms=s.max_poll_interval_ms,
                session_timeout_ms=s.session_timeout_ms,
                heartbeat_interval_ms=s.heartbeat_interval_ms,
                request_timeout_ms=s.request_timeout_ms,
                retry_backoff_ms=s.retry_backoff_ms,
                fetch_max_bytes=s.fetch_max_bytes,
                max_partition_fetch_bytes=s.max_partition_fetch_bytes,
                isolation_level=s.isolation_level,
            )
        layers = self._security if s is None else (*self._security, ("consumer.", s.extra))
        kwargs.update(security_options(*layers))
        kwargs.update(_client_kwargs(AIOKafkaConsumer, self._common))
        if s is not None:
            kwargs.update(_client_kwargs(AIOKafkaConsumer, s.extra))
        return kwargs

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        if self._consumer is not None:
            raise IllegalStateError("the consumer is already started")
        if self._closed:
            raise IllegalStateError("the consumer is closed")
        kwargs = dict(self._kwargs)
        if self._settings is not None:
            kwargs["partition_assignment_strategy"] = (
                _AssignorAdapter(self._settings.assignor, self),
            )
        consumer = AIOKafkaConsumer(**kwargs)
        await _start_or_clean_up(consumer.start, consumer.stop, "starting the consumer", kwargs)
        self._consumer = consumer
        # Applied after start so that start() does not wait for the first
        # rebalance (aiokafka's start() would when subscribed before it).
        if self._subscription is not None:
            topics, listener = self._subscription
            consumer.subscribe(topics=topics, listener=listener)
        elif self._manual is not None:
            consumer.assign(self._manual)

    async def close(self, leave_group: bool = True) -> None:
        """Stop; with ``leave_group`` the member leaves at once (a static member too)."""
        if self._closed:
            return
        self._closed = True
        consumer, self._consumer = self._consumer, None
        try:
            if consumer is None:
                return
            coordinator = consumer._coordinator
            instance_id = None if self._settings is None else self._settings.group_instance_id
            if coordinator is not None and hasattr(coordinator, "_maybe_leave_group"):
                # aiokafka's close() sends LeaveGroup for a dynamic member and
                # never for a static one. Replacing its leave step for this
                # instance makes both follow ``leave_group``.
                if not leave_group:

                    async def _stay_in_group() -> None:
                        return None

                    coordinator._maybe_leave_group = _stay_in_group
                elif instance_id is not None:

                    async def _leave_static() -> None:
                        await _leave_group_as_static_member(coordinator, instance_id)

                    coordinator._maybe_leave_group = _leave_static
            await consumer.stop()
        finally:
            self._assignment_finished()

    def _require(self) -> AIOKafkaConsumer:
        consumer = self._consumer
        if consumer is None:
            raise IllegalStateError(
                "the consumer is closed" if self._closed else "the consumer is not started"
            )
        return consumer

    # -- subscription ----------------------------------------------------------------

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None:
        if self._settings is None:
            raise IllegalStateError("a reader has no group: use assign()")
        if self._manual is not None:
            raise IllegalStateError("the consumer uses manual assignment")
        adapter = _ListenerAdapter(listener, self)
        self._subscription = (list(topics), adapter)
        if self._consumer is not None:
            self._consumer.subscribe(topics=list(topics), listener=adapter)

    def assign(self, partitions: Sequence[TopicPartition]) -> None:
        if self._subscription is not None:
            raise IllegalStateError("the consumer is subscribed to topics")
        self._manual = [_aio_tp(tp) for tp in partitions]
        if self._consumer is not None:
            self._consumer.assign(self._manual)

    def assignment(self) -> set[TopicPartition]:
        if self._consumer is None:
            return set()
        return _our_tps(self._consumer.assignment())

    @property
    def member_id(self) -> str | None:
        consumer = self._consumer
        if consumer is None or self._settings is None:
            return None
        member = getattr(consumer._coordinator, "member_id", None)
        return member or None

    def request_rejoin(self) -> None:
        # aiokafka has no public enforceRebalance(); the coordinator's
        # request_rejoin() (private API) wakes its coordination task, which
        # revokes and sends JoinGroup. The bumped count changes this member's
        # subscription metadata, so the broker rebalances the whole group even
        # when this member is not the leader.
        consumer = self._require()
        if self._settings is None:
            raise IllegalStateError("a reader has no group to rejoin")
        self._rejoin_count += 1
        consumer._coordinator.request_rejoin()

    # -- fetching --------------------------------------------------------------------

    async def poll(
        self, timeout_ms: int, max_records: int | None = None
    ) -> Mapping[TopicPartition, Sequence[ConsumerRecord]]:
        consumer = self._require()
        self._raise_callback_error()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        try:
            try:
                # getmany() waits for a pending assignment without a time limit.
                async with asyncio.timeout_at(deadline):
                    records = await consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
            except TimeoutError:
                records = {}
        except aioerrors.KafkaError as exc:
            self._raise_callback_error()
            raise _transport_error(exc, "poll") from exc
        gate = self._gate
        if records and gate is not None and not gate.done():
            # Records of a new assignment while the engine's on_partitions_assigned
            # is still running: put them back (seek to the first one of each
            # partition, so nothing is lost) and wait for the callback, at most
            # until the deadline.
            for tp, batch in records.items():
                if batch:
                    try:
                        consumer.seek(tp, batch[0].offset)
                    except aioerrors.IllegalStateError:
                        pass  # no longer assigned: nothing to put back
            records = {}
            remaining = deadline - loop.time()
            if remaining > 0:
                await asyncio.wait([gate], timeout=remaining)
        self._raise_callback_error()
        return records  # type: ignore[return-value]  # aiokafka's ConsumerRecord fits

    def pause(self, *partitions: TopicPartition) -> None:
        try:
            self._require().pause(*(_aio_tp(tp) for tp in partitions))
        except aioerrors.IllegalStateError as exc:
            raise IllegalStateError(str(exc)) from exc

    def take_fetched(self, partition: TopicPartition) -> Sequence[ConsumerRecord]:
        gate = self._gate
        if self._consumer is None or (gate is not None and not gate.done()):
            return []  # a new assignment's records wait for its callback (see ``poll``)
        return take_prefetched(self._consumer, _aio_tp(partition))

    def resume(self, *partitions: TopicPartition) -> None:
        try:
            self._require().resume(*(_aio_tp(tp) for tp in partitions))
        except aioerrors.IllegalStateError as exc:
            raise IllegalStateError(str(exc)) from exc

    def paused(self) -> set[TopicPartition]:
        if self._consumer is None:
            return set()
        return _our_tps(self._consumer.paused())

    def seek(self, partition: TopicPartition, offset: int) -> None:
        try:
            self._require().seek(_aio_tp(partition), offset)
        except aioerrors.IllegalStateError as exc:
            raise IllegalStateError(str(exc)) from exc

    async def position(self, partition: TopicPartition) -> int:
        consumer = self._require()
        try:
            return int(await consumer.position(_aio_tp(partition)))
        except aioerrors.IllegalStateError as exc:
            raise IllegalStateError(str(exc)) from exc
        except aioerrors.KafkaError as exc:
            raise _transport_error(exc, f"position of {partition}") from exc

    async def end_offsets(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        consumer = self._require()
        if not partitions:
            return {}
        try:
            offsets = await consumer.end_offsets([_aio_tp(tp) for tp in partitions])
        except aioerrors.KafkaError as exc:
            raise _transport_error(exc, "end_offsets") from exc
        return {TopicPartition(tp.topic, tp.partition): int(off) for tp, off in offsets.items()}

    def fetched_end(self, partition: TopicPartition) -> int | None:
        consumer = self._consumer
        if consumer is None:
            return None
        tp = _aio_tp(partition)
        try:
            end = consumer.last_stable_offset(tp) if self._read_committed else consumer.highwater(tp)
        except (AssertionError, aioerrors.IllegalStateError):
            return None  # not assigned
        return None if end is None else int(end)

    # -- commits ---------------------------------------------------------------------

    async def committed(self, partition: TopicPartition) -> OffsetAndMetadata | None:
        consumer = self._require()
        if self._settings is None:
            raise IllegalStateError("a reader has no group and no committed offsets")
        tp = _aio_tp(partition)
        try:
            # Consumer.committed() drops the metadata; the coordinator keeps it.
            found = await asyncio.wait_for(consumer._coordinator.fetch_committed_offsets([tp]),
                                           self._settings.request_timeout_ms / 1000)
        except (aioerrors.KafkaError, TimeoutError) as exc:
            raise _transport_error(exc, f"committed offset of {partition}") from exc
        entry = found.get(tp)
        if entry is None or entry.offset < 0:
            return None
        return OffsetAndMetadata(int(entry.offset), entry.metadata or "")

    async def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        consumer = self._require()
        if self._settings is None:
            raise IllegalStateError("a reader has no group to commit for")
        if not offsets:
            return
        payload = {
            _aio_tp(tp): AioOffsetAndMetadata(om.offset, om.metadata) for tp, om in offsets.items()
        }
        try:
            # aiokafka retries a commit with no deadline of its own (a stalled coordinator
            # hangs it for good); bound it like Java's commitSync is bounded by its API timeout.
            await asyncio.wait_for(consumer.commit(payload), self._settings.request_timeout_ms / 1000)
        except TimeoutError as exc:
            raise _transport_error(exc, "commit") from exc
        except (aioerrors.CommitFailedError, aioerrors.IllegalStateError) as exc:
            # CommitFailedError: the group rebalanced (UnknownMemberId,
            # IllegalGeneration, RebalanceInProgress). IllegalStateError: the
            # partitions are no longer (or not yet) assigned to this member.
            raise CommitFailedError(
                f"Commit of {sorted(str(tp) for tp in offsets)} failed: {_describe(exc)}"
            ) from exc
        except aioerrors.KafkaError as exc:
            raise _transport_error(exc, "commit") from exc

    # -- callbacks from the adapters ---------------------------------------------------

    def _callback_failed(self, exc: BaseException, where: str) -> aioerrors.KafkaError:
        log.error("Rebalance callback %s of consumer %s failed: %r", where, self._client_id, exc)
        if self._callback_error is None:
            self._callback_error = exc
        return aioerrors.KafkaError(f"{where} failed: {_describe(exc)}")

    def _raise_callback_error(self) -> None:
        exc = self._callback_error
        if exc is not None:
            self._callback_error = None
            raise exc

    def _assignment_started(self) -> None:
        if self._gate is None or self._gate.done():
            self._gate = asyncio.get_running_loop().create_future()

    def _assignment_finished(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None and not gate.done():
            gate.set_result(None)


# -- producer ---------------------------------------------------------------------------


_NO_HEADERS: list[tuple[str, bytes]] = []  # shared; the batch builder only reads it


class _PublicAppend:
    """``append`` through aiokafka's public ``BatchBuilder.append`` (slower fallback)."""

    __slots__ = ("_batch",)

    def __init__(self, batch: Any) -> None:
        self._batch = batch

    def append(
        self, offset: int, timestamp: int | None, key: Any, value: Any, headers: list[Any]
    ) -> Any:
        return self._batch.append(timestamp=timestamp, key=key, value=value, headers=headers)


class _Slot:
    """One aiokafka ``BatchBuilder`` being filled for one partition.

    The fast path writes into the builder's record-batch builder (a Cython
    object) directly and sets the builder's record count once, at hand-over:
    it skips ``BatchBuilder.append``'s keyword call, serializer hooks and
    per-record bookkeeping (about 2.5x faster per record). Both attributes are
    private to aiokafka; :meth:`can_write_directly` checks they are there, and
    the public ``append`` is used otherwise.
    """

    __slots__ = ("batch", "count", "fast", "raw")

    def __init__(self, batch: Any, fast: bool) -> None:
        self.batch = batch
        self.fast = fast
        self.raw = batch._builder if fast else _PublicAppend(batch)
        self.count = 0

    @staticmethod
    def can_write_directly(batch: Any) -> bool:
        return (
            getattr(batch, "_relative_offset", None) == 0
            and callable(getattr(getattr(batch, "_builder", None), "append", None))
        )

    def seal(self) -> Any:
        """Close the builder for the hand-over and return it."""
        batch = self.batch
        if self.fast:
            batch._relative_offset = self.count
        batch.close()
        return batch


class KafkaProducer:
    """Buffers records in one aiokafka batch per partition; see :meth:`append`.

    ``append`` writes straight into an aiokafka ``BatchBuilder`` (no future per
    record). ``send_buffered`` closes the builders and hands them to the sender
    (full ones first, in order), so lingering is the engine's business: a batch
    holds what was appended between two ``send_buffered`` calls, up to
    ``batch_size`` bytes. ``delivery_timeout_ms`` has no aiokafka equivalent:
    a batch expires ``request_timeout_ms`` after it was handed over.

    A failed delivery makes the producer *failed*: every later ``send_buffered``
    and ``flush`` raises ``ProduceError`` for that first failure (so nothing
    after it is taken as delivered). Close it and make a new one.
    """

    def __init__(
        self, bootstrap_servers: str, common: Mapping[str, object], settings: ProducerSettings,
        security: Sequence[tuple[str, Mapping[str, object]]] = (),
    ) -> None:
        self._settings = settings
        acks: object = settings.acks
        if isinstance(acks, str) and acks.strip().lstrip("-").isdigit():
            acks = int(acks)
        compression = settings.compression_type
        if compression is not None and compression.lower() == "none":
            compression = None
        kwargs: dict[str, object] = {
            "bootstrap_servers": bootstrap_servers,
            "client_id": settings.client_id,
            "acks": acks,
            "linger_ms": settings.linger_ms,
            "max_batch_size": settings.batch_size,
            "request_timeout_ms": settings.request_timeout_ms,
            "retry_backoff_ms": settings.retry_backoff_ms,
            "compression_type": compression,
        }
        if settings.transactional_id is not None:
            kwargs["transactional_id"] = settings.transactional_id
            kwargs["transaction_timeout_ms"] = settings.transaction_timeout_ms
        kwargs.update(security_options(*security, ("producer.", settings.extra)))
        kwargs.update(_client_kwargs(AIOKafkaProducer, common))
        kwargs.update(_client_kwargs(AIOKafkaProducer, settings.extra))
        self._kwargs = kwargs
        self._transactional = settings.transactional_id is not None
        self._producer: AIOKafkaProducer | None = None
        self._closed = False
        # Open builder per (topic, partition); full builders wait in _ready.
        self._open: dict[tuple[str, int], _Slot] = {}
        self._ready: list[tuple[str, int, _Slot]] = []
        self._pending: dict[asyncio.Future[Any], tuple[str, int]] = {}
        self._failure: tuple[str, int, BaseException] | None = None
        self._handoff = asyncio.Lock()
        self._fast = False

    @property
    def options(self) -> Mapping[str, object]:
        """The keyword arguments the aiokafka producer is made with (secrets included: never log them)."""
        return dict(self._kwargs)

    async def start(self) -> None:
        if self._producer is not None:
            raise IllegalStateError("the producer is already started")
        if self._closed:
            raise IllegalStateError("the producer is closed")
        producer = AIOKafkaProducer(**self._kwargs)
        await _start_or_clean_up(producer.start, producer.stop, "starting the producer", self._kwargs)
        if self._closed:
            # Closed while it was starting (a task closed during its start-up): nothing would
            # close this one later.
            await producer.stop()
            raise IllegalStateError("the producer was closed while it started")
        self._producer = producer
        self._fast = _Slot.can_write_directly(producer.create_batch())

    def append(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int | None,
        headers: Headers,
    ) -> None:
        slot = self._open.get((topic, partition))
        if slot is None:
            slot = self._new_slot(topic, partition)
        if not headers:
            headers = _NO_HEADERS
        elif type(headers) is not list:  # the batch builder takes a list only
            headers = list(headers)
        if slot.raw.append(slot.count, timestamp_ms, key, value, headers) is None:
            # Full: keep it for the next hand-over and start another one. An
            # empty builder takes any first record, even one over batch_size.
            self._ready.append((topic, partition, slot))
            slot = self._new_slot(topic, partition)
            slot.raw.append(0, timestamp_ms, key, value, headers)
        slot.count += 1

    def _new_slot(self, topic: str, partition: int) -> _Slot:
        producer = self._producer
        if producer is None:
            raise IllegalStateError(
                "the producer is closed" if self._closed else "the producer is not started"
            )
        slot = _Slot(producer.create_batch(), self._fast)
        self._open[(topic, partition)] = slot
        return slot

    def buffered(self) -> int:
        # Counted on demand: one counter less to bump per appended record.
        return sum(slot.count for slot in self._open.values()) + sum(
            slot.count for _, _, slot in self._ready
        )

    async def send_buffered(self) -> None:
        self._raise_failure()
        if not self._open and not self._ready:
            if self._handoff.locked():
                # Another hand-over is under way (a task's chunk, its batches out of the buffer but
                # not yet in _pending): a flush must wait for it, or a commit would cover records
                # whose output was never handed over (and may yet fail, e.g. an unknown topic).
                async with self._handoff:
                    pass
                self._raise_failure()
            return
        producer = self._producer
        if producer is None:
            raise IllegalStateError("the producer is not started")
        async with self._handoff:  # keeps hand-overs (and so partition order) sequential
            if self._transactional and not producer._txn_manager.is_in_transaction():
                await self._begin(producer)
            batches = self._ready
            batches.extend((tp[0], tp[1], slot) for tp, slot in self._open.items())
            self._ready = []
            self._open = {}
            for i, (topic, partition, slot) in enumerate(batches):
                builder = slot.seal()
                try:
                    # Waits only while an earlier batch of this partition is still
                    # queued (aiokafka keeps at most one queued batch per partition).
                    future = await producer.send_batch(builder, topic, partition=partition)
                except BaseException as exc:
                    # e.g. UnknownTopicOrPartitionError after request_timeout_ms
                    # for a topic that does not exist, or a cancellation. The
                    # rest is dropped, so the producer is failed from here on
                    # (a later flush must not report these records delivered).
                    self._fail(topic, partition, exc)
                    dropped = sum(slot.count for _, _, slot in batches[i:])
                    log.error(
                        "Producer %s failed on %s-%s; %d records not sent: %s",
                        self._settings.client_id,
                        topic,
                        partition,
                        dropped,
                        _describe(exc),
                    )
                    if not isinstance(exc, Exception):
                        raise
                    self._raise_failure()
                self._pending[future] = (topic, partition)
                future.add_done_callback(self._on_delivered)

    def _on_delivered(self, future: asyncio.Future[Any]) -> None:
        where = self._pending.pop(future, None)
        if future.cancelled():
            exc: BaseException | None = asyncio.CancelledError("delivery cancelled")
        else:
            exc = future.exception()  # also marks it retrieved
        if exc is not None and where is not None:
            self._fail(where[0], where[1], exc)

    def _fail(self, topic: str, partition: int, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = (topic, partition, exc)

    def _raise_failure(self) -> None:
        if self._failure is not None:
            topic, partition, cause = self._failure
            if self._transactional and isinstance(cause, _FENCED_ERRORS):
                raise ProducerFencedError(f"Producing to {topic}-{partition} failed: producer "
                                          f"{self._settings.transactional_id} was fenced") from cause
            error = ProduceError(topic, partition, _describe(cause))
            error.retriable = is_retriable(cause)
            raise error from cause

    async def flush(self) -> None:
        await self.send_buffered()
        while self._pending:
            await asyncio.wait(list(self._pending))
            for future in [f for f in self._pending if f.done()]:
                self._on_delivered(future)
        self._raise_failure()

    # -- transactions (exactly-once) ---------------------------------------------------
    #
    # aiokafka 0.14 sends TxnOffsetCommit v0: no generation id, no member id (KIP-447's
    # group fencing is missing). Zombies are therefore fenced by the transactional.id
    # alone; see engine.transactions for the id scheme that makes that enough.

    @property
    def in_transaction(self) -> bool:
        producer = self._producer
        return producer is not None and self._transactional and producer._txn_manager.is_in_transaction()

    async def _begin(self, producer: AIOKafkaProducer) -> None:
        try:
            await asyncio.wait_for(producer.begin_transaction(), self._settings.request_timeout_ms / 1000)
        except Exception as exc:
            raise self._transaction_error(exc, "beginning a transaction") from exc

    async def commit_transaction(self, offsets: Mapping[TopicPartition, OffsetAndMetadata], group_id: str) -> None:
        producer = self._producer
        if producer is None or not self._transactional:
            raise IllegalStateError("the producer is not a started transactional producer")
        timeout = self._settings.request_timeout_ms / 1000
        try:
            # A transactional producer's batches never expire while its coordinator is away (the
            # sender waits for AddPartitionsToTxn first): without a deadline this waits for good.
            await asyncio.wait_for(self.flush(), timeout)
        except TimeoutError as exc:
            raise self._transaction_error(exc, "flushing the transaction's records") from exc
        if not offsets and not self.in_transaction:
            return
        try:
            if not self.in_transaction:
                await self._begin(producer)
            if offsets:
                payload = {_aio_tp(tp): AioOffsetAndMetadata(om.offset, om.metadata) for tp, om in offsets.items()}
                await asyncio.wait_for(producer.send_offsets_to_transaction(payload, group_id), timeout)
            # aiokafka waits for the transaction's end without a deadline of its own.
            await asyncio.wait_for(producer.commit_transaction(), timeout)
        except (ProducerFencedError, TransportError):
            raise
        except Exception as exc:
            raise self._transaction_error(exc, "committing the transaction") from exc

    async def abort_transaction(self) -> None:
        producer = self._producer
        self._open = {}
        self._ready = []
        if producer is None or not self._transactional:
            return
        manager = producer._txn_manager
        if not manager.is_in_transaction() and manager.state.name != "ABORTABLE_ERROR":
            return  # nothing open, or fenced/failed for good: closing is all that is left
        timeout = self._settings.request_timeout_ms / 1000
        if self._pending:
            # aiokafka sends EndTxn without waiting for batches in flight: let them land first, so
            # the abort marker follows every record of the transaction.
            await asyncio.wait(list(self._pending), timeout=timeout)
        try:
            await asyncio.wait_for(producer.abort_transaction(), timeout)
        except Exception as exc:
            raise self._transaction_error(exc, "aborting the transaction") from exc

    def _transaction_error(self, exc: BaseException, what: str) -> TransportError:
        cause: BaseException | None = exc
        while cause is not None:
            if isinstance(cause, _FENCED_ERRORS):
                return ProducerFencedError(
                    f"{what} failed: producer {self._settings.transactional_id} was fenced: {_describe(cause)}")
            cause = cause.__cause__
        if isinstance(exc, ProduceError):
            return exc
        return _transport_error(exc, what)

    async def close(self) -> None:
        """Drop what was not handed over; wait for what was (aiokafka's ``stop``)."""
        if self._closed:
            return
        self._closed = True
        producer, self._producer = self._producer, None
        self._open = {}
        self._ready = []
        if producer is not None:
            try:
                await producer.stop()
            finally:
                if self._transactional:
                    # A fenced or failed transaction leaves its waiter failed and unawaited; asyncio
                    # would log "Future exception was never retrieved" when it is collected.
                    waiter = getattr(producer._txn_manager, "_transaction_waiter", None)
                    if waiter is not None and waiter.done() and not waiter.cancelled():
                        waiter.exception()


# -- admin ------------------------------------------------------------------------------


class KafkaAdmin:
    def __init__(
        self, bootstrap_servers: str, common: Mapping[str, object], client_id: str,
        security: Sequence[tuple[str, Mapping[str, object]]] = (),
    ) -> None:
        kwargs: dict[str, object] = {"bootstrap_servers": bootstrap_servers, "client_id": client_id}
        kwargs.update(security_options(*security))
        kwargs.update(_client_kwargs(AIOKafkaAdminClient, common))
        self._kwargs = kwargs
        self._timeout = float(kwargs.get("request_timeout_ms", 40_000)) / 1000  # type: ignore[arg-type]
        self._admin: AIOKafkaAdminClient | None = None

    @property
    def options(self) -> Mapping[str, object]:
        """The keyword arguments the aiokafka admin client is made with (secrets included: never log them)."""
        return dict(self._kwargs)

    async def start(self) -> None:
        if self._admin is not None:
            return
        admin = AIOKafkaAdminClient(**self._kwargs)
        await _start_or_clean_up(admin.start, admin.close, "starting the admin client", self._kwargs)
        self._admin = admin

    async def close(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            await admin.close()

    def _require(self) -> AIOKafkaAdminClient:
        if self._admin is None:
            raise IllegalStateError("the admin client is not started")
        return self._admin

    async def create_topics(
        self, partitions: Mapping[str, int], replication_factor: int = 1,
        configs: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        admin = self._require()
        if not partitions:
            return
        configs = configs or {}
        new = [NewTopic(name, int(count), int(replication_factor), topic_configs=dict(configs.get(name, {})))
               for name, count in partitions.items()]
        try:
            response = await admin.create_topics(new)
        except aioerrors.KafkaError as exc:
            raise _transport_error(exc, f"create_topics {sorted(partitions)}") from exc
        failures = []
        for entry in response.topic_errors:
            topic, code = entry[0], entry[1]
            if code not in (0, _TOPIC_ALREADY_EXISTS):
                message = entry[2] if len(entry) > 2 and entry[2] else ""
                failures.append(f"{topic}: {aioerrors.for_code(code).__name__} {message}".strip())
        if failures:
            raise TransportError(f"Creating topics failed: {'; '.join(failures)}")
        # The broker answers once the controller has the topics; wait until the
        # metadata shows them too, so that clients started next find them.
        await self._await_metadata(lambda counts: all(t in counts for t in partitions), partitions)

    async def delete_topics(self, topics: Sequence[str]) -> None:
        admin = self._require()
        if not topics:
            return
        try:
            response = await admin.delete_topics(list(topics))
        except aioerrors.KafkaError as exc:
            raise _transport_error(exc, f"delete_topics {sorted(topics)}") from exc
        failures = [
            f"{topic}: {aioerrors.for_code(code).__name__}"
            for topic, code, *_ in response.topic_error_codes
            if code not in (0, _UNKNOWN_TOPIC)
        ]
        if failures:
            raise TransportError(f"Deleting topics failed: {'; '.join(failures)}")
        await self._await_metadata(lambda counts: not any(t in counts for t in topics), topics)

    async def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        admin = self._require()
        wanted = set(topics)
        if not wanted:
            return {}
        try:
            # Metadata for all topics: a request naming topics may auto-create them.
            described = await admin.describe_topics()
        except aioerrors.KafkaError as exc:
            raise _transport_error(exc, "describing topics") from exc
        return {
            entry["topic"]: len(entry["partitions"])
            for entry in described
            if entry["topic"] in wanted and entry["error_code"] == 0 and entry["partitions"]
        }

    async def _await_metadata(
        self, done: Callable[[dict[str, int]], bool], topics: Any
    ) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        while True:
            counts = await self.partition_counts(list(topics))
            if done(counts):
                return
            if loop.time() >= deadline:
                raise TransportError(
                    f"Topics {sorted(topics)} did not reach the expected state in the metadata "
                    f"within {self._timeout:.0f} s"
                )
            await asyncio.sleep(0.05)


# -- transport --------------------------------------------------------------------------


class KafkaTransport:
    """Clients of one Kafka cluster.

    ``extra`` is passed to every aiokafka client (consumer, producer, admin),
    so it should hold only options all three take (``metadata_max_age_ms``,
    ``connections_max_idle_ms`` …). Keys may use Kafka's dotted names. Options of one
    client go in ``ConsumerSettings.extra`` / ``ProducerSettings.extra``.

    ``security`` holds Kafka's security keys (:mod:`engine.transport.security`):
    unprefixed ones reach every client, and ``consumer.``/``producer.``/``admin.`` ones
    override them for that kind of client (the reader is a consumer); security keys in
    ``extra`` count as unprefixed, and those in ``ConsumerSettings.extra`` /
    ``ProducerSettings.extra`` as prefixed. They are checked here: a value that cannot
    be used raises ``ConfigError`` naming the key.
    """

    name = "kafka"

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        extra: Mapping[str, object] | None = None,
        security: Mapping[str, object] | None = None,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.extra: dict[str, object] = dict(extra or {})
        given = {**self.extra, **(security or {})}
        every = {k: v for k, v in given.items() if is_security_key(k)}
        self._security: dict[str, tuple[tuple[str, Mapping[str, object]], ...]] = {}
        unused: dict[str, str] = {}
        for kind in CLIENT_KINDS:
            prefix = f"{kind}."
            own = {k[len(prefix):]: v for k, v in given.items()
                   if k.startswith(prefix) and is_security_key(k[len(prefix):])}
            layers = self._security[kind] = (("", every), (prefix, own))
            options = security_options(*layers)  # a bad value fails now, not at the first connect
            for key in unused_security_keys(*layers):
                unused.setdefault(key, str(options.get("security_protocol")))
        for key, protocol in unused.items():
            log.warning("Config '%s' is set but not used: the client's security.protocol is %s", key, protocol)

    def consumer(self, settings: ConsumerSettings) -> KafkaConsumer:
        return KafkaConsumer(self.bootstrap_servers, self.extra, settings, settings.client_id,
                             security=self._security["consumer"])

    def producer(self, settings: ProducerSettings) -> KafkaProducer:
        return KafkaProducer(self.bootstrap_servers, self.extra, settings, security=self._security["producer"])

    def admin(self, client_id: str) -> KafkaAdmin:
        return KafkaAdmin(self.bootstrap_servers, self.extra, client_id, security=self._security["admin"])

    def reader(self, client_id: str, read_committed: bool = False) -> KafkaConsumer:
        return KafkaConsumer(self.bootstrap_servers, self.extra, None, client_id, read_committed,
                             security=self._security["consumer"])

    def __repr__(self) -> str:
        return f"KafkaTransport({self.bootstrap_servers!r})"
