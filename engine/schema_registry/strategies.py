"""Subject name strategies: under which subject a serde registers (and looks up) its schema.

As Confluent's: ``TopicNameStrategy`` (the default) is ``<topic>-key`` / ``<topic>-value``,
one schema lineage per topic; ``RecordNameStrategy`` is the record's fully qualified name,
so one topic can carry several record types and one type several topics;
``TopicRecordNameStrategy`` is ``<topic>-<record name>``. A strategy is any callable
``(topic, is_key, record_name) -> subject``.
"""

from __future__ import annotations

from typing import Protocol


class SubjectNameStrategy(Protocol):
    def __call__(self, topic: str | None, is_key: bool, record_name: str | None) -> str: ...


def _need_topic(strategy: str, topic: str | None) -> str:
    if not topic:
        raise ValueError(f"{strategy} names the subject after the topic: pass topic= to the serde (the topic it "
                         "writes to), or use RecordNameStrategy for a serde written to several topics")
    return topic


def _need_record_name(strategy: str, record_name: str | None) -> str:
    if not record_name:
        raise ValueError(f"{strategy} names the subject after the record: the schema has no name (Avro 'name', "
                         "Protobuf message name, JSON Schema 'title')")
    return record_name


class _Strategy:
    """Strategies hold no settings: two of a kind are equal."""

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class TopicNameStrategy(_Strategy):
    def __call__(self, topic: str | None, is_key: bool, record_name: str | None) -> str:
        return f"{_need_topic('TopicNameStrategy', topic)}-{'key' if is_key else 'value'}"


class RecordNameStrategy(_Strategy):
    def __call__(self, topic: str | None, is_key: bool, record_name: str | None) -> str:
        return _need_record_name("RecordNameStrategy", record_name)


class TopicRecordNameStrategy(_Strategy):
    def __call__(self, topic: str | None, is_key: bool, record_name: str | None) -> str:
        return (f"{_need_topic('TopicRecordNameStrategy', topic)}-"
                f"{_need_record_name('TopicRecordNameStrategy', record_name)}")


def as_strategy(value: SubjectNameStrategy | type) -> SubjectNameStrategy:
    """A strategy instance from an instance, a strategy class or a plain function."""
    if isinstance(value, type):
        value = value()
    if not callable(value):
        raise TypeError(f"subject_name_strategy must be a strategy or a callable, got {value!r}")
    return value  # type: ignore[return-value]
