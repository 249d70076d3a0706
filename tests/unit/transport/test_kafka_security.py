"""Kafka security settings (``security.protocol``, ``sasl.*``, ``ssl.*``) reach every aiokafka client.

No broker: these tests read the options each client of the Kafka transport is made with.
"""

from __future__ import annotations

import logging
import re
import ssl
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiokafka import errors as aioerrors
from aiokafka.abc import AbstractTokenProvider

from streamloop import KafkaStreams, StreamsBuilder, StreamsConfig
from streamloop.errors import AuthenticationError, ConfigError
from streamloop.tasks.timeouts import is_timeout as task_is_timeout
from streamloop.transport import open_transport
from streamloop.transport.base import ConsumerSettings, MemberAssignment, MemberSubscription, ProducerSettings
from streamloop.transport.kafka import KafkaTransport, is_retriable
from tests.support.secure_broker import (
    CLIENT_KEY_PASSWORD,
    SERVER_KEY_PASSWORD,
    Certificates,
    make_certificates,
)

BOOTSTRAP = "127.0.0.1:9"
PLAIN_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
              'username="alice" password="alice-secret";')


class _Assignor:
    name = "test"

    def subscription_user_data(self, topics: Sequence[str]) -> bytes:
        return b""

    def assign(self, subscriptions: Mapping[str, MemberSubscription],
               partitions_per_topic: Mapping[str, int]) -> dict[str, MemberAssignment]:
        return {}

    def on_assignment(self, assignment: MemberAssignment) -> None:
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


SCRAM_JAAS = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="bob" password="bob-secret";'
SASL_PLAIN = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.jaas.config": PLAIN_JAAS}
SECRETS = ("alice-secret", "alice_secret", "bob-secret", "client-key-secret")


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certificates"))


class _Tokens(AbstractTokenProvider):
    async def token(self) -> str:
        return "a-token"


# -- each key ------------------------------------------------------------------------------


def test_scram_credentials_come_from_the_scram_login_module() -> None:
    options = client_options(transport({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                                        "sasl.jaas.config": SCRAM_JAAS}))["producer"]

    assert options["security_protocol"] == "SASL_SSL"
    assert options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (options["sasl_plain_username"], options["sasl_plain_password"]) == ("bob", "bob-secret")
    assert isinstance(options["ssl_context"], ssl.SSLContext)


def test_jaas_values_may_be_unquoted_or_hold_escaped_quotes() -> None:
    jaas = 'org.apache.kafka.common.security.plain.PlainLoginModule required\n  username=alice\n  password="a\\"b";'
    options = client_options(transport({**SASL_PLAIN, "sasl.jaas.config": jaas}))["admin"]

    assert (options["sasl_plain_username"], options["sasl_plain_password"]) == ("alice", 'a"b')


@pytest.mark.parametrize("provider", [_Tokens(), _Tokens, f"{__name__}._Tokens"], ids=["instance", "class", "path"])
def test_oauthbearer_takes_its_token_from_the_login_callback_handler(provider: object) -> None:
    options = client_options(transport({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
                                        "sasl.login.callback.handler.class": provider}))["consumer"]

    assert options["sasl_mechanism"] == "OAUTHBEARER"
    assert isinstance(options["sasl_oauth_token_provider"], _Tokens)


