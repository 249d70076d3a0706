"""streamloop: Kafka Streams semantics for Python, on anyio (its asyncio backend).

The public API, re-exported by name.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

# What each public name is imported from, on first use (PEP 562): ``import streamloop`` (which
# every ``import streamloop.x`` runs first) then loads none of the machinery, so a process that
# needs one module (a Spark Python worker unpickling the executors' data sources, the CLI) does
# not import the whole client first (a second of CPU per worker process, measured).
# tests/unit/test_public_api.py keeps this, the imports for type checkers and ``__all__`` in step.
_EXPORTS: dict[str, tuple[str, ...]] = {
    "client": ("ClientState", "KafkaStreams", "Metric"),
    "config": ("StreamsConfig",),
    "errors": ("AuthenticationError", "BufferFullError", "CommitFailedError", "ConfigError", "DeserializationError",
        "ForwardingError", "HandledRecordError", "HandlerError", "IllegalStateError", "InternalTopicError",
        "InvalidStateStoreError", "MissingExtraError", "MissingSerdeError", "MissingSinkTopicError",
        "MissingSourceTopicError", "ProcessingError", "ProduceError", "ProducerFencedError",
        "RebalanceInProgressError", "SerializationError", "SparkUnavailableError", "StartupTimeoutError",
        "StateDirectoryError", "StateStoreError", "StoreLockedError", "StreamsError", "StreamsTimeoutError",
        "TaskCorruptedError", "TaskError", "TaskMigratedError", "TaskTimeoutError", "TopologyError",
        "TransportError", "UnknownConfigError"),
    "health": ("HealthResult",),
    "ids": ("TaskId",),
    "processors.api": ("BaseProcessor", "Processor", "ProcessorContext", "PunctuationType"),
    "processors.fixed_key": ("FixedKeyProcessor", "FixedKeyProcessorContext", "FixedKeyRecord"),
    "processors.partitioners": ("BroadcastPartitioner", "StreamPartitioner"),
    "processors.table_transform": ("ValueTransformerWithKey",),
    "records": ("Record", "TopicPartition"),
    "state": ("JoinWindows", "Materialized", "SessionWindows", "SlidingWindows", "Stores", "TimeWindows", "Windowed"),
    "state.metadata": ("HostInfo", "KeyQueryMetadata", "StreamsMetadata"),
    "state.timestamped": ("ValueAndTimestamp",),
    "state.versioned": ("VersionedRecord",),
    "threads.stream_thread": ("StreamThreadState", "TaskDetails", "TaskMetadata", "TaskRunState", "ThreadMetadata"),
    "timestamps": ("ConsumedRecord", "FailOnInvalidTimestamp", "InvalidTimestampError",
        "LogAndSkipOnInvalidTimestamp", "TimestampExtractor", "UsePartitionTimeOnInvalidTimestamp",
        "WallclockTimestampExtractor"),
    "topology.branches": ("BranchedKStream",),
    "topology.builder": ("KStream", "StreamsBuilder"),
    "topology.cogroup": ("CogroupedKStream", "SessionWindowedCogroupedKStream", "TimeWindowedCogroupedKStream"),
    "topology.emit_strategy": ("EmitStrategy",),
    "topology.global_tables": ("GlobalKTable",),
    "topology.grouped_table": ("KGroupedTable",),
    "topology.joins": ("StreamJoined",),
    "topology.printed": ("Printed",),
    "topology.produced": ("Produced",),
    "topology.repartition": ("Repartitioned",),
    "topology.suppressed": ("BufferConfig", "Suppressed"),
    "topology.tables": ("KGroupedStream", "KTable", "TimeWindowedKStream"),
    "topology.topology": ("Topology",),
    "topology.windowed_streams": ("SessionWindowedKStream", "SlidingWindowedKStream"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'streamloop' has no attribute '{name}'")
    value = getattr(import_module(f"streamloop.{module}"), name)
    globals()[name] = value  # the next lookup finds it without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULE_OF})


if TYPE_CHECKING:
    from streamloop.client import ClientState, KafkaStreams, Metric
    from streamloop.config import StreamsConfig
    from streamloop.errors import (
        AuthenticationError,
        BufferFullError,
        CommitFailedError,
        ConfigError,
        DeserializationError,
        ForwardingError,
        HandledRecordError,
        HandlerError,
        IllegalStateError,
        InternalTopicError,
        InvalidStateStoreError,
        MissingExtraError,
        MissingSerdeError,
        MissingSinkTopicError,
        MissingSourceTopicError,
        ProcessingError,
        ProduceError,
        ProducerFencedError,
        RebalanceInProgressError,
        SerializationError,
        SparkUnavailableError,
        StartupTimeoutError,
        StateDirectoryError,
        StateStoreError,
        StoreLockedError,
        StreamsError,
        StreamsTimeoutError,
        TaskCorruptedError,
        TaskError,
        TaskMigratedError,
        TaskTimeoutError,
        TopologyError,
        TransportError,
        UnknownConfigError,
    )
    from streamloop.health import HealthResult
    from streamloop.ids import TaskId
    from streamloop.processors.api import BaseProcessor, Processor, ProcessorContext, PunctuationType
    from streamloop.processors.fixed_key import FixedKeyProcessor, FixedKeyProcessorContext, FixedKeyRecord
    from streamloop.processors.partitioners import BroadcastPartitioner, StreamPartitioner
    from streamloop.processors.table_transform import ValueTransformerWithKey
    from streamloop.records import Record, TopicPartition
    from streamloop.state import (
        JoinWindows,
        Materialized,
        SessionWindows,
        SlidingWindows,
        Stores,
        TimeWindows,
        Windowed,
    )
    from streamloop.state.metadata import HostInfo, KeyQueryMetadata, StreamsMetadata
    from streamloop.state.timestamped import ValueAndTimestamp
    from streamloop.state.versioned import VersionedRecord
    from streamloop.threads.stream_thread import (
        StreamThreadState,
        TaskDetails,
        TaskMetadata,
        TaskRunState,
        ThreadMetadata,
    )
    from streamloop.timestamps import (
        ConsumedRecord,
        FailOnInvalidTimestamp,
        InvalidTimestampError,
        LogAndSkipOnInvalidTimestamp,
        TimestampExtractor,
        UsePartitionTimeOnInvalidTimestamp,
        WallclockTimestampExtractor,
    )
    from streamloop.topology.branches import BranchedKStream
    from streamloop.topology.builder import KStream, StreamsBuilder
    from streamloop.topology.cogroup import (
        CogroupedKStream,
        SessionWindowedCogroupedKStream,
        TimeWindowedCogroupedKStream,
    )
    from streamloop.topology.emit_strategy import EmitStrategy
    from streamloop.topology.global_tables import GlobalKTable
    from streamloop.topology.grouped_table import KGroupedTable
    from streamloop.topology.joins import StreamJoined
    from streamloop.topology.printed import Printed
    from streamloop.topology.produced import Produced
    from streamloop.topology.repartition import Repartitioned
    from streamloop.topology.suppressed import BufferConfig, Suppressed
    from streamloop.topology.tables import KGroupedStream, KTable, TimeWindowedKStream
    from streamloop.topology.topology import Topology
    from streamloop.topology.windowed_streams import SessionWindowedKStream, SlidingWindowedKStream

__all__ = [
    "AuthenticationError",
    "BaseProcessor",
    "BranchedKStream",
    "BroadcastPartitioner",
    "BufferConfig",
    "BufferFullError",
    "ClientState",
    "CogroupedKStream",
    "CommitFailedError",
    "ConfigError",
    "ConsumedRecord",
    "DeserializationError",
    "EmitStrategy",
    "FailOnInvalidTimestamp",
    "FixedKeyProcessor",
    "FixedKeyProcessorContext",
    "FixedKeyRecord",
    "ForwardingError",
    "GlobalKTable",
    "HandledRecordError",
    "HandlerError",
    "HealthResult",
    "HostInfo",
    "IllegalStateError",
    "InternalTopicError",
    "InvalidStateStoreError",
    "InvalidTimestampError",
    "JoinWindows",
    "KGroupedStream",
    "KGroupedTable",
    "KStream",
    "KTable",
    "KafkaStreams",
    "KeyQueryMetadata",
    "LogAndSkipOnInvalidTimestamp",
    "Materialized",
    "Metric",
    "MissingExtraError",
    "MissingSerdeError",
    "MissingSinkTopicError",
    "MissingSourceTopicError",
    "Printed",
    "ProcessingError",
    "Processor",
    "ProcessorContext",
    "ProduceError",
    "Produced",
    "ProducerFencedError",
    "PunctuationType",
    "RebalanceInProgressError",
    "Record",
    "Repartitioned",
    "SerializationError",
    "SessionWindowedCogroupedKStream",
    "SessionWindowedKStream",
    "SessionWindows",
    "SlidingWindowedKStream",
    "SlidingWindows",
    "SparkUnavailableError",
    "StartupTimeoutError",
    "StateDirectoryError",
    "StateStoreError",
    "StoreLockedError",
    "Stores",
    "StreamJoined",
    "StreamPartitioner",
    "StreamThreadState",
    "StreamsBuilder",
    "StreamsConfig",
    "StreamsError",
    "StreamsMetadata",
    "StreamsTimeoutError",
    "Suppressed",
    "TaskCorruptedError",
    "TaskDetails",
    "TaskError",
    "TaskId",
    "TaskMetadata",
    "TaskMigratedError",
    "TaskRunState",
    "TaskTimeoutError",
    "ThreadMetadata",
    "TimeWindowedCogroupedKStream",
    "TimeWindowedKStream",
    "TimeWindows",
    "TimestampExtractor",
    "TopicPartition",
    "Topology",
    "TopologyError",
    "TransportError",
    "UnknownConfigError",
    "UsePartitionTimeOnInvalidTimestamp",
    "ValueAndTimestamp",
    "ValueTransformerWithKey",
    "VersionedRecord",
    "WallclockTimestampExtractor",
    "Windowed",
]
