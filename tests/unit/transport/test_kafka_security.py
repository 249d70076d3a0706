"""Kafka security settings (``security.protocol``, ``sasl.*``, ``ssl.*``) reach every aiokafka client.

No broker: these tests read the options each client of the Kafka transport is made with.
"""

from __future__ import annotations

from collections.abc import Mapping

from engine.transport import open_transport
from engine.transport.base import ConsumerSettings, ProducerSettings
from engine.transport.kafka import KafkaTransport

BOOTSTRAP = "127.0.0.1:9"
PLAIN_JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="alice" password="alice-secret";'


class _Assignor:
    name = "test"

    def subscription_user_data(self, topics: object) -> bytes:
        return b""

    def assign(self, subscriptions: object, partitions_per_topic: object) -> dict[str, object]:
        return {}

    def on_assignment(self, assignment: object) -> None:
        return None


def transport(settings: Mapping[str, object]) -> KafkaTransport:
    made = open_transport({"bootstrap.servers": BOOTSTRAP, **settings})
    assert isinstance(made, KafkaTransport)
    return made


def client_options(made: KafkaTransport) -> dict[str, Mapping[str, object]]:
    """The aiokafka options of each kind of client the engine makes."""
    return {
        "consumer": made.consumer(ConsumerSettings(group_id="g", client_id="c", assignor=_Assignor())).options,
        "producer": made.producer(ProducerSettings(client_id="p")).options,
        "admin": made.admin("a").options,
        "reader": made.reader("r").options,
    }


def test_top_level_security_protocol_reaches_every_client() -> None:
    made = transport({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                      "sasl.jaas.config": PLAIN_JAAS})

    for kind, options in client_options(made).items():
        assert options.get("security_protocol") == "SASL_PLAINTEXT", kind
        assert options.get("sasl_mechanism") == "PLAIN", kind
        assert options.get("sasl_plain_username") == "alice", kind
        assert options.get("sasl_plain_password") == "alice-secret", kind
