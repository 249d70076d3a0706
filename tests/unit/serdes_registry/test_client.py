"""The registry client: Confluent's REST calls over HTTP and mock://, cached so that a hit does no I/O."""

from __future__ import annotations

import socket
import threading
import urllib.request
from typing import Any

import anyio
import pytest

from streamloop.schema_registry import (
    IncompatibleSchemaError,
    RecordNameStrategy,
    RegistrySchema,
    RegistryUnreachableError,
    SchemaNotRegisteredError,
    SchemaReference,
    SchemaRegistryClient,
    SchemaRegistryError,
    TopicNameStrategy,
    TopicRecordNameStrategy,
    UnknownSchemaIdError,
)
from streamloop.schema_registry.memory import MemoryRegistry, RegistryHttpError
from tests.support.schema_registry import HttpSchemaRegistry

A = RegistrySchema('{"type":"string"}')
B = RegistrySchema('{"type":"long"}')
P = RegistrySchema("CgZhLnByb3Rv", "PROTOBUF")


@pytest.fixture(params=["mock", "http"])
def url(request: pytest.FixtureRequest, mock_url: str, http_registry: HttpSchemaRegistry) -> str:
    return mock_url if request.param == "mock" else http_registry.url


def test_ids_are_global_versions_per_subject_and_hits_ask_nothing(url: str) -> None:
    client = SchemaRegistryClient(url)
    a_id = client.register("s1", A)
    assert client.register("s2", A) == a_id  # one id per schema, whichever subject
    b_id = client.register("s1", B)
    assert b_id != a_id
    asked = client.requests
    for _ in range(3):
        assert client.register("s1", A) == a_id
        assert client.get_schema(b_id) == B
    assert client.requests == asked, "cache hits must not ask the registry"

    other = SchemaRegistryClient(url)  # a fresh cache: answers come from the registry
    assert other.get_schema(a_id) == A
    assert other.lookup("s1", B).version == 2
    assert other.get_version("s1").schema_id == b_id
    assert other.get_version("s1", 1).schema == A


def test_protobuf_schema_type_and_references_round_trip(url: str) -> None:
    client = SchemaRegistryClient(url)
    client.register("dep.proto", P)
    with_ref = RegistrySchema("CgZiLnByb3Rv", "PROTOBUF", (SchemaReference("dep.proto", "dep.proto", 1),))
    schema_id = client.register("main", with_ref)
    assert SchemaRegistryClient(url).get_schema(schema_id) == with_ref


def test_a_reference_to_nothing_registered_is_refused(client: SchemaRegistryClient) -> None:
    bad = RegistrySchema("x", "PROTOBUF", (SchemaReference("nope.proto", "nope.proto", 1),))
    with pytest.raises(SchemaRegistryError, match="not registered") as caught:
        client.register("main", bad)
    assert caught.value.error_code == 42201


def test_unknown_id_and_unregistered_schema_are_typed_errors(url: str) -> None:
    client = SchemaRegistryClient(url)
    with pytest.raises(UnknownSchemaIdError, match="Schema id 9999 is not known") as unknown:
        client.get_schema(9999)
    assert unknown.value.schema_id == 9999
    with pytest.raises(SchemaNotRegisteredError, match="auto_register_schemas") as missing_subject:
        client.lookup("never", A)
    assert missing_subject.value.error_code == 40401
    client.register("some", A)
    with pytest.raises(SchemaNotRegisteredError, match="subject 'some'") as missing_schema:
        client.lookup("some", B)
    assert missing_schema.value.error_code == 40403


def test_an_unreachable_registry_names_the_urls_and_what_to_set() -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = SchemaRegistryClient(f"http://127.0.0.1:{port}", request_timeout_s=2)
    with pytest.raises(RegistryUnreachableError, match=r"schema\.registry\.url") as caught:
        client.register("s", A)
    assert caught.value.urls == (f"http://127.0.0.1:{port}",)


