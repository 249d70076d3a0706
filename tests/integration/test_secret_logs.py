"""No configured secret in any log line, the engine's or aiokafka's, at DEBUG: SASL/PLAIN and SSL
clients started with the right and with a wrong password, every record the process logs captured
and formatted (message, arguments, traceback) and searched for the secrets in every form.

aiokafka's ``aiokafka.conn`` logs every request it sends at DEBUG, the SASL/PLAIN authentication
bytes ``b'\\x00alice\\x00alice-secret'`` included: the case this file exists for.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from streamloop import AuthenticationError, ConfigError, KafkaStreams, redaction
from tests.integration.test_kafka_security import jaas, mutual_tls, run_doubling, sasl, secure_broker
from tests.support.apps import doubling_topology, streams_config
from tests.support.secure_broker import CLIENT_KEY_PASSWORD, PASSWORD, SecureKafkaBroker

pytestmark = [pytest.mark.kafka, pytest.mark.asyncio]

__all__ = ["secure_broker"]  # the module's broker fixture, shared

WRONG = "not-the-password-42"


class Everything(logging.Handler):
    """Every record of the process, formatted as an application's handler would print it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))
        self.lines.append(repr(record.args))  # what a structured handler would read


@pytest.fixture
def everything() -> Iterator[Everything]:
    root = logging.getLogger()
    handler, level = Everything(), root.level
    loggers = {name: logging.getLogger(name).level for name in ("aiokafka", "streamloop")}
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    for name in loggers:
        logging.getLogger(name).setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        for name, before in loggers.items():
            logging.getLogger(name).setLevel(before)


def assert_hidden(lines: list[str], *secrets: str) -> None:
    text = "\n".join(lines)
    assert "[hidden]" in text or lines, "nothing was logged"
    for secret in secrets:
        for form in redaction.forms(secret):
            assert form not in text, f"{form!r} was logged: " + next(line for line in lines if form in line)


async def test_sasl_plain_logins_log_no_password_at_debug(secure_broker: SecureKafkaBroker, names: Any,
                                                          everything: Everything) -> None:
    bootstrap = secure_broker.bootstrap_of("SASL_PLAINTEXT")
    await run_doubling(bootstrap, sasl("PLAIN"), names)
    refused = KafkaStreams(doubling_topology(names("input"), names("output")),
                           {**streams_config(bootstrap, names.app + "-refused"), **sasl("PLAIN", WRONG)})
    with pytest.raises(AuthenticationError):
        await refused.start_async()
    refused.close()
    assert any("aiokafka.conn" in line for line in everything.lines), "aiokafka's DEBUG log was not captured"
    assert_hidden(everything.lines, PASSWORD, WRONG, jaas("PLAIN"), jaas("PLAIN", WRONG))
    assert not redaction.registered()  # closed clients leave no factory behind


async def test_ssl_clients_log_no_key_password_at_debug(secure_broker: SecureKafkaBroker, names: Any,
                                                        everything: Everything) -> None:
    bootstrap = secure_broker.bootstrap_of("SSL")
    await run_doubling(bootstrap, mutual_tls(secure_broker), names)
    wrong = {**mutual_tls(secure_broker), "ssl.key.password": WRONG}
    # OpenSSL cannot decrypt the key: the client fails when it is made, naming the key.
    with pytest.raises(ConfigError, match=r"ssl\.key\.password"):
        KafkaStreams(doubling_topology(names("input"), names("output")),
                     {**streams_config(bootstrap, names.app + "-refused"), **wrong})
    assert_hidden(everything.lines, CLIENT_KEY_PASSWORD, WRONG)
