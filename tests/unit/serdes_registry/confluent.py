"""confluent-kafka's Schema Registry serializers, when installed (the ``bench`` extra brings them).

Imported with authlib's deprecation warning silenced: confluent-kafka's client imports authlib's
httpx integration, which warns on import, and the test run turns warnings into errors.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import pytest


def confluent() -> Any:
    """The ``confluent_kafka.schema_registry`` package, or skip the test."""
    with warnings.catch_warnings():
        # authlib's deprecate module puts an "always" filter for its warning in front of all
        # others when imported: import it first, so that the "ignore" below goes in front of that.
        with contextlib.suppress(ImportError):
            import authlib.deprecate  # noqa: F401
        warnings.simplefilter("ignore", DeprecationWarning)
        module = pytest.importorskip("confluent_kafka.schema_registry")
        for part in ("avro", "protobuf", "json_schema"):
            pytest.importorskip(f"confluent_kafka.schema_registry.{part}")
    return module
