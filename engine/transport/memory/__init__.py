"""The ``memory://`` transport: an in-process Kafka-like broker.

Topics are append-only partition logs; consumer groups follow Kafka's eager
rebalance protocol with a join barrier (``group.py`` for the broker's side,
``membership.py`` for a member's); clients on several stream threads, each with
its own event loop, share one :class:`MemoryBroker` per ``memory://name`` URL.
"""

from streamloop.transport.memory.admin import MemoryAdmin
from streamloop.transport.memory.broker import MemoryBroker
from streamloop.transport.memory.consumer import MemoryConsumer
from streamloop.transport.memory.group import GroupDescription, GroupState
from streamloop.transport.memory.membership import MemberState
from streamloop.transport.memory.producer import MemoryProducer
from streamloop.transport.memory.transport import MemoryTransport

__all__ = [
    "GroupDescription",
    "GroupState",
    "MemberState",
    "MemoryAdmin",
    "MemoryBroker",
    "MemoryConsumer",
    "MemoryProducer",
    "MemoryTransport",
]
