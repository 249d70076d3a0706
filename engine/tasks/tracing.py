"""Tracing with OpenTelemetry (``tracing.enabled``, the ``otel`` extra): a span per record per task.

Imported only when tracing is on (``streamloop.tasks.wiring.tracing``): with it off, neither this
module nor OpenTelemetry is loaded, and no record pays for it, because each task chooses its
per-record path once, when it is built (``RecordPath`` takes ``traced(process)`` or ``process``).

What is traced:

- **Each record a task processes** gets a ``process <topic>`` span (kind CONSUMER), the child of
  the context in the record's W3C ``traceparent`` (and ``tracestate``) header when it has one, a
  new trace otherwise. Its attributes follow OpenTelemetry's messaging conventions (system,
  operation, destination, partition, offset, consumer group) plus the task id;
  it ends with the record's outcome (``streamloop.outcome``), an error status when a handler
  dropped or paused the record, the record must be retried, or the record failed the task.
  While the record runs the span is the current one, so a processor's own spans are its children.
- **Each output record** (every sink, repartition topics included) gets the ``traceparent`` of
  the current span, replacing the input's: the next sub-topology reads it from its repartition
  topic, and so does any consumer of an output topic.
- **The output of a stateful step** is the child of the record that caused it: an update that
  goes down at once is sent inside its record's span; an update a record cache holds goes down
  later (a flush before a commit, an eviction while another record runs) in the context of the
  record that made it, carried with the cached update (``Cause``). Parent rather than a span link:
  the cause is a single record (the key's last update, as the cache coalesces them), so the trace
  of a count reads as input record, repartition, counting record, output, one tree.

The Spark bulk path (``streamloop.tasks.bulk``) takes records by whole batches, not by this path: its
records get no span of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from streamloop.errors import MissingExtraError
from streamloop.records import ConsumerRecord, Headers, Record
from streamloop.state.cache import CacheEntry, FlushListener

from .processing import Outcome

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.propagators.textmap import Getter
    from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:
    raise MissingExtraError("Tracing (tracing.enabled)", "otel", "opentelemetry-api") from exc

if TYPE_CHECKING:
    from streamloop.ids import TaskId
    from streamloop.processors.nodes import Collector, SinkNode
    from streamloop.state.task_state import TaskStateManager

__all__ = ["Cause", "TaskTracing", "Tracing"]

INSTRUMENTATION = "streamloop"
# The W3C Trace Context headers, as Kafka record headers (names compared without case: clients
# differ in how they spell them).
_TRACE_HEADERS = frozenset({"traceparent", "tracestate"})
_PROPAGATOR = TraceContextTextMapPropagator()
ProcessFn = Callable[[ConsumerRecord], "Outcome | Coroutine[Any, Any, Outcome]"]


class _HeaderGetter(Getter[Headers]):
    """Reads a W3C header from Kafka record headers ((name, bytes) pairs)."""

    def get(self, carrier: Headers, key: str) -> list[str] | None:
        found = [value.decode("latin-1") for name, value in carrier
                 if value is not None and name.lower() == key]
        return found or None

    def keys(self, carrier: Headers) -> list[str]:
        return [name for name, _value in carrier]


_HEADERS = _HeaderGetter()


def extract(headers: Headers) -> Context:
    """The context in ``headers``' ``traceparent`` (an empty one, so a new trace, without it)."""
    return _PROPAGATOR.extract(headers, Context(), _HEADERS)


def with_trace_headers(headers: Headers, context: Context | None = None) -> Headers:
    """``headers`` with their ``traceparent``/``tracestate`` replaced by those of ``context`` (the
    current one when None); unchanged when it holds no valid span."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context)
    if not carrier:
        return headers
    kept = [(name, value) for name, value in headers if name.lower() not in _TRACE_HEADERS]
    return (*kept, *((name, value.encode("latin-1")) for name, value in carrier.items()))


class Cause(tuple[str, int]):
    """The source of a store update (``(topic, offset)`` of the record that made it, as the state
    layer keeps it for changelogs and undo) that also carries that record's span context. A tuple
    like any source, so the store and its cache pass it on untouched; tracing reads it back when
    the cached update goes down (``TaskTracing.wrap_flush``)."""

    span_context: SpanContext

    def __new__(cls, source: tuple[str, int], span_context: SpanContext) -> Cause:
        cause = super().__new__(cls, source)
        cause.span_context = span_context
        return cause


class Tracing:
    """A stream thread's (or the test driver's) tracing: its tracer, and each task's part."""

    def __init__(self, application_id: str, provider: trace.TracerProvider | None = None) -> None:
        self.application_id = application_id
        self.tracer = trace.get_tracer(INSTRUMENTATION, tracer_provider=provider)

    def task(self, task_id: TaskId) -> TaskTracing:
        return TaskTracing(self.tracer, self.application_id, task_id)


