"""Registries for the serde tests: an in-process one per test (``mock://``) and one over HTTP."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from streamloop.schema_registry import SchemaRegistryClient
from streamloop.schema_registry.memory import MemoryRegistry
from tests.support.schema_registry import HttpSchemaRegistry


@pytest.fixture
def mock_url() -> Iterator[str]:
    scope = f"test-{uuid.uuid4().hex[:8]}"
    yield f"mock://{scope}"
    MemoryRegistry.reset(scope)


@pytest.fixture
def client(mock_url: str) -> SchemaRegistryClient:
    return SchemaRegistryClient(mock_url)


@pytest.fixture(scope="module")
def http_registry() -> Iterator[HttpSchemaRegistry]:
    with HttpSchemaRegistry() as registry:
        yield registry