def test_ssl_trusts_only_the_truststore_and_checks_the_hostname(certificates: Certificates) -> None:
    options = client_options(transport({"security.protocol": "SSL",
                                        "ssl.truststore.location": str(certificates.ca)}))["reader"]

    context = options["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert [_common_name(ca["subject"]) for ca in context.get_ca_certs()] == ["ca"]
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname is True


def test_an_empty_endpoint_identification_algorithm_skips_only_the_hostname_check(
        certificates: Certificates) -> None:
    options = client_options(transport({"security.protocol": "SSL", "ssl.truststore.location": str(certificates.ca),
                                        "ssl.endpoint.identification.algorithm": ""}))["admin"]

    context = options["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.check_hostname is False
    assert context.verify_mode == ssl.CERT_REQUIRED


def test_a_pem_keystore_with_its_key_password_is_loaded(certificates: Certificates) -> None:
    # A context with a client certificate completes a handshake with a server that requires one.
    options = client_options(transport({"security.protocol": "SSL", "ssl.truststore.location": str(certificates.ca),
                                        "ssl.keystore.location": str(certificates.client),
                                        "ssl.key.password": CLIENT_KEY_PASSWORD}))["producer"]
    context = options["ssl_context"]
    assert isinstance(context, ssl.SSLContext)

    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(certificates.ca))
    server.verify_mode = ssl.CERT_REQUIRED
    server.load_cert_chain(str(certificates.server), password=SERVER_KEY_PASSWORD)
    assert _handshake(context, server) == "streamloop-client"


def _handshake(client: ssl.SSLContext, server: ssl.SSLContext) -> str:
    """Run a TLS handshake in memory; return the common name of the client's certificate."""
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    from_server, from_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    client_end = client.wrap_bio(to_client, from_client, server_hostname="localhost")
    server_end = server.wrap_bio(to_server, from_server, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(20):
        for name, end in (("client", client_end), ("server", server_end)):
            if not done[name]:
                try:
                    end.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        to_server.write(from_client.read())
        to_client.write(from_server.read())
        if all(done.values()):
            break
    peer = server_end.getpeercert()
    assert peer, "the server saw no client certificate"
    return _common_name(peer["subject"])


def _common_name(subject: Any) -> str:
    return str(dict(entry[0] for entry in subject)["commonName"])


def test_protocol_and_endpoint_identification_names_are_read_in_any_case(certificates: Certificates) -> None:
    options = client_options(transport({"security.protocol": "ssl", "ssl.truststore.location": str(certificates.ca),
                                        "ssl.endpoint.identification.algorithm": "HTTPS"}))["consumer"]

    assert options["security_protocol"] == "SSL"
    context = options["ssl_context"]
    assert isinstance(context, ssl.SSLContext) and context.check_hostname is True


def test_without_security_keys_the_clients_keep_aiokafka_defaults() -> None:
    for kind, options in client_options(KafkaTransport(BOOTSTRAP)).items():
        assert not any(name.startswith(("security_", "sasl_", "ssl_")) for name in options), kind


def test_security_keys_in_the_transports_extra_reach_every_client() -> None:
    made = KafkaTransport(BOOTSTRAP, extra=SASL_PLAIN)

    assert {kind: o["sasl_plain_username"] for kind, o in client_options(made).items()} == dict.fromkeys(
        ("consumer", "producer", "admin", "reader"), "alice")


# -- per-client overrides ------------------------------------------------------------------


@pytest.mark.parametrize(("prefix", "overridden"), [("consumer.", {"consumer", "reader"}),
                                                    ("producer.", {"producer"}), ("admin.", {"admin"})])
def test_a_prefixed_key_overrides_the_unprefixed_one_for_that_client(prefix: str, overridden: set[str]) -> None:
    made = transport({**SASL_PLAIN, f"{prefix}sasl.mechanism": "SCRAM-SHA-256",
                      f"{prefix}sasl.jaas.config": SCRAM_JAAS})

    users = {kind: (o["sasl_mechanism"], o["sasl_plain_username"]) for kind, o in client_options(made).items()}
    assert users == {kind: ("SCRAM-SHA-256", "bob") if kind in overridden else ("PLAIN", "alice") for kind in users}


def test_a_prefixed_security_protocol_turns_security_off_for_that_client_only() -> None:
    made = transport({**SASL_PLAIN, "producer.security.protocol": "PLAINTEXT"})

    options = client_options(made)
    assert options["producer"]["security_protocol"] == "PLAINTEXT"
    assert "sasl_plain_password" not in options["producer"]
    assert options["consumer"]["security_protocol"] == "SASL_PLAINTEXT"


def test_security_keys_of_the_consumer_settings_override_the_transports() -> None:
    made = transport(SASL_PLAIN)
    extra = {"sasl.mechanism": "SCRAM-SHA-256", "sasl.jaas.config": SCRAM_JAAS}
    consumer = made.consumer(ConsumerSettings(group_id="g", client_id="c", assignor=_Assignor(), extra=extra))

    assert (consumer.options["sasl_mechanism"], consumer.options["sasl_plain_username"]) == ("SCRAM-SHA-256", "bob")


# -- values that cannot be used --------------------------------------------------------------


def _bad_settings(certificates: Certificates, tmp_path: Path) -> list[tuple[Mapping[str, object], str, str]]:
    """(settings, the key the ConfigError must name, a word its message must hold)."""
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello\n")
    ssl_ = {"security.protocol": "SSL", "ssl.truststore.location": str(certificates.ca)}
    keystore = {**ssl_, "ssl.keystore.location": str(certificates.client)}
    plain_module = "org.apache.kafka.common.security.plain.PlainLoginModule"
    return [
        ({"security.protocol": "TLS"}, "security.protocol", "one of"),
        ({"consumer.security.protocol": "TLS"}, "consumer.security.protocol", "one of"),
        ({"security.protocol": "SASL_SSL"}, "sasl.mechanism", "GSSAPI"),
        ({**SASL_PLAIN, "sasl.mechanism": "GSSAPI"}, "sasl.mechanism", "not supported"),
        ({**SASL_PLAIN, "admin.sasl.mechanism": "KERBEROS"}, "admin.sasl.mechanism", "one of"),
        ({**SASL_PLAIN, "sasl.jaas.config": None}, "sasl.jaas.config", "must be set"),
        ({**SASL_PLAIN, "sasl.jaas.config": 'username="alice" password="alice-secret"'}, "sasl.jaas.config",
         "cannot be parsed"),
        ({**SASL_PLAIN, "sasl.jaas.config": f'{plain_module} required username="alice" password="alice-secret'},
         "sasl.jaas.config", "cannot be parsed"),
        ({**SASL_PLAIN, "sasl.mechanism": "SCRAM-SHA-256"}, "sasl.jaas.config", "ScramLoginModule"),
        ({**SASL_PLAIN, "sasl.jaas.config": f'{plain_module} required username="alice";'}, "sasl.jaas.config",
         "no password"),
        ({**SASL_PLAIN, "sasl.jaas.config": f'{plain_module} optional username="a" password="alice-secret";'},
         "sasl.jaas.config", "'required'"),
        # A password where the control flag goes is not echoed.
        ({**SASL_PLAIN, "sasl.jaas.config": f'{plain_module} alice_secret username="a" password="b";'},
         "sasl.jaas.config", "not shown"),
        ({**SASL_PLAIN, "sasl.jaas.config": f'{plain_module} required username="a" password="alice-secret" '
                                            'serviceName="kafka";'}, "sasl.jaas.config", "serviceName"),
        ({**SASL_PLAIN, "producer.sasl.jaas.config": "alice-secret"}, "producer.sasl.jaas.config", "cannot be parsed"),
        ({**SASL_PLAIN, "sasl.jaas.config": "alice_secret required;"}, "sasl.jaas.config", "another login module"),
        ({**SASL_PLAIN, "sasl.jaas.config": 42}, "sasl.jaas.config", "not shown"),
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}, "sasl.login.callback.handler.class",
         "must be set"),
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
          "sasl.login.callback.handler.class": object()}, "sasl.login.callback.handler.class", "AbstractTokenProvider"),
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
          "sasl.login.callback.handler.class": "no_such_module.Tokens"}, "sasl.login.callback.handler.class",
         "cannot load"),
        ({"security.protocol": "SSL", "ssl.truststore.location": str(tmp_path / "missing.pem")},
         "ssl.truststore.location", "no such file"),
        ({"security.protocol": "SSL", "ssl.truststore.location": str(not_pem)}, "ssl.truststore.location", "PEM"),
        ({**ssl_, "ssl.truststore.type": "JKS"}, "ssl.truststore.type", "only PEM"),
        ({**ssl_, "ssl.keystore.type": "PKCS12"}, "ssl.keystore.type", "only PEM"),
        ({**ssl_, "ssl.keystore.location": str(certificates.ca)}, "ssl.keystore.location", "private key"),
        ({**ssl_, "ssl.keystore.location": str(tmp_path / "missing.pem")}, "ssl.keystore.location", "no such file"),
        (keystore, "ssl.key.password", "encrypted"),
        ({**keystore, "ssl.key.password": "wrong"}, "ssl.key.password", "does not decrypt"),
        ({**keystore, "consumer.ssl.key.password": "wrong", "ssl.key.password": CLIENT_KEY_PASSWORD},
         "consumer.ssl.key.password", "does not decrypt"),
        ({**ssl_, "ssl.endpoint.identification.algorithm": "LDAPS"}, "ssl.endpoint.identification.algorithm",
         "'https'"),
    ]


