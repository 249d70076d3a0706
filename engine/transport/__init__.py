"""``open_transport``: the Kafka or the memory transport, chosen by ``bootstrap.servers``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streamloop.config import BOOTSTRAP_SERVERS, MEMORY_SCHEME, check_bootstrap_servers
from streamloop.errors import ConfigError
from streamloop.transport.base import Transport


def open_transport(config: Mapping[str, Any]) -> Transport:
    """``memory://[name]`` gives the in-process broker of that name; ``host:port[,host:port]`` is Kafka.

    Raises ``ConfigError`` naming ``bootstrap.servers`` for anything else.
    """
    servers: str = config[BOOTSTRAP_SERVERS]
    problem = check_bootstrap_servers(servers) if isinstance(servers, str) else f"expected str, got {servers!r}"
    if problem:
        raise ConfigError(BOOTSTRAP_SERVERS, problem)
    if servers.startswith(MEMORY_SCHEME):
        from streamloop.transport.memory import MemoryBroker, MemoryTransport

        return MemoryTransport(MemoryBroker.for_url(servers))
    from streamloop.config import SECURITY_KEYS
    from streamloop.transport.kafka import KafkaTransport

    # Kafka's security keys, unprefixed or per client, are resolved per client by the transport.
    extra = {k[len("admin."):]: v for k, v in config.items()
             if k.startswith("admin.") and k[len("admin."):] not in SECURITY_KEYS}
    return KafkaTransport(servers, extra=extra, security=config)


__all__ = ["MEMORY_SCHEME", "Transport", "open_transport"]
