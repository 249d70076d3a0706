"""``KStream.split()``'s branches (Kafka Streams' ``BranchedKStream``): named predicates, closed
by ``default_branch`` or ``no_default_branch``, which build one ``branch()`` node."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from streamloop.errors import TopologyError

if TYPE_CHECKING:
    from streamloop.topology.builder import KStream


class BranchedKStream:
    """The branches of a ``split()``; ``branch`` adds one, ``default_branch``/``no_default_branch`` end it."""

    def __init__(self, stream: KStream, name: str | None) -> None:
        self._stream = stream
        self._prefix = name or ""
        self._predicates: list[Callable[[Any, Any], Any]] = []
        self._names: list[str] = []
        self._done = False

    def branch(self, predicate: Callable[[Any, Any], Any], *, name: str | None = None) -> BranchedKStream:
        if self._done:
            raise TopologyError("split() is already closed by default_branch()/no_default_branch()")
        self._predicates.append(predicate)
        self._names.append(name or str(len(self._predicates)))
        return self

    def default_branch(self, *, name: str | None = None) -> dict[str, KStream]:
        self._predicates.append(lambda _k, _v: True)
        self._names.append(name or "0")
        return self._close()

    def no_default_branch(self) -> dict[str, KStream]:
        return self._close()

    def _close(self) -> dict[str, KStream]:
        if not self._predicates:
            raise TopologyError("split() needs at least one branch")
        self._done = True
        streams = self._stream.branch(*self._predicates, name=f"{self._prefix}split" if self._prefix else None)
        return {f"{self._prefix}{n}": s for n, s in zip(self._names, streams, strict=True)}
