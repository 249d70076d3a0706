"""Pass-through options: the user's Kafka client keys as an aiokafka client's keyword arguments.

Kafka's dotted names mostly map to aiokafka's keyword names with "." -> "_" (``fetch.max.wait.ms``
becomes ``fetch_max_wait_ms``). A key the client does not take, or one the engine sets itself,
is a ``ConfigError`` naming the key, raised when the client object is made (not at its start).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping

from streamloop.errors import ConfigError
from streamloop.transport.kafka.security import is_security_key

__all__ = ["client_kwargs"]

_ALIASES = {"batch_size": "max_batch_size"}
_RESERVED = frozenset(
    {
        "self",
        "loop",
        "topics",
        "api_version",
        "bootstrap_servers",
        "group_id",
        "enable_auto_commit",
        "key_deserializer",
        "value_deserializer",
        "key_serializer",
        "value_serializer",
        "partition_assignment_strategy",
        "transactional_id",
    }
)


def _coerce(value: object, default: object) -> object:
    if isinstance(value, str):
        if isinstance(default, bool):
            low = value.strip().lower()
            if low in ("true", "false"):
                return low == "true"
        elif isinstance(default, int) and value.strip().lstrip("-").isdigit():
            return int(value)
    return value


def client_kwargs(cls: type, raw: Mapping[str, object]) -> dict[str, object]:
    """Turn pass-through keys (``fetch.max.wait.ms`` or ``fetch_max_wait_ms``) into kwargs of ``cls``.

    Kafka's security keys (``sasl.jaas.config`` …) are left out: ``security_options`` maps them.
    """
    params = inspect.signature(cls.__init__).parameters  # type: ignore[misc]  # mypy: __init__ of a class object
    out: dict[str, object] = {}
    for key, value in raw.items():
        if is_security_key(key):
            continue
        name = key.replace(".", "_").replace("-", "_")
        name = _ALIASES.get(name, name)
        if name in _RESERVED:
            raise ConfigError(key, f"is set by the engine and cannot be passed to {cls.__name__}")
        param = params.get(name)
        if param is None or param.kind in (
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        ):
            hint = ("; Kafka's security keys (security.protocol, sasl.jaas.config, ssl.truststore.location, …) "
                    "are listed in docs/security.md") if name.startswith(("ssl_", "sasl_")) else ""
            raise ConfigError(key, f"is not an option of aiokafka's {cls.__name__}{hint}")
        out[name] = _coerce(value, param.default)
    return out
