"""Optional extras: without one, what needs it raises MissingExtraError naming the package and the extra;
everything else works. ``make test`` installs every extra the tests use."""

from __future__ import annotations

import importlib
import re
import sys
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamloop import KafkaStreams, StreamsBuilder
from streamloop.errors import MissingExtraError
from streamloop.serdes import LongSerde, StringSerde
from streamloop.state import Materialized
from streamloop.testing import create_topics, eventually, produce, read
from streamloop.transport.memory import MemoryBroker
from tests.support.apps import streams_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("module", "hidden", "package", "extra"), [
    ("streamloop.prometheus", "prometheus_client", "prometheus-client", "prometheus"),
    ("streamloop.console.monitor", "aiomonitor", "aiomonitor", "monitor"),
    ("streamloop.web", "aiohttp", "aiohttp", "http"),
    ("streamloop.schema_registry.avro", "fastavro", "fastavro", "schema-registry"),
    ("streamloop.schema_registry.protobuf", "google.protobuf.message", "protobuf", "schema-registry"),
    ("streamloop.schema_registry.json_schema", "jsonschema", "jsonschema", "schema-registry"),
    ("streamloop.tasks.tracing", "opentelemetry", "opentelemetry-api", "otel"),
])
def test_a_missing_extra_is_a_typed_error_naming_the_package(
        monkeypatch: pytest.MonkeyPatch, module: str, hidden: str, package: str, extra: str) -> None:
    monkeypatch.setitem(sys.modules, hidden, None)  # import of it raises ImportError
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(MissingExtraError, match=rf"pip install 'streamloop\[{extra}\]'") as caught:
        importlib.import_module(module)
    assert caught.value.package == package
    assert isinstance(caught.value, ImportError)


def test_the_http_endpoint_serves_no_metrics_without_the_prometheus_extra(monkeypatch: pytest.MonkeyPatch,
                                                                          bootstrap: str) -> None:
    from streamloop.web import make_app

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.delitem(sys.modules, "streamloop.prometheus", raising=False)
    streams = KafkaStreams(counting().build(), streams_config(bootstrap, "no-metrics"))
    paths = {route.resource.canonical for route in make_app(streams).router.routes() if route.resource is not None}
    assert "/metrics" not in paths and "/health/live" in paths


@pytest.fixture
def without_rocksdict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rocksdict", None)  # import of it raises ImportError


@pytest.fixture
def bootstrap() -> Iterator[str]:
    name = f"extras-{uuid.uuid4().hex[:8]}"
    create_topics(f"memory://{name}", {"views": 1, "counts": 1})
    yield f"memory://{name}"
    MemoryBroker.reset(name)


def counting(materialized: Materialized | None = None) -> StreamsBuilder:
    builder = StreamsBuilder()
    (builder.stream("views", key_serde=StringSerde(), value_serde=StringSerde())
            .group_by_key()
            .count(materialized=materialized or Materialized.as_("views-per-user"))
            .to_stream()
            .to("counts", key_serde=StringSerde(), value_serde=LongSerde()))
    return builder


@pytest.mark.usefixtures("without_rocksdict")
@pytest.mark.parametrize("settings", [{}, {"default.dsl.store": "in_memory"}], ids=["default", "in_memory"])
def test_a_persistent_store_without_rocksdict_says_what_to_install(bootstrap: str, settings: dict) -> None:
    materialized = Materialized("views-per-user", persistent=True) if settings else None

    with pytest.raises(MissingExtraError, match=r"pip install 'streamloop\[rocksdb\]'") as caught:
        KafkaStreams(counting(materialized).build(), streams_config(bootstrap, "extras", **settings))

    assert caught.value.package == "rocksdict"
    assert "'views-per-user'" in str(caught.value)
    assert "in_memory" in str(caught.value)


@pytest.mark.usefixtures("without_rocksdict")
def test_in_memory_stores_work_without_rocksdict(bootstrap: str, tmp_path: Path) -> None:
    streams = KafkaStreams(counting().build(), streams_config(bootstrap, "extras", default_dsl_store="in_memory",
                                                              state_dir=str(tmp_path)))
    streams.start()
    try:
        produce(bootstrap, "views", [("ann", "home"), ("bob", "home"), ("ann", "cart")], StringSerde(), StringSerde())
        last = lambda: {r.key: r.value for r in read(bootstrap, "counts", StringSerde(), LongSerde())}  # noqa: E731
        eventually(lambda: last() == {"ann": 2, "bob": 1}, timeout=15, what="the counts")
    finally:
        streams.close(timeout=15)


def test_rocksdict_prometheus_and_aiomonitor_are_separate_extras() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    required = " ".join(project["dependencies"])
    extras = project["optional-dependencies"]

    assert "rocksdict" not in required
    assert [d for d in extras["rocksdb"] if d.startswith("rocksdict")]
    assert [d for d in extras["prometheus"] if d.startswith("prometheus-client")]
    assert [d for d in extras["monitor"] if d.startswith("aiomonitor")]
    assert not [d for d in extras["monitor"] if d.startswith("prometheus")]


def test_make_test_installs_every_extra_but_the_benchmark_peers() -> None:
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    installed = re.search(r"pip install --quiet -e '\.\[([a-z,-]+)\]'", (ROOT / "Makefile").read_text())

    assert installed is not None
    assert set(installed.group(1).split(",")) == extras - {"bench"}