def test_each_value_that_cannot_be_used_is_a_config_error_naming_its_key(
        certificates: Certificates, tmp_path: Path) -> None:
    for settings, key, word in _bad_settings(certificates, tmp_path):
        with pytest.raises(ConfigError) as caught:
            transport(settings)
        assert caught.value.key == key, settings
        assert word in str(caught.value), (settings, str(caught.value))
        assert not any(secret in str(caught.value) for secret in SECRETS), str(caught.value)


def test_a_bad_security_value_fails_when_the_kafka_streams_client_is_created(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    builder.stream("in").to("out")
    missing = str(tmp_path / "ca.pem")

    with pytest.raises(ConfigError) as caught:
        KafkaStreams(builder.build(), {"application.id": "secure", "bootstrap.servers": BOOTSTRAP,
                                       "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                                       "sasl.jaas.config": PLAIN_JAAS, "ssl.truststore.location": missing})
    assert caught.value.key == "ssl.truststore.location"


@pytest.mark.parametrize(("key", "kafka_key"), [("ssl.cafile", "ssl.truststore.location"),
                                               ("consumer.ssl_cafile", "consumer.ssl.truststore.location"),
                                               ("sasl.plain.password", "sasl.jaas.config"),
                                               ("producer.ssl.certificate.location", "producer.ssl.keystore.location")])
def test_a_security_key_in_another_clients_spelling_is_a_config_error_naming_kafkas(key: str, kafka_key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        StreamsConfig({"application.id": "secure", "bootstrap.servers": BOOTSTRAP, key: "alice-secret"})

    assert caught.value.key == key
    assert kafka_key in str(caught.value)
    assert "alice-secret" not in str(caught.value)


def test_a_security_key_in_aiokafkas_spelling_that_aiokafka_lacks_points_to_the_kafka_keys() -> None:
    with pytest.raises(ConfigError, match=r"ssl.truststore.location") as caught:
        transport({}).consumer(ConsumerSettings(group_id="g", client_id="c", assignor=_Assignor(),
                                                extra={"ssl.cafile": "ca.pem"}))
    assert caught.value.key == "ssl.cafile"


# -- authentication failures are not timeouts ----------------------------------------------------


def test_an_authentication_error_is_not_a_timeout_to_retry() -> None:
    try:
        try:
            raise aioerrors.KafkaConnectionError("Unable to bootstrap")
        except aioerrors.KafkaConnectionError:
            raise AuthenticationError("PLAIN", "c", "refused") from aioerrors.SaslAuthenticationFailed("refused")
    except AuthenticationError as exc:
        error = exc

    assert "PLAIN" in str(error) and error.mechanism == "PLAIN"
    assert error.retriable is False
    assert not task_is_timeout(error)
    assert not is_retriable(error)


def test_an_authentication_error_raised_from_a_lost_connection_is_not_retried() -> None:
    """A TLS handshake the broker closed shows up as a connection error (retriable by itself):
    reported as an AuthenticationError, it ends the start-up at once instead of being retried."""
    try:
        try:
            raise aioerrors.KafkaConnectionError("Connection at 127.0.0.1:9093 closed")
        except aioerrors.KafkaConnectionError as lost:
            raise AuthenticationError("SSL", "c", "closed after the handshake") from lost
    except AuthenticationError as exc:
        error = exc

    assert not is_retriable(error)
    assert not task_is_timeout(error)


def test_sasl_and_ssl_keys_that_the_protocol_does_not_use_warn_without_their_values(
        certificates: Certificates, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="streamloop.transport.kafka"):
        transport({"sasl.mechanism": "PLAIN", "sasl.jaas.config": PLAIN_JAAS,
                   "producer.ssl.truststore.location": str(certificates.ca)})

    warned = sorted(re.findall(r"Config '([\w.]+)' is set but not used", caplog.text))
    assert warned == ["producer.ssl.truststore.location", "sasl.jaas.config", "sasl.mechanism"]
    assert "alice-secret" not in caplog.text


def test_keys_the_protocol_uses_do_not_warn(certificates: Certificates, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="streamloop.transport.kafka"):
        transport({**SASL_PLAIN, "security.protocol": "SASL_SSL", "ssl.truststore.location": str(certificates.ca)})

    assert "not used" not in caplog.text
