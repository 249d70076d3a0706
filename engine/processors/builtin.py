"""The nodes behind the DSL: filter, map, map_values, flat_map, peek, foreach, branch.

Each wraps one user function, which may be plain or ``async def``. A plain one is
called and its result emitted in the same call; an async one makes ``process``
return a coroutine that the task's forwarder awaits in order.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio.to_thread

from streamloop.processors.nodes import Node
from streamloop.records import Record


def is_async_callable(fn: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
    return call is not None and inspect.iscoroutinefunction(call)


def _as_pair(result: Any, node: str) -> tuple[Any, Any]:
    if isinstance(result, tuple) and len(result) == 2:
        return result
    raise TypeError(f"'{node}' must return a (key, value) pair, got {result!r}")


class FunctionNode(Node):
    """A node around one user function; subclasses say how to call it and what to emit."""

    __slots__ = ("fn", "is_async", "blocking")

    def __init__(self, name: str, fn: Callable[..., Any]) -> None:
        if not callable(fn):
            raise TypeError(f"'{name}' needs a callable, got {fn!r}")
        super().__init__(name)
        self.fn = fn
        self.is_async = is_async_callable(fn)
        self.blocking = False

    def mark_blocking(self) -> None:
        """Run the (plain) function on anyio's bounded worker-thread pool, off the loop."""
        if self.is_async:
            raise TypeError(f"'{self.name}': blocking=True is for plain functions, not async ones")
        self.blocking = True
        self.is_async = True

    def process(self, record: Record) -> Awaitable[None] | None:
        if self.is_async:
            return self._finish(record)
        self._emit(record, self._call(record))
        return None

    async def _finish(self, record: Record) -> None:
        # The user's coroutine is made here, so dropping an unstarted _finish leaks nothing.
        if self.blocking:
            # anyio's default limiter bounds the pool; the loop (and its heartbeats) stays free.
            self._emit(record, await anyio.to_thread.run_sync(self._call, record))
        else:
            self._emit(record, await self._call(record))

    def _call(self, record: Record) -> Any:
        return self.fn(record.key, record.value)

    def _emit(self, record: Record, result: Any) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class FilterNode(FunctionNode):
    __slots__ = ("keep_when",)

    def __init__(self, name: str, predicate: Callable[..., Any], negate: bool = False) -> None:
        super().__init__(name, predicate)
        self.keep_when = not negate

    def process(self, record: Record) -> Awaitable[None] | None:
        if self.is_async:
            return self._finish(record)
        if bool(self.fn(record.key, record.value)) is self.keep_when:
            self.forwarder.forward(self.children, record)  # type: ignore[union-attr]  # set by init() before any record
        return None

    def _emit(self, record: Record, result: Any) -> None:
        if bool(result) is self.keep_when:
            self.forwarder.forward(self.children, record)  # type: ignore[union-attr]  # set by init() before any record


class MapNode(FunctionNode):
    __slots__ = ()

    def _emit(self, record: Record, result: Any) -> None:
        key, value = _as_pair(result, self.name)
        self.forwarder.forward(self.children, Record(key, value, record.timestamp, record.headers))  # type: ignore[union-attr]  # set by init() before any record


class SelectKeyNode(FunctionNode):
    __slots__ = ()

    def _emit(self, record: Record, result: Any) -> None:
        self.forwarder.forward(self.children, record.with_key(result))  # type: ignore[union-attr]  # set by init() before any record


class MapValuesNode(FunctionNode):
    __slots__ = ()

    def process(self, record: Record) -> Awaitable[None] | None:
        if self.is_async:
            return self._finish(record)
        self.forwarder.forward(  # type: ignore[union-attr]  # set by init() before any record
            self.children, Record(record.key, self.fn(record.value), record.timestamp, record.headers))
        return None

    def _call(self, record: Record) -> Any:
        return self.fn(record.value)

    def _emit(self, record: Record, result: Any) -> None:
        self.forwarder.forward(self.children, Record(record.key, result, record.timestamp, record.headers))  # type: ignore[union-attr]  # set by init() before any record


class FlatMapNode(FunctionNode):
    __slots__ = ()

    def _emit(self, record: Record, result: Any) -> None:
        forward = self.forwarder.forward  # type: ignore[union-attr]  # set by init() before any record
        for item in result:
            key, value = _as_pair(item, self.name)
            forward(self.children, Record(key, value, record.timestamp, record.headers))


class FlatMapValuesNode(FunctionNode):
    __slots__ = ()

    def _call(self, record: Record) -> Any:
        return self.fn(record.value)

    def _emit(self, record: Record, result: Any) -> None:
        forward = self.forwarder.forward  # type: ignore[union-attr]  # set by init() before any record
        for value in result:
            forward(self.children, Record(record.key, value, record.timestamp, record.headers))


class PeekNode(FunctionNode):
    __slots__ = ()

    def _emit(self, record: Record, result: Any) -> None:
        self.forwarder.forward(self.children, record)  # type: ignore[union-attr]  # set by init() before any record


class ForeachNode(FunctionNode):
    __slots__ = ()

    def _emit(self, record: Record, result: Any) -> None:
        return None


class BranchNode(Node):
    """Sends each record to the child of the first predicate that matches (or to none).

    ``children[i]`` belongs to ``predicates[i]``; the builder keeps them aligned.
    """

    __slots__ = ("predicates", "any_async")

    def __init__(self, name: str, predicates: Sequence[Callable[..., Any]]) -> None:
        super().__init__(name)
        for p in predicates:
            if not callable(p):
                raise TypeError(f"'{name}' needs callable predicates, got {p!r}")
        self.predicates = tuple(predicates)
        self.any_async = any(is_async_callable(p) for p in predicates)

    def process(self, record: Record) -> Awaitable[None] | None:
        if self.any_async:
            return self._route_async(record)
        for index, predicate in enumerate(self.predicates):
            if predicate(record.key, record.value):
                self.forwarder.forward((self.children[index],), record)  # type: ignore[union-attr]  # set by init() before any record
                break
        return None

    async def _route_async(self, record: Record) -> None:
        for index, predicate in enumerate(self.predicates):
            result = predicate(record.key, record.value)
            if inspect.isawaitable(result):
                result = await result
            if result:
                self.forwarder.forward((self.children[index],), record)  # type: ignore[union-attr]  # set by init() before any record
                break
