"""A storm of KIP-663 and KIP-671 calls racing each other on the memory broker.

``run_storm`` fires, at random moments and all at once, calls from outside (add, remove with
and without a timeout, close) and calls from inside stream threads (a processor that adds or
removes a thread, or fails and lets the uncaught-exception handler answer). Every call must
return within its timeout (plus a little slack; a call without one within a hang detector),
and once the storm is over every record produced is in the output, after a restart if the
storm closed the client. Used by ``tests/properties/test_thread_races.py`` (hypothesis draws
the storms) and by ``benchmarks/faults.py`` (figures over many storms).
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from anyio.from_thread import start_blocking_portal
from hypothesis import strategies as st

from streamloop import ClientState, KafkaStreams, StreamsBuilder, StreamsTimeoutError
from streamloop.handlers import StreamThreadExceptionResponse
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.testing import eventually
from streamloop.transport import open_transport
from tests.support.apps import streams_config
from tests.support.cluster import Cluster

INT, JSON = IntegerSerde(), JsonSerde()
Response = StreamThreadExceptionResponse
PARTITIONS = 4
RECORDS = 40
SLACK = 0.5
HANG = 20.0  # a call without a timeout that takes this long is taken for a hang

OUTSIDE = st.one_of(
    st.just(("add", None)),
    st.tuples(st.just("remove"), st.sampled_from([None, 0.0, 0.2, 2.0])),
    st.just(("close", 2.0)),
)
INSIDE = st.one_of(
    st.just(("add", None)),
    st.tuples(st.just("remove"), st.sampled_from([None, 0.2])),
    st.just(("fail", None)),
)


@dataclass
class Calls:
    """What each call took and how it ended, from every thread."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    overruns: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    done: int = 0

    def record(self, what: str, limit: float, took: float, error: BaseException | None) -> None:
        with self.lock:
            self.done += 1
            if took > limit + SLACK:
                self.overruns.append(f"{what} took {took:.2f} s (limit {limit} s)")
            if error is not None and not isinstance(error, StreamsTimeoutError):
                self.errors.append(f"{what} raised {error!r}")


def timed(calls: Calls, what: str, limit: float, fn: Any, *args: Any) -> Any:
    started = time.monotonic()
    error: BaseException | None = None
    try:
        return fn(*args)
    except BaseException as exc:  # recorded, the storm goes on
        error = exc
        return None
    finally:
        calls.record(what, limit, time.monotonic() - started, error)


@dataclass
class StormFigures:
    calls: int
    overruns: list[str]
    errors: list[str]
    lost: int


def run_storm(outside: list[tuple[float, tuple[str, float | None]]], inside: list[tuple[int, tuple[str, float | None]]],
              answer: Response) -> StormFigures:
    """Fire the storm and mend what it leaves until every record is out (``AssertionError`` on a
    hang or if records stay missing past the hang detector); returns what the calls did."""
    bootstrap = f"memory://races-{uuid.uuid4().hex[:8]}"
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    calls = Calls()
    holder: list[KafkaStreams] = []
    commands = {seq: op for seq, op in inside}
    ran: set[int] = set()
    once = threading.Lock()

    def step(value: dict) -> dict:
        seq = value["seq"]
        with once:
            first = seq in commands and seq not in ran
            ran.add(seq)
        if first:
            what, timeout = commands[seq]
            streams = holder[-1]
            if what == "fail":
                raise RuntimeError(f"injected failure at record {seq}")
            if what == "add":
                timed(calls, f"inside add (record {seq})", SLACK, streams.add_stream_thread)
            else:
                # On a stream thread's loop a removal never waits for the victim.
                timed(calls, f"inside remove({timeout}) (record {seq})", SLACK, streams.remove_stream_thread, timeout)
        return value

    def client() -> KafkaStreams:
        builder = StreamsBuilder()
        (builder.stream("in", key_serde=INT, value_serde=JSON)
                .map_values(step)
                .to("out", key_serde=INT, value_serde=JSON))
        streams = KafkaStreams(builder.build(), streams_config(bootstrap, "races", num_stream_threads=2,
                                                                retry_backoff_ms=10))
        streams.set_uncaught_exception_handler(lambda _exc: answer)
        holder.append(streams)
        return streams

    with start_blocking_portal() as portal:
        portal.call(cluster.create_topics, {"in": PARTITIONS, "out": PARTITIONS})
        streams = client()
        streams.start()
        try:
            values = [(seq, {"seq": seq}) for seq in range(RECORDS)]
            producer = threading.Thread(target=lambda: portal.call(
                cluster.produce, "in", values, INT, JSON, PARTITIONS), daemon=True)

            def fire(delay: float, what: str, arg: float | None) -> None:
                time.sleep(delay)  # the storm's schedule, not a wait for a condition
                if what == "add":
                    timed(calls, "add", SLACK, streams.add_stream_thread)
                elif what == "remove":
                    timed(calls, f"remove({arg})", HANG if arg is None else arg, streams.remove_stream_thread, arg)
                else:
                    timed(calls, f"close({arg})", arg or HANG, streams.close, arg)

            workers = [threading.Thread(target=fire, args=(delay, what, arg), daemon=True)
                       for delay, (what, arg) in outside]
            producer.start()
            for worker in workers:
                worker.start()
            for worker in [producer, *workers]:
                worker.join(HANG + 5)
                assert not worker.is_alive(), "a call from outside hung"

            # The storm is over, but a failure it caused may still end a thread or the client: until
            # every record is out, whatever it left (a closed client, no thread alive) is mended.
            def everything_out() -> bool:
                nonlocal streams
                if streams.state in (ClientState.ERROR, ClientState.NOT_RUNNING):
                    assert streams.close(timeout=HANG), "the client did not finish closing"
                    streams = client()
                    streams.start()
                elif streams.state.is_running_or_rebalancing() and not [
                        t for t in streams.metadata_for_local_threads() if t.thread_state.is_alive()]:
                    streams.add_stream_thread()
                out = portal.call(cluster.read_all, "out")
                return set(range(RECORDS)) <= {JSON.deserialize(r.value)["seq"] for r in out}

            eventually(everything_out, HANG, "every record in the output", interval=0.05)
        finally:
            for client_ in holder:
                assert client_.close(timeout=HANG), "close hung"
        out = portal.call(cluster.read_all, "out")
    lost = len(set(range(RECORDS)) - {JSON.deserialize(r.value)["seq"] for r in out})
    return StormFigures(calls.done, calls.overruns, calls.errors, lost)




def random_storm(rng: random.Random) -> tuple[list[tuple[float, tuple[str, float | None]]],
                                             list[tuple[int, tuple[str, float | None]]], Response]:
    """A storm drawn like the property test's, from a seeded ``random.Random`` (for benchmarks)."""
    def outside_call() -> tuple[str, float | None]:
        return rng.choice([("add", None), ("remove", rng.choice([None, 0.0, 0.2, 2.0])), ("close", 2.0)])

    def inside_call() -> tuple[str, float | None]:
        return rng.choice([("add", None), ("remove", rng.choice([None, 0.2])), ("fail", None)])

    outside = [(rng.uniform(0, 0.5), outside_call()) for _ in range(rng.randint(0, 6))]
    seqs = rng.sample(range(RECORDS), rng.randint(0, 4))
    inside = [(seq, inside_call()) for seq in seqs]
    answer = rng.choice([Response.REPLACE_THREAD, Response.SHUTDOWN_THREAD, Response.SHUTDOWN_CLIENT])
    return outside, inside, answer