class TaskTracing:
    """One task's tracing. Caller: ``TaskManager._create`` (the sinks' collector, the stores'
    sources and flushes) and ``RecordPath`` (the per-record path)."""

    def __init__(self, tracer: trace.Tracer, application_id: str, task_id: TaskId) -> None:
        self._tracer = tracer
        self.task_id = task_id
        # The attributes every span of the task has; a record's own are added per span.
        self._attributes: dict[str, str | int] = {
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.consumer.group.name": application_id,
            # Its sub-topology is the number before the underscore: one attribute less to copy per span.
            "streamloop.task.id": str(task_id),
        }

    # -- the per-record path ---------------------------------------------------------------
    def traced(self, process: ProcessFn) -> ProcessFn:
        """``process`` (``RecordPath.process``) inside a span per record, the span current while
        the record runs (its async part included)."""
        tracer, attributes, finish = self._tracer, self._attributes, self._finish

        def traced_process(raw: ConsumerRecord) -> Outcome | Coroutine[Any, Any, Outcome]:
            span = tracer.start_span(
                f"process {raw.topic}", extract(raw.headers), SpanKind.CONSUMER,
                {**attributes, "messaging.destination.name": raw.topic,
                 "messaging.destination.partition.id": str(raw.partition),
                 "messaging.kafka.offset": raw.offset})
            token = otel_context.attach(trace.set_span_in_context(span))
            try:
                outcome = process(raw)
            except BaseException as exc:
                _end(span, None, exc)
                raise
            finally:
                otel_context.detach(token)
            if isinstance(outcome, Outcome):
                _end(span, outcome)
                return outcome
            return finish(span, outcome)

        return traced_process

    @staticmethod
    async def _finish(span: Span, pending: Coroutine[Any, Any, Outcome]) -> Outcome:
        """The record's async part (an async processor, an error handler) inside its span."""
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            outcome = await pending
        except BaseException as exc:
            _end(span, None, exc)
            raise
        finally:
            otel_context.detach(token)
        _end(span, outcome)
        return outcome

    # -- output ---------------------------------------------------------------------------
    def collector(self, collector: Collector) -> Collector:
        """What the task's sinks send to: ``collector``, each record with the current span's
        ``traceparent``."""
        return TracedCollector(collector)

    # -- stateful steps ---------------------------------------------------------------------
    @staticmethod
    def source(source: Callable[[], tuple[str, int] | None]) -> Callable[[], tuple[str, int] | None]:
        """The task's store-update source (``TaskStateManager``), each with the current span: a
        cached update then goes down in the context of the record that made it."""

        def traced_source() -> tuple[str, int] | None:
            found = source()
            if found is None:
                return None
            span_context = trace.get_current_span().get_span_context()
            return Cause(found, span_context) if span_context.is_valid else found

        return traced_source

    def trace_flushes(self, state: TaskStateManager) -> None:
        """Every cached store of the task sends its updates down in their causes' contexts."""
        for store in state.stores.values():
            store.wrap_cache_flushes(_flush_in_cause)


def _flush_in_cause(send: FlushListener) -> FlushListener:
    def flush(entries: list[tuple[bytes, CacheEntry]]) -> None:
        for key, entry in entries:
            cause = entry.source
            if not isinstance(cause, Cause):
                send([(key, entry)])  # made by a punctuation, or before tracing knew its record
                continue
            token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(cause.span_context)))
            try:
                send([(key, entry)])
            finally:
                otel_context.detach(token)

    return flush


class TracedCollector:
    """A task's collector (or its ``HeldCollector``) as its sinks see it with tracing on: each record
    leaves with the ``traceparent`` of the span current when the sink sends it."""

    __slots__ = ("_inner",)

    def __init__(self, inner: Collector) -> None:
        self._inner = inner

    def send(self, topic: str, record: Record, sink: SinkNode) -> Any:
        headers = with_trace_headers(record.headers)
        if headers is not record.headers:
            # A new record: the one forwarded may reach other children, which must not see this header.
            record = Record(record.key, record.value, record.timestamp, headers)
        return self._inner.send(topic, record, sink)

    async def partition_count(self, topic: str) -> int:
        return await self._inner.partition_count(topic)


def _end(span: Span, outcome: Outcome | None, exc: BaseException | None = None) -> None:
    if outcome is not None:
        span.set_attribute("streamloop.outcome", outcome.value)
        if outcome is not Outcome.DONE and outcome is not Outcome.ABANDONED:
            span.set_status(Status(StatusCode.ERROR, f"record {outcome.value}"))
    elif isinstance(exc, Exception):
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
    span.end()
