"""Secrets in the config are never printed: repr, errors, logs, the console's view, metric labels."""

from __future__ import annotations

import logging

import pytest

from streamloop.client import KafkaStreams
from streamloop.config import HIDDEN, ConfigKey, StreamsConfig, _one_of, is_secret, shown
from streamloop.errors import ConfigError, MissingSourceTopicError
from streamloop.topology.builder import StreamsBuilder
from streamloop.transport.base import ConsumerSettings, ProducerSettings

SECRET = "hunter2-s3cr3t"
REQUIRED = {"application.id": "orders", "bootstrap.servers": "memory://"}

SECRET_KEYS = [
    "sasl.jaas.config", "ssl.key.password", "ssl.keystore.password", "ssl.truststore.password",
    "sasl.password", "sasl.oauthbearer.client.secret", "monitor.token",
    "consumer.sasl.jaas.config", "producer.ssl.key.password", "admin.sasl_plain_password",
    "spark.ssl.keyStorePassword", "consumer.sasl_oauth_token", "SASL.JAAS.CONFIG",
]
PLAIN_KEYS = ["sasl.mechanism", "ssl.keystore.location", "security.protocol", "application.id",
              "consumer.fetch.max.wait.ms", "token.count", "password.file.path"]


@pytest.mark.parametrize("key", SECRET_KEYS)
def test_keys_named_like_secrets_are_secret(key: str) -> None:
    assert is_secret(key)
    assert shown(key, SECRET) == HIDDEN


@pytest.mark.parametrize("key", PLAIN_KEYS)
def test_other_keys_are_shown(key: str) -> None:
    assert not is_secret(key)
    assert shown(key, "visible") == "visible"


def test_an_unset_secret_shows_that_it_is_unset() -> None:
    assert shown("monitor.token", None) is None


def test_repr_and_str_of_the_config_hide_secrets_and_show_the_rest() -> None:
    config = StreamsConfig({**REQUIRED, "monitor.token": SECRET, "consumer.sasl.jaas.config": SECRET,
                            "producer.ssl.key.password": SECRET, "spark.some.secret": SECRET})
    for text in (repr(config), str(config), f"{config}"):
        assert SECRET not in text
        assert f"'monitor.token': '{HIDDEN}'" in text
        assert f"'consumer.sasl.jaas.config': '{HIDDEN}'" in text
        assert "'application.id': 'orders'" in text
    assert config["consumer.sasl.jaas.config"] == SECRET  # the engine still reads the value


def test_a_wrongly_typed_secret_is_not_echoed_by_the_config_error() -> None:
    with pytest.raises(ConfigError, match=r"monitor.token") as caught:
        StreamsConfig({**REQUIRED, "monitor.token": 123456789})
    assert "123456789" not in str(caught.value)
    assert HIDDEN in str(caught.value)


def test_a_check_failing_on_a_secret_does_not_echo_it() -> None:
    """Secret keys added later may have checks that echo the value; the error still hides it."""
    key = ConfigKey("sasl.password", str, None, "a secret with a check", _one_of("a", "b"))
    with pytest.raises(ConfigError, match=r"sasl.password") as caught:
        StreamsConfig._check(key, SECRET)
    assert SECRET not in str(caught.value)
    plain = ConfigKey("sasl.mechanism", str, None, "not a secret", _one_of("a", "b"))
    with pytest.raises(ConfigError, match=SECRET):
        StreamsConfig._check(plain, SECRET)


def test_client_settings_do_not_print_their_pass_through_secrets() -> None:
    extra = {"sasl_plain_password": SECRET}
    assert SECRET not in repr(ConsumerSettings("g", "c", assignor=None, extra=extra))  # type: ignore[arg-type]
    assert SECRET not in repr(ProducerSettings("p", extra=extra))


def test_the_config_logged_at_start_hides_secrets(caplog: pytest.LogCaptureFixture, tmp_path) -> None:
    builder = StreamsBuilder()
    builder.stream("in").to("out")
    streams = KafkaStreams(builder.build(), {
        "application.id": "secrets", "bootstrap.servers": "memory://secrets-log", "state.dir": str(tmp_path),
        "num.stream.threads": 0, "monitor.token": SECRET, "consumer.sasl.jaas.config": SECRET})
    with caplog.at_level(logging.DEBUG, logger="streamloop"), \
            pytest.raises(MissingSourceTopicError):  # start() logs, then finds no topics
        streams.start()
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "StreamsConfig values" in logged
    assert f"consumer.sasl.jaas.config = {HIDDEN}" in logged
    assert SECRET not in logged


def test_the_console_config_view_hides_secrets() -> None:
    pytest.importorskip("aiomonitor")
    from streamloop.console.views import config_view

    builder = StreamsBuilder()
    builder.stream("in").to("out")
    streams = KafkaStreams(builder.build(), {**REQUIRED, "monitor.token": SECRET,
                                             "producer.sasl.jaas.config": SECRET})
    view = config_view(streams)
    assert SECRET not in view
    assert "monitor.token" in view and "producer.sasl.jaas.config" in view and HIDDEN in view
    assert "'orders'" in view
    filtered = config_view(streams, "jaas").splitlines()
    assert len(filtered) >= 2 and all("jaas" in line for line in filtered[1:])  # the header, then matches only


def test_the_console_metrics_view_hides_a_tag_named_like_a_secret() -> None:
    pytest.importorskip("aiomonitor")
    from streamloop.client import Metric
    from streamloop.console.views import metrics_view

    class Streams:
        def metrics(self) -> list[Metric]:
            return [Metric("client-metrics", "info", {"client-id": "c-1", "sasl.password": SECRET}, 1.0)]

    view = metrics_view(Streams())  # type: ignore[arg-type]
    assert SECRET not in view
    assert f"client-id=c-1,sasl.password={HIDDEN}" in view
