"""``KStream.repartition(Repartitioned...)``: a stream sent through an internal topic on purpose,
as Kafka Streams' ``KStream#repartition`` (KIP-221).

The records are written to ``<application.id>-<name>-repartition`` (``name``: the
``Repartitioned``'s, else a generated ``KSTREAM-REPARTITION-<n>``) and read back by a new
sub-topology, so that what follows runs in tasks by the records' current keys (or by the stream
partitioner's choice). The topic gets ``number_of_partitions`` partitions when given — fixed:
co-partitioning with a joined topic is then checked against it rather than imposed on it —
else the partition count of the sub-topology that writes it, as other repartition topics.
Unlike grouping, an explicit repartition keeps records with a None key (Kafka Streams' filter
there lets every record through).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamloop.errors import TopologyError
from streamloop.processors.nodes import Partitioner
from streamloop.processors.partitioners import StreamPartitioner
from streamloop.serdes import Serde, as_serde

if TYPE_CHECKING:
    from streamloop.topology.builder import KStream


class Repartitioned:
    """How ``repartition()`` writes its topic: name, serdes, partition count, partitioner.

    Immutable: each ``with_*`` returns a copy. Start from ``Repartitioned.as_(name)``,
    ``with_(key_serde, value_serde)``, ``number_of_partitions(n)`` or ``stream_partitioner(p)``.
    """

    __slots__ = ("key_serde", "name", "partitioner", "partitions", "value_serde")

    def __init__(self, name: str | None = None, key_serde: Serde | None = None, value_serde: Serde | None = None,
                 partitions: int | None = None, partitioner: Partitioner | StreamPartitioner | None = None) -> None:
        if name is not None and not name:
            raise TopologyError("Repartitioned needs a non-empty name")
        if partitions is not None and (isinstance(partitions, bool) or not isinstance(partitions, int)
                                       or partitions < 1):
            raise TopologyError(f"Repartitioned needs a number of partitions of at least 1, got {partitions!r}")
        self.name = name
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.partitions = partitions
        self.partitioner = partitioner

    def _copy(self, **changes: Any) -> Repartitioned:
        fields = {"name": self.name, "key_serde": self.key_serde, "value_serde": self.value_serde,
                  "partitions": self.partitions, "partitioner": self.partitioner}
        return Repartitioned(**{**fields, **changes})

    # Kafka Streams' static factories.
    @classmethod
    def as_(cls, name: str) -> Repartitioned:
        return cls(name=name)

    @classmethod
    def with_(cls, key_serde: Serde | type | None, value_serde: Serde | type | None) -> Repartitioned:
        return cls()._copy(key_serde=_serde(key_serde, "key"), value_serde=_serde(value_serde, "value"))

    @classmethod
    def number_of_partitions(cls, n: int) -> Repartitioned:
        return cls(partitions=n)

    @classmethod
    def stream_partitioner(cls, partitioner: Partitioner | StreamPartitioner) -> Repartitioned:
        return cls(partitioner=partitioner)

    # And its copying setters.
    def with_name(self, name: str) -> Repartitioned:
        return self._copy(name=name)

    def with_key_serde(self, key_serde: Serde | type) -> Repartitioned:
        return self._copy(key_serde=_serde(key_serde, "key"))

    def with_value_serde(self, value_serde: Serde | type) -> Repartitioned:
        return self._copy(value_serde=_serde(value_serde, "value"))

    def with_number_of_partitions(self, n: int) -> Repartitioned:
        return self._copy(partitions=n)

    def with_stream_partitioner(self, partitioner: Partitioner | StreamPartitioner) -> Repartitioned:
        return self._copy(partitioner=partitioner)

    def __repr__(self) -> str:
        return (f"Repartitioned(name={self.name!r}, key_serde={self.key_serde!r}, value_serde={self.value_serde!r}, "
                f"partitions={self.partitions!r})")


def _serde(serde: Serde | type | None, what: str) -> Serde | None:
    return None if serde is None else as_serde(serde, f"{what} serde of Repartitioned")


def repartition(stream: KStream, repartitioned: Repartitioned | None) -> KStream:
    """The body of ``KStream.repartition``: sink to the internal topic, source from it."""
    spec = repartitioned if repartitioned is not None else Repartitioned()
    if not isinstance(spec, Repartitioned):
        raise TopologyError(f"repartition() takes a Repartitioned, got {spec!r}")
    builder = stream._builder
    topology = builder._topology
    # Names as Kafka Streams makes them: generated ones burn the index of a sink, a (pass-all)
    # filter and a source, so that the nodes after keep Kafka Streams' numbers.
    base = spec.name if spec.name is not None else builder._name(None, "KSTREAM-REPARTITION")
    topic = base if base.endswith("-repartition") else f"{base}-repartition"
    generated = (builder._name(None, "KSTREAM-SINK"), builder._name(None, "KSTREAM-FILTER"),
                 builder._name(None, "KSTREAM-SOURCE"))
    sink, source = (generated[0], generated[2]) if spec.name is None else (f"{topic}-sink", f"{topic}-source")
    ks = spec.key_serde if spec.key_serde is not None else stream._key_serde
    vs = spec.value_serde if spec.value_serde is not None else stream._value_serde
    inherited = (spec.key_serde is None and ks is not None, spec.value_serde is None and vs is not None)
    topology.add_sink(sink, topic, stream._node, key_serde=ks, value_serde=vs, partitioner=spec.partitioner,
                      internal=True, inherited=inherited, kinds=stream._kinds(ks, vs), call="Repartitioned.with_()")
    topology.add_source(source, topic, ks, vs, internal=True)
    if spec.partitions is not None:
        topology.fix_partitions(source, spec.partitions)
    key_kind, value_kind = stream._kinds(ks, vs)
    return builder._stream_at(source, False, ks, vs, key_kind=key_kind, value_kind=value_kind)
