"""``Produced``: how ``KStream.to`` writes its topic, as Kafka Streams' ``Produced``: serdes, the
sink's name and a stream partitioner (``streamloop.processors.partitioners``; a multicast one
sends a record to several partitions, KIP-837).

Immutable: each ``with_*`` returns a copy. ``to(topic, Produced...)`` takes it instead of the
``key_serde=``/``value_serde=``/``partitioner=``/``name=`` keywords (giving both is refused).
"""

from __future__ import annotations

from typing import Any

from streamloop.errors import TopologyError
from streamloop.processors.nodes import Partitioner
from streamloop.processors.partitioners import StreamPartitioner, multicast_of
from streamloop.serdes import Serde, as_serde


class Produced:
    __slots__ = ("key_serde", "name", "partitioner", "value_serde")

    def __init__(self, key_serde: Serde | None = None, value_serde: Serde | None = None,
                 partitioner: Partitioner | StreamPartitioner | None = None, name: str | None = None) -> None:
        if name is not None and not name:
            raise TopologyError("Produced needs a non-empty name")
        multicast_of(partitioner, "Produced")  # a wrong one is refused here, where it was given
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.partitioner = partitioner
        self.name = name

    def _copy(self, **changes: Any) -> Produced:
        fields = {"key_serde": self.key_serde, "value_serde": self.value_serde,
                  "partitioner": self.partitioner, "name": self.name}
        return Produced(**{**fields, **changes})

    # Kafka Streams' static factories.
    @classmethod
    def with_(cls, key_serde: Serde | type | None, value_serde: Serde | type | None,
              partitioner: Partitioner | StreamPartitioner | None = None) -> Produced:
        return cls(_serde(key_serde, "key"), _serde(value_serde, "value"), partitioner)

    @classmethod
    def as_(cls, name: str) -> Produced:
        return cls(name=name)

    @classmethod
    def key_serde_of(cls, key_serde: Serde | type) -> Produced:
        return cls(key_serde=_serde(key_serde, "key"))

    @classmethod
    def value_serde_of(cls, value_serde: Serde | type) -> Produced:
        return cls(value_serde=_serde(value_serde, "value"))

    @classmethod
    def stream_partitioner(cls, partitioner: Partitioner | StreamPartitioner) -> Produced:
        return cls(partitioner=partitioner)

    # And its copying setters.
    def with_name(self, name: str) -> Produced:
        return self._copy(name=name)

    def with_key_serde(self, key_serde: Serde | type) -> Produced:
        return self._copy(key_serde=_serde(key_serde, "key"))

    def with_value_serde(self, value_serde: Serde | type) -> Produced:
        return self._copy(value_serde=_serde(value_serde, "value"))

    def with_stream_partitioner(self, partitioner: Partitioner | StreamPartitioner) -> Produced:
        return self._copy(partitioner=partitioner)

    def __repr__(self) -> str:
        return (f"Produced(name={self.name!r}, key_serde={self.key_serde!r}, value_serde={self.value_serde!r}, "
                f"partitioner={self.partitioner!r})")


def _serde(serde: Serde | type | None, what: str) -> Serde | None:
    return None if serde is None else as_serde(serde, f"{what} serde of Produced")


AnyPartitioner = Partitioner | StreamPartitioner


def sink_options(produced: Produced | None, key_serde: Serde | type | None, value_serde: Serde | type | None,
                 partitioner: AnyPartitioner | None, name: str | None,
                 ) -> tuple[Serde | type | None, Serde | type | None, AnyPartitioner | None, str | None]:
    """``to()``'s options from its ``Produced`` or its keywords, never both."""
    if produced is None:
        return key_serde, value_serde, partitioner, name
    if not isinstance(produced, Produced):
        raise TopologyError(f"to() takes a Produced, got {produced!r}")
    given = [k for k, v in (("key_serde", key_serde), ("value_serde", value_serde),
                            ("partitioner", partitioner), ("name", name)) if v is not None]
    if given:
        raise TopologyError(f"to() got a Produced and {', '.join(given)}=: set them on the Produced "
                            "(Produced.with_key_serde(...) etc.)")
    return produced.key_serde, produced.value_serde, produced.partitioner, produced.name
