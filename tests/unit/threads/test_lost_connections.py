"""A stream thread's end collects garbage only when its transport may have lost a connection.

A full collection holds the GIL for the whole heap's scan: at every thread's end it stopped the
process (every other stream thread, heartbeats included) for as long as the heap took, 0.36 s per
end with three million objects alive, which made a property test of thread changes take minutes.
"""

from __future__ import annotations

import gc
import threading
import uuid
from collections.abc import Iterator

import pytest

from streamloop import ClientState, KafkaStreams, StreamsBuilder
from streamloop.testing import eventually
from streamloop.transport import lost_connections
from streamloop.transport.memory import MemoryBroker
from tests.support.apps import streams_config

WAIT = 15.0


@pytest.fixture
def collections(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The names of the threads that ran a full collection."""
    ran: list[str] = []
    collect = gc.collect

    def counted(*args: int) -> int:
        ran.append(threading.current_thread().name)
        return collect(*args)

    monkeypatch.setattr(gc, "collect", counted)
    yield ran


def test_threads_that_end_without_a_lost_connection_do_not_stop_the_process_to_collect(
        collections: list[str]) -> None:
    name = f"gc-{uuid.uuid4().hex[:8]}"
    MemoryBroker.for_url(f"memory://{name}").create_topics({"in": 4, "out": 4})
    builder = StreamsBuilder()
    builder.stream("in").to("out")
    streams = KafkaStreams(builder.build(), streams_config(f"memory://{name}", "gc", num_stream_threads=2))
    try:
        streams.start()
        assert streams.wait_for_state(ClientState.RUNNING, timeout=WAIT)
        streams.add_stream_thread()
        assert streams.remove_stream_thread(timeout=WAIT) is not None
        eventually(lambda: len(streams.metadata_for_local_threads()) == 2, timeout=WAIT, what="a thread removed")
    finally:
        streams.close(timeout=WAIT)
        MemoryBroker.reset(name)
    assert [n for n in collections if "StreamThread" in n] == []


def test_a_noted_lost_connection_is_collected_once_on_the_thread_that_noted_it(collections: list[str]) -> None:
    assert not lost_connections.collect()
    lost_connections.note()
    other = threading.Thread(target=lambda: collections.append(f"other collected: {lost_connections.collect()}"))
    other.start()
    other.join()
    assert lost_connections.collect()
    assert not lost_connections.collect()
    me = threading.current_thread().name
    assert collections == ["other collected: False", me]
