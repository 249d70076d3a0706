"""``KafkaAdmin``: creating, deleting and describing topics over aiokafka's admin client.

Topic auto-creation
    aiokafka's own metadata requests (consumer and producer) allow broker-side
    auto-creation. :meth:`KafkaAdmin.partition_counts` never asks for a topic
    by name, so it cannot create one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio
from aiokafka import errors as aioerrors
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streamloop import redaction
from streamloop.errors import IllegalStateError, TransportError
from streamloop.transport.kafka.errors import error_name, transport_error
from streamloop.transport.kafka.options import client_kwargs
from streamloop.transport.kafka.security import client_secrets, security_options
from streamloop.transport.kafka.startup import start_or_clean_up

__all__ = ["KafkaAdmin"]

# Error codes of CreateTopics/DeleteTopics responses that are not failures here.
_TOPIC_ALREADY_EXISTS = aioerrors.TopicAlreadyExistsError.errno
_UNKNOWN_TOPIC = aioerrors.UnknownTopicOrPartitionError.errno


class KafkaAdmin:
    def __init__(
        self, bootstrap_servers: str, common: Mapping[str, object], client_id: str,
        security: Sequence[tuple[str, Mapping[str, object]]] = (),
    ) -> None:
        kwargs: dict[str, object] = {"bootstrap_servers": bootstrap_servers, "client_id": client_id}
        kwargs.update(security_options(*security))
        kwargs.update(client_kwargs(AIOKafkaAdminClient, common))
        self._kwargs = kwargs
        self._secrets = client_secrets(kwargs, *security)
        self._timeout = float(kwargs.get("request_timeout_ms", 40_000)) / 1000  # type: ignore[arg-type]  # an int option
        self._admin: Any = None  # AIOKafkaAdminClient once started

    @property
    def options(self) -> Mapping[str, object]:
        """The keyword arguments the aiokafka admin client is made with (secrets included: never log them)."""
        return dict(self._kwargs)

    async def start(self) -> None:
        if self._admin is not None:
            return
        # Before it connects: aiokafka logs the login's bytes at DEBUG.
        redaction.register(self, self._secrets)
        admin = AIOKafkaAdminClient(**self._kwargs)
        try:
            await start_or_clean_up(admin.start, admin.close, "starting the admin client", self._kwargs)
        except BaseException:
            redaction.unregister(self)
            raise
        self._admin = admin

    async def close(self) -> None:
        admin, self._admin = self._admin, None
        try:
            if admin is not None:
                await admin.close()
        finally:
            redaction.unregister(self)

    def _require(self) -> Any:
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
            raise transport_error(exc, f"create_topics {sorted(partitions)}") from exc
        failures = []
        for entry in response.topic_errors:
            topic, code = entry[0], entry[1]
            if code not in (0, _TOPIC_ALREADY_EXISTS):
                message = entry[2] if len(entry) > 2 and entry[2] else ""
                failures.append(f"{topic}: {error_name(code)} {message}".strip())
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
            raise transport_error(exc, f"delete_topics {sorted(topics)}") from exc
        failures = [
            f"{topic}: {error_name(code)}"
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
            raise transport_error(exc, "describing topics") from exc
        return {
            entry["topic"]: len(entry["partitions"])
            for entry in described
            if entry["topic"] in wanted and entry["error_code"] == 0 and entry["partitions"]
        }

    async def all_partition_counts(self) -> dict[str, int]:
        admin = self._require()
        try:
            described = await admin.describe_topics()
        except aioerrors.KafkaError as exc:
            raise transport_error(exc, "describing topics") from exc
        return {entry["topic"]: len(entry["partitions"]) for entry in described
                if entry["error_code"] == 0 and entry["partitions"] and not entry.get("is_internal")}

    async def _await_metadata(
        self, done: Callable[[dict[str, int]], bool], topics: Any
    ) -> None:
        deadline = anyio.current_time() + self._timeout
        while True:
            counts = await self.partition_counts(list(topics))
            if done(counts):
                return
            if anyio.current_time() >= deadline:
                raise TransportError(
                    f"Topics {sorted(topics)} did not reach the expected state in the metadata "
                    f"within {self._timeout:.0f} s"
                )
            await anyio.sleep(0.05)