def test_an_unreachable_registry_fails_at_once_for_the_backoff_then_is_asked_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """During an outage a serde on a stream thread must not wait out the request timeout on every
    record (a handler that skips failed records would block its loop, and its heartbeats)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = SchemaRegistryClient(f"http://127.0.0.1:{port}", request_timeout_s=2, unreachable_backoff_s=60)
    attempts: list[str] = []
    real_urlopen = urllib.request.urlopen

    def counting_urlopen(request: Any, timeout: float) -> Any:
        attempts.append(request.full_url)
        return real_urlopen(request, timeout=timeout)

    monkeypatch.setattr(urllib.request, "urlopen", counting_urlopen)
    with pytest.raises(RegistryUnreachableError) as first:
        client.get_schema(1)
    with pytest.raises(RegistryUnreachableError) as second:
        client.get_schema(2)
    assert len(attempts) == 1 and second.value is first.value
    client.unreachable_backoff_s = 0
    client._unreachable = (0.0, first.value)  # the backoff is over
    with pytest.raises(RegistryUnreachableError):
        client.get_schema(2)
    assert len(attempts) == 2


def test_the_next_url_is_tried_when_one_cannot_be_reached(http_registry: HttpSchemaRegistry) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    client = SchemaRegistryClient(f"{dead}, {http_registry.url}", request_timeout_s=2)
    assert client.register("fallback", A) == SchemaRegistryClient(http_registry.url).register("fallback", A)


def test_basic_auth_is_sent_and_a_refusal_says_what_to_check() -> None:
    with HttpSchemaRegistry(credentials="ann:secret") as registry:
        assert SchemaRegistryClient(registry.url, basic_auth_user_info="ann:secret").register("s", A) == 1
        with pytest.raises(SchemaRegistryError, match="basic_auth_user_info") as caught:
            SchemaRegistryClient(registry.url, basic_auth_user_info="ann:wrong").register("s", A)
        assert caught.value.status == 401


def test_an_incompatible_answer_is_a_typed_error(monkeypatch: pytest.MonkeyPatch, mock_url: str) -> None:
    client = SchemaRegistryClient(mock_url)

    def refuse(self: MemoryRegistry, subject: str, body: object) -> None:
        raise RegistryHttpError(409, 409, "Schema being registered is incompatible with an earlier schema")

    monkeypatch.setattr(MemoryRegistry, "_register", refuse)  # as a registry under BACKWARD compatibility
    with pytest.raises(IncompatibleSchemaError, match=r"subject 's'.*incompatible") as caught:
        client.register("s", A)
    assert caught.value.status == 409


@pytest.mark.parametrize("bad", ["", "ftp://x", "localhost:8081"])
def test_a_bad_url_is_refused_at_once(bad: str) -> None:
    with pytest.raises(ValueError, match="url"):
        SchemaRegistryClient(bad)


def test_the_async_calls_run_off_the_loop_with_the_callers_limiter(http_registry: HttpSchemaRegistry) -> None:
    client = SchemaRegistryClient(http_registry.url)
    asked_from: list[threading.Thread] = []
    call = client._call

    def recording(*args: Any) -> Any:
        asked_from.append(threading.current_thread())
        return call(*args)

    client._call = recording  # type: ignore[method-assign]

    async def main() -> threading.Thread:
        limiter = anyio.CapacityLimiter(1)
        schema_id = await client.aregister("async", A, limiter=limiter)
        assert SchemaRegistryClient(http_registry.url).get_schema(schema_id) == A
        assert (await client.alookup("async", A, limiter=limiter)).version == 1
        assert (await client.aget_schema(schema_id)) == A  # a hit: not asked
        return threading.current_thread()

    loop_thread = anyio.run(main)
    assert len(asked_from) == 2
    assert loop_thread not in asked_from


def test_strategies_name_subjects_as_confluents_do() -> None:
    assert TopicNameStrategy()("orders", False, "shop.Order") == "orders-value"
    assert TopicNameStrategy()("orders", True, None) == "orders-key"
    assert RecordNameStrategy()(None, False, "shop.Order") == "shop.Order"
    assert TopicRecordNameStrategy()("orders", True, "shop.Order") == "orders-shop.Order"
    with pytest.raises(ValueError, match="pass topic="):
        TopicNameStrategy()(None, False, "shop.Order")
    with pytest.raises(ValueError, match="no name"):
        RecordNameStrategy()("orders", False, None)
