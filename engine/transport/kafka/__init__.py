"""The Kafka transport: the protocols of :mod:`streamloop.transport.base` over aiokafka.

How aiokafka behaves matters to the engine; what the transport relies on was checked in
aiokafka 0.14's source (``consumer/group_coordinator.py``, ``consumer/fetcher.py``,
``producer/sender.py``, ``producer/message_accumulator.py``) and is told in the module that
relies on it. One module per concept, in the order a record meets them:

- :mod:`~streamloop.transport.kafka.transport`: ``KafkaTransport``, the clients of one cluster.
- :mod:`~streamloop.transport.kafka.security`: Kafka's security keys as aiokafka options.
- :mod:`~streamloop.transport.kafka.options`: other pass-through keys as aiokafka keyword arguments.
- :mod:`~streamloop.transport.kafka.startup`: starting a client; refused credentials told apart.
- :mod:`~streamloop.transport.kafka.consumer`: ``KafkaConsumer`` (polling across rebalances, commits).
- :mod:`~streamloop.transport.kafka.rebalance`: the engine's assignor and listener as aiokafka's.
- :mod:`~streamloop.transport.kafka.leave_group`: leaving the group on close (LeaveGroup v3).
- :mod:`~streamloop.transport.kafka.producer`: ``KafkaProducer``, its batches and its transactions.
- :mod:`~streamloop.transport.kafka.admin`: ``KafkaAdmin`` (topics).
- :mod:`~streamloop.transport.kafka.structs`: partitions and offsets as aiokafka's.
- :mod:`~streamloop.transport.kafka.errors`: the one mapping of aiokafka's errors to the engine's,
  and :func:`is_retriable`, the engine's one classification of what to retry.

aiokafka is imported nowhere else in the engine. Raw asyncio stays here where aiokafka demands
it: its delivery futures, the deadlines put on its coroutines (``asyncio.wait_for``/``timeout``
cancel a call once and let it clean up), the poll gate its coordination task resolves, and the
hand-over lock around its sender. A trial with anyio scopes, lock and event in their place left
aiokafka connections open in the broker-outage test (1 run in 2); the waits of the transport's
own (admin metadata) use anyio.
"""

from __future__ import annotations

from streamloop.transport.kafka.admin import KafkaAdmin
from streamloop.transport.kafka.consumer import KafkaConsumer
from streamloop.transport.kafka.errors import is_retriable
from streamloop.transport.kafka.producer import KafkaProducer
from streamloop.transport.kafka.transport import KafkaTransport

__all__ = [
    "KafkaAdmin",
    "KafkaConsumer",
    "KafkaProducer",
    "KafkaTransport",
    "is_retriable",
]
