"""``KafkaTransport``: the clients of one Kafka cluster, each with its security settings resolved."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from streamloop.transport.base import ConsumerSettings, ProducerSettings
from streamloop.transport.kafka.admin import KafkaAdmin
from streamloop.transport.kafka.consumer import KafkaConsumer
from streamloop.transport.kafka.producer import KafkaProducer
from streamloop.transport.kafka.security import CLIENT_KINDS, is_security_key, security_options, unused_security_keys

__all__ = ["KafkaTransport"]

log = logging.getLogger(__name__)


class KafkaTransport:
    """Clients of one Kafka cluster.

    ``extra`` is passed to every aiokafka client (consumer, producer, admin),
    so it should hold only options all three take (``metadata_max_age_ms``,
    ``connections_max_idle_ms`` …). Keys may use Kafka's dotted names. Options of one
    client go in ``ConsumerSettings.extra`` / ``ProducerSettings.extra``.

    ``security`` holds Kafka's security keys (:mod:`streamloop.transport.security`):
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
