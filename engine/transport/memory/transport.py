"""MemoryTransport: the clients of one memory broker (``bootstrap.servers = "memory://name"``)."""

from __future__ import annotations

from streamloop.errors import ConfigError
from streamloop.transport.base import ConsumerSettings, ProducerSettings
from streamloop.transport.memory.admin import MemoryAdmin
from streamloop.transport.memory.broker import MemoryBroker
from streamloop.transport.memory.consumer import MemoryConsumer
from streamloop.transport.memory.producer import MemoryProducer


class MemoryTransport:
    """Implements :class:`streamloop.transport.base.Transport` on a :class:`MemoryBroker`."""

    name = "memory"

    def __init__(self, broker: MemoryBroker) -> None:
        self.broker = broker

    @classmethod
    def from_url(cls, url: str) -> MemoryTransport:
        """The transport of the broker registered for ``url`` (``memory://name``)."""
        return cls(MemoryBroker.for_url(url))

    def __repr__(self) -> str:
        return f"MemoryTransport({self.broker!r})"

    def consumer(self, settings: ConsumerSettings) -> MemoryConsumer:
        return MemoryConsumer(self.broker, settings.client_id, settings)

    def producer(self, settings: ProducerSettings) -> MemoryProducer:
        if settings.transactional_id is not None:
            # The memory broker models no transactions (no read_committed, no abort).
            raise ConfigError("processing.guarantee", "exactly_once_v2 needs transactions, which the in-process "
                              "memory:// broker does not model; use a Kafka cluster")
        return MemoryProducer(self.broker, settings)

    def admin(self, client_id: str) -> MemoryAdmin:
        return MemoryAdmin(self.broker, client_id)

    def reader(self, client_id: str, read_committed: bool = False) -> MemoryConsumer:
        # Every record of the memory broker is committed: it has no transactions.
        return MemoryConsumer(self.broker, client_id)
