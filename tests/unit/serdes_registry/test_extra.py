"""The serdes' packages are an extra: without them the registry client still works, and the
serde that needs one says what to install (the typed error itself: tests/unit/test_optional_extras.py)."""

from __future__ import annotations

import importlib
import sys

import pytest

from streamloop.errors import MissingExtraError


def test_the_client_works_without_the_formats_packages(monkeypatch: pytest.MonkeyPatch, mock_url: str) -> None:
    for hidden in ("fastavro", "google.protobuf.message", "jsonschema"):
        monkeypatch.setitem(sys.modules, hidden, None)
    for module in [m for m in sys.modules if m.startswith("streamloop.schema_registry")]:
        monkeypatch.delitem(sys.modules, module)
    registry = importlib.import_module("streamloop.schema_registry")

    client = registry.SchemaRegistryClient(mock_url)
    assert client.register("s", registry.RegistrySchema('"string"')) == 1
    with pytest.raises(MissingExtraError, match=r"pip install 'streamloop\[schema-registry\]'"):
        registry.AvroSerde  # noqa: B018  # the lazy attribute imports the module that needs fastavro
