"""The bodies of ``KStream.process_values`` and ``KStream.print`` (``KStream`` keeps thin methods
that call these): a processor that keeps every record's key, and a printer of each record."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from streamloop.errors import TopologyError
from streamloop.processors.fixed_key import FixedKeyProcessorAdapter, FixedKeyProcessorSupplier
from streamloop.processors.printer import PrintProcessor, PrintSink
from streamloop.topology.printed import Printed

if TYPE_CHECKING:
    from streamloop.topology.builder import KStream, StreamsBuilder


def check_stores(builder: StreamsBuilder, node: str, stores: Sequence[str], call: str) -> None:
    """Every store ``node`` names must be added to the builder already."""
    known = builder._topology.store_names
    for store in stores:
        if store not in known:
            raise TopologyError(f"Processor '{node}' ({call}) uses state store '{store}', which is not added "
                                "(StreamsBuilder.add_state_store)")


def check_supplier(supplier: Callable[[], Any], node: str, call: str, method: str) -> None:
    """``supplier`` makes a new object with a plain or async ``method`` each time (one per task):
    checked now, as Kafka Streams' ``ApiUtils.checkSupplier``, not when the first task is built."""
    if not callable(supplier):
        raise TypeError(f"{call} needs a supplier (a callable that makes a new processor per task), got {supplier!r}")
    first, second = supplier(), supplier()
    if first is second:
        raise TopologyError(f"The supplier given to {call} for '{node}' returned the same object twice: it must "
                            "return a new object each time it is called (one per task)")
    if not callable(getattr(first, method, None)):
        raise TopologyError(f"The supplier given to {call} for '{node}' must make objects with a {method}() "
                            f"method, got {first!r}")


def process_values(stream: KStream, supplier: FixedKeyProcessorSupplier, name: str | None,
                   concurrency: int | None, ordering: str | None, stores: Sequence[str]) -> KStream:
    builder = stream._builder
    node = builder._name(name, "KSTREAM-PROCESSVALUES")
    check_supplier(supplier, node, "process_values()", "process")
    check_stores(builder, node, stores, "process_values()")
    topology = builder._topology
    topology.add_processor(node, lambda: FixedKeyProcessorAdapter(node, supplier()), stream._node, stores=stores)
    if concurrency is not None or ordering is not None:
        topology.set_concurrency(node, concurrency, ordering)
    # The key (and what is known of it) stays; the values are the processor's.
    return stream._after(node, False, False)


def print_stream(stream: KStream, printed: Printed) -> None:
    if not isinstance(printed, Printed):
        raise TopologyError(f"print() needs a Printed (Printed.to_sys_out() or Printed.to_file(path)), got {printed!r}")
    printed.check()
    builder = stream._builder
    node = builder._name(printed.name, "KSTREAM-PRINTER")
    label = printed.label if printed.label is not None else node
    sink = PrintSink(printed)
    builder._topology.add_processor(node, lambda: PrintProcessor(sink, printed, label), stream._node)
