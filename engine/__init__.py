"""streamloop: Kafka Streams semantics for Python, on anyio (its asyncio backend).

The public API, re-exported by name.
"""

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
from streamloop.state import JoinWindows, Materialized, SessionWindows, SlidingWindows, Stores, TimeWindows, Windowed
from streamloop.state.metadata import HostInfo, KeyQueryMetadata, StreamsMetadata
from streamloop.state.timestamped import ValueAndTimestamp
from streamloop.state.versioned import VersionedRecord
from streamloop.threads.stream_thread import StreamThreadState, TaskDetails, TaskMetadata, TaskRunState, ThreadMetadata
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
from streamloop.topology.cogroup import CogroupedKStream, SessionWindowedCogroupedKStream, TimeWindowedCogroupedKStream
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
