"""Pipelines over SASL_PLAINTEXT (PLAIN, SCRAM-SHA-256, OAUTHBEARER), SSL and SASL_SSL against a real broker,
and refused credentials failing at once with an ``AuthenticationError``.

One broker for the module (:class:`tests.support.secure_broker.SecureKafkaBroker`), with a
listener per security protocol.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.abc import AbstractTokenProvider

from streamloop import AuthenticationError, ClientState, KafkaStreams
from streamloop.handlers import StreamThreadExceptionResponse
from streamloop.serdes import IntegerSerde, JsonSerde, LongSerde, StringSerde
from streamloop.testing import eventually_async
from streamloop.transport import open_transport
from tests.support.apps import count_topology, doubling_topology, expected_doubling, streams_config
from tests.support.cluster import Cluster
from tests.support.secure_broker import (
    CLIENT_KEY_PASSWORD,
    PASSWORD,
    USER,
    SecureKafkaBroker,
    make_certificates,
    unsecured_token,
)

pytestmark = [pytest.mark.kafka, pytest.mark.asyncio]

INT, JSON, STRING, LONG = IntegerSerde(), JsonSerde(), StringSerde(), LongSerde()
DOCS = Path(__file__).resolve().parents[2] / "docs" / "security.md"
# A refused login must fail start() in far less than any timeout the engine would retry under.
FAST = 5.0

_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
            "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule"}


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafkaBroker]:
    broker = SecureKafkaBroker(make_certificates(tmp_path_factory.mktemp("kafka-certificates")))
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def jaas(mechanism: str, password: str = PASSWORD) -> str:
    return f'{_MODULES[mechanism]} required username="{USER}" password="{password}";'


def sasl(mechanism: str, password: str = PASSWORD) -> dict[str, object]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
            "sasl.jaas.config": jaas(mechanism, password)}


def mutual_tls(broker: SecureKafkaBroker) -> dict[str, object]:
    certificates = broker.certificates
    return {"security.protocol": "SSL", "ssl.truststore.location": str(certificates.ca),
            "ssl.keystore.location": str(certificates.client), "ssl.key.password": CLIENT_KEY_PASSWORD}


def secure_streams(topology: Any, bootstrap: str, app: str, security: dict[str, object],
                   **overrides: object) -> KafkaStreams:
    return KafkaStreams(topology, {**streams_config(bootstrap, app), **security, **overrides})


async def run_doubling(bootstrap: str, security: dict[str, object], names: Any) -> None:
    """Topics made, input written, the pipeline run and its output read: all over ``security``."""
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap, **security}), bootstrap)
    source, sink = names("input"), names("output")
    await cluster.create_topics({source: 2, sink: 2})
    records = [(i, {"n": i}) for i in range(40)]
    await cluster.produce(source, records, INT, JSON, partitions=2)
    expected = expected_doubling(records)
    async with secure_streams(doubling_topology(source, sink), bootstrap, names.app, security):
        output = await cluster.read(sink, len(expected))
    assert sorted((INT.deserialize(r.key), JSON.deserialize(r.value)) for r in output) == sorted(expected)


async def refused_at_start(bootstrap: str, security: dict[str, object],
                           names: Any) -> tuple[AuthenticationError, KafkaStreams]:
    """Start a client over ``security``: the start must fail within ``FAST`` s with an
    ``AuthenticationError``. The error and the client, which the caller closes after its checks."""
    streams = secure_streams(doubling_topology(names("input"), names("output")), bootstrap, names.app, security)
    started = time.monotonic()
    with pytest.raises(AuthenticationError) as caught:
        await streams.start_async()

    assert time.monotonic() - started < FAST
    return caught.value, streams


async def test_a_pipeline_runs_over_sasl_plain(secure_broker: SecureKafkaBroker, names: Any) -> None:
    await run_doubling(secure_broker.bootstrap_of("SASL_PLAINTEXT"), sasl("PLAIN"), names)


async def test_a_pipeline_runs_over_ssl_with_a_client_certificate(
        secure_broker: SecureKafkaBroker, names: Any) -> None:
    await run_doubling(secure_broker.bootstrap_of("SSL"), mutual_tls(secure_broker), names)


async def test_a_stateful_pipeline_runs_and_restores_its_store_over_sasl_scram(
        secure_broker: SecureKafkaBroker, names: Any) -> None:
    bootstrap, security = secure_broker.bootstrap_of("SASL_PLAINTEXT"), sasl("SCRAM-SHA-256")
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap, **security}), bootstrap)
    source, sink = names("words"), names("counts")
    await cluster.create_topics({source: 1, sink: 1})
    await cluster.produce(source, [("a", "x"), ("b", "x"), ("a", "x")], STRING, STRING, partitions=1)
    topology = count_topology(source, sink, persistent=False)
    async with secure_streams(topology, bootstrap, names.app, security, **{"cache.max.bytes.buffering": 0}):
        first = await cluster.read(sink, 3)
    assert [(STRING.deserialize(r.key), LONG.deserialize(r.value)) for r in first] == [("a", 1), ("b", 1), ("a", 2)]

    # The in-memory store is empty again: the restore consumer reads it back from the changelog.
    await cluster.produce(source, [("a", "x")], STRING, STRING, partitions=1)
    topology = count_topology(source, sink, persistent=False)
    async with secure_streams(topology, bootstrap, names.app, security, **{"cache.max.bytes.buffering": 0}):
        output = await cluster.read(sink, 4)
    assert (STRING.deserialize(output[3].key), LONG.deserialize(output[3].value)) == ("a", 3)


def documented_sasl_ssl_settings() -> dict[str, object]:
    """The SASL_SSL settings exactly as docs/security.md shows them."""
    block = re.search(r"^```python\n(SECURITY = \{.*?)^```", DOCS.read_text(), re.S | re.M)
    assert block is not None, "docs/security.md has no SECURITY = {...} sample"
    namespace: dict[str, Any] = {}
    exec(block.group(1), namespace)  # running the documented sample is the point
    return dict(namespace["SECURITY"])


async def test_a_pipeline_runs_with_the_documented_sasl_ssl_settings(
        secure_broker: SecureKafkaBroker, names: Any) -> None:
    settings = documented_sasl_ssl_settings()
    assert settings["security.protocol"] == "SASL_SSL"
    # Only the CA file's place differs: the test CA signed this broker's certificate.
    settings["ssl.truststore.location"] = str(secure_broker.certificates.ca)
    await run_doubling(secure_broker.bootstrap_of("SASL_SSL"), settings, names)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
async def test_a_wrong_password_fails_start_at_once_naming_the_mechanism(
        secure_broker: SecureKafkaBroker, names: Any, mechanism: str) -> None:
    error, streams = await refused_at_start(secure_broker.bootstrap_of("SASL_PLAINTEXT"),
                                            sasl(mechanism, "not-the-password"), names)
    assert error.mechanism == mechanism
    assert f"SASL {mechanism} login" in str(error)
    assert "not-the-password" not in str(error)
    assert streams.state is ClientState.CREATED
    streams.close()


async def test_a_broker_certificate_from_an_untrusted_ca_fails_start_at_once(
        secure_broker: SecureKafkaBroker, names: Any) -> None:
    security = {**mutual_tls(secure_broker), "ssl.truststore.location": str(secure_broker.certificates.other_ca)}
    error, streams = await refused_at_start(secure_broker.bootstrap_of("SSL"), security, names)
    assert error.mechanism == "SSL"
    assert "CERTIFICATE_VERIFY_FAILED" in str(error)
    streams.close()


async def test_a_consumer_with_a_wrong_password_fails_its_thread_at_once(
        secure_broker: SecureKafkaBroker, names: Any) -> None:
    # The admin clients log in; the stream thread's consumer (consumer.-prefixed key) is refused.
    bootstrap = secure_broker.bootstrap_of("SASL_PLAINTEXT")
    security = {**sasl("PLAIN"), "consumer.sasl.jaas.config": jaas("PLAIN", "not-the-password")}
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap, **sasl("PLAIN")}), bootstrap)
    source, sink = names("input"), names("output")
    await cluster.create_topics({source: 1, sink: 1})
    failures: list[BaseException] = []

    def record(exc: BaseException) -> StreamThreadExceptionResponse:
        failures.append(exc)
        return StreamThreadExceptionResponse.SHUTDOWN_CLIENT

    streams = secure_streams(doubling_topology(source, sink), bootstrap, names.app, security)
    streams.set_uncaught_exception_handler(record)
    started = time.monotonic()
    async with streams:
        await eventually_async(lambda: bool(failures), FAST, "the stream thread failed")
    assert time.monotonic() - started < FAST + 1
    chain = [failures[0], failures[0].__cause__, failures[0].__context__]
    refused = [exc for exc in chain if isinstance(exc, AuthenticationError)]
    assert refused and refused[0].mechanism == "PLAIN", chain
    assert "consumer" in refused[0].client_id


class UnsecuredTokens(AbstractTokenProvider):
    async def token(self) -> str:
        return unsecured_token()


async def test_a_pipeline_runs_over_sasl_oauthbearer(secure_broker: SecureKafkaBroker, names: Any) -> None:
    await run_doubling(secure_broker.bootstrap_of("SASL_PLAINTEXT"),
                       {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
                        "sasl.login.callback.handler.class": UnsecuredTokens}, names)


async def test_a_missing_client_certificate_fails_start_at_once(secure_broker: SecureKafkaBroker, names: Any) -> None:
    security = {"security.protocol": "SSL", "ssl.truststore.location": str(secure_broker.certificates.ca)}
    error, streams = await refused_at_start(secure_broker.bootstrap_of("SSL"), security, names)
    assert error.mechanism == "SSL"
    assert "ssl.keystore.location" in str(error)
    streams.close()
