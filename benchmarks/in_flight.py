"""Records in flight per task: an async processor that waits 5 ms of I/O per record.

``map_values`` with an ``async def`` that awaits ``asyncio.sleep(0.005)``, run with
``num.threads.per.task`` = 1, 8, 32, 128 (``processing.ordering`` = ``partition``,
the default), 4 input partitions and 1 stream thread. Each setting gets its own
topic pair and application id; its input is produced before the client starts.
Throughput is measured on the output side: from the moment the first record's
processing started (the processor stamps it into the output value) to the moment
the last output record is on the broker. Group-join time does not count, and
output that leaves in batches does not distort it (one task processing records
one by one hands on a whole chunk's output at once, which would make "first
output to last" meaningless). Afterwards the output is read back and
checked: every input record exactly once, and in input offset order per input
partition.

In the same run, the same workload on faust-streaming with agent ``concurrency``
= 1, 8, 32, 128, where faust installs (it is not a dependency of this project:
``pip install faust-streaming``). Each faust setting runs as a worker in a child
process (``faust.Worker``), ended once its output is complete. Note that the two
knobs differ in scope: ``num.threads.per.task`` bounds the records in flight per
task (here 4 tasks), faust's ``concurrency`` is the number of agent actors in
the worker, all sharing the input.

Run: ``python benchmarks/in_flight.py`` (starts the test broker),
``--bootstrap host:port`` for an existing broker, or ``--memory`` for the
embedded broker (streamloop only: faust needs Kafka). ``--exactly-once`` runs streamloop under
``exactly_once_v2`` (a record's output is held until the commit covers it) and reads the output
``read_committed``; faust is left out then (it has no exactly-once for agents).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.peers.aiokafka_in_flight import PeerThread
from benchmarks.thread_cpu import named_threads_cpu_ns, thread_cpu_ns
from streamloop import KafkaStreams, StreamsBuilder
from streamloop.records import TopicPartition as EngineTP
from streamloop.serdes import BytesSerde
from streamloop.transport import open_transport
from streamloop.transport.base import ProducerSettings

PARTITIONS = 4
IO_SECONDS = 0.005
LEVELS = (1, 8, 32, 128)
RUN_TIMEOUT = 120.0
# The faust worker runs this very file; resolved once, not inside the event loop.
THIS_FILE = str(Path(__file__).resolve())


async def simulated_io(value: bytes) -> bytes:
    """The processor under test: 5 ms of waiting per record, no CPU to speak of.

    The output value carries the wall-clock time its processing started, so the
    run can be timed from the first record taken up, whichever process ran it.
    """
    started = time.time()
    await asyncio.sleep(IO_SECONDS)
    return b"%s@%.6f" % (value, started)


def input_record(partition: int, seq: int) -> tuple[bytes, bytes]:
    """Key and value of the ``seq``-th record of an input partition.

    The key names the input partition, so all of its records land on one output
    partition and their order can be checked there.
    """
    return f"p{partition}".encode(), f"{partition}:{seq}".encode()


@dataclass
class Result:
    name: str
    level: int
    records: int
    seconds: float
    check: str
    # CPU time of the thread that runs the records (streamloop's stream thread, the aiokafka peer's
    # loop thread) from the first output seen to the output complete, and the records output
    # meanwhile: start-up and group join left out. None: not measured (faust).
    cpu_ns: int | None = None
    cpu_records: int = 0

    @property
    def cpu_us_per_record(self) -> float | None:
        return None if self.cpu_ns is None or self.cpu_records <= 0 else self.cpu_ns / 1000 / self.cpu_records

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds else float("inf")


# -- the broker side: real Kafka through aiokafka, or the embedded broker -----


def _quiet_not_leader(record: logging.LogRecord) -> bool:
    return "NotLeaderForPartition" not in record.getMessage()


class KafkaSide:
    """Topics, input and output of one real broker, through aiokafka (not the engine).

    ``read_committed``: the output is counted and read as a ``read_committed`` consumer sees it (the
    offsets of transaction markers are no records)."""

    def __init__(self, bootstrap: str, read_committed: bool = False) -> None:
        self.bootstrap = bootstrap
        self.isolation = "read_committed" if read_committed else "read_uncommitted"

    async def create_topics(self, names: list[str]) -> None:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic

        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(n, PARTITIONS, 1) for n in names])
        finally:
            await admin.close()

    async def produce(self, topic: str, count: int) -> None:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=20, max_batch_size=256 * 1024)
        # A fresh topic's partitions answer "not leader" for a moment; aiokafka retries them.
        sender_log = logging.getLogger("aiokafka.producer.sender")
        sender_log.addFilter(_quiet_not_leader)
        await producer.start()
        try:
            for i in range(count):
                key, value = input_record(i % PARTITIONS, i // PARTITIONS)
                await producer.send(topic, value, key=key, partition=i % PARTITIONS)
            await producer.flush()
        finally:
            await producer.stop()
            sender_log.removeFilter(_quiet_not_leader)

    async def output_total(self, topic: str) -> Callable[[], Awaitable[int]]:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, isolation_level=self.isolation)
        await consumer.start()
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        self._closers = [consumer.stop]
        if self.isolation == "read_uncommitted":

            async def total() -> int:
                return sum((await consumer.end_offsets(tps)).values())

            return total
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        seen = [0]

        async def committed_total() -> int:
            # Transaction markers take offsets: committed records are counted as they are read.
            for records in (await consumer.getmany(timeout_ms=10, max_records=10_000)).values():
                seen[0] += len(records)
            return seen[0]

        return committed_total

    async def close_watch(self) -> None:
        for close in self._closers:
            await close()

    async def read_values(self, topic: str) -> list[bytes]:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                                    isolation_level=self.isolation)
        await consumer.start()
        try:
            tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            values: list[bytes] = []
            while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
                for records in (await consumer.getmany(timeout_ms=200, max_records=10_000)).values():
                    values.extend(r.value for r in records)
            return values
        finally:
            await consumer.stop()


class MemorySide:
    """The same on the embedded broker, through the engine's transport."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.transport = open_transport({"bootstrap.servers": bootstrap})

    async def create_topics(self, names: list[str]) -> None:
        admin = self.transport.admin("bench-admin")
        await admin.start()
        try:
            await admin.create_topics(dict.fromkeys(names, PARTITIONS))
        finally:
            await admin.close()

    async def produce(self, topic: str, count: int) -> None:
        producer = self.transport.producer(ProducerSettings(client_id="bench-producer"))
        await producer.start()
        try:
            for i in range(count):
                key, value = input_record(i % PARTITIONS, i // PARTITIONS)
                producer.append(topic, i % PARTITIONS, key, value, None, ())
                if i % 1000 == 999:
                    await producer.flush()
            await producer.flush()
        finally:
            await producer.close()

    async def output_total(self, topic: str) -> Callable[[], Awaitable[int]]:
        reader = self.transport.reader("bench-watch")
        await reader.start()
        tps = [EngineTP(topic, p) for p in range(PARTITIONS)]
        self._closers = [reader.close]

        async def total() -> int:
            return sum((await reader.end_offsets(tps)).values())

        return total

    async def close_watch(self) -> None:
        for close in self._closers:
            await close()

    async def read_values(self, topic: str) -> list[bytes]:
        reader = self.transport.reader("bench-read")
        await reader.start()
        try:
            tps = [EngineTP(topic, p) for p in range(PARTITIONS)]
            reader.assign(tps)
            for tp in tps:
                reader.seek(tp, 0)
            ends = await reader.end_offsets(tps)
            seen = dict.fromkeys(tps, 0)
            values: list[bytes] = []
            while any(seen[tp] < ends[tp] for tp in tps):
                for tp, records in (await reader.poll(100, 10_000)).items():
                    values.extend(r.value for r in records)
                    if records:
                        seen[EngineTP(tp.topic, tp.partition)] = records[-1].offset + 1
            return values
        finally:
            await reader.close()


Side = KafkaSide | MemorySide


def first_start(values: list[bytes]) -> float:
    return min(float(v.rsplit(b"@", 1)[1]) for v in values)


def check_output(values: list[bytes], count: int) -> str:
    """'exact, in order' or what is wrong: missing, duplicated or reordered records."""
    per_partition: dict[int, list[int]] = {}
    for value in values:
        p, seq = value.split(b"@", 1)[0].decode().split(":")
        per_partition.setdefault(int(p), []).append(int(seq))
    unique = {(p, s) for p, seqs in per_partition.items() for s in seqs}
    problems = []
    if len(unique) < count:
        problems.append(f"{count - len(unique)} missing")
    if len(values) > len(unique):
        problems.append(f"{len(values) - len(unique)} duplicates")
    reordered = sum(1 for seqs in per_partition.values() for a, b in itertools.pairwise(seqs) if b < a)
    problems.append(f"{reordered} out of order" if reordered else "in order")
    return ", ".join(problems) if len(problems) > 1 else f"exact, {problems[0]}"


async def measure(side: Side, name: str, level: int, source: str, sink: str, count: int,
                  run: Callable[[asyncio.Event], Awaitable[None]],
                  failed: Callable[[], str | None] = lambda: None,
                  status: Callable[[], str] = lambda: "",
                  cpu_ns: Callable[[], int | None] = lambda: None) -> Result:
    """Run ``run`` until ``count`` records are out on ``sink``; seconds from the first
    record taken up to the last one out, and ``cpu_ns()`` (the processing thread's CPU) then."""
    total = await side.output_total(sink)
    stop = asyncio.Event()
    runner = asyncio.create_task(run(stop))
    deadline = time.monotonic() + RUN_TIMEOUT
    first: tuple[int, int] | None = None  # (records out, thread CPU) when output was first seen
    cpu: int | None = None
    try:
        while True:
            out = await total()
            if first is None and out > 0:
                first_cpu = cpu_ns()
                first = None if first_cpu is None else (out, first_cpu)
            if out >= count:
                done_at = time.time()
                last_cpu = cpu_ns()
                if first is not None and last_cpu is not None:
                    cpu = last_cpu - first[1]
                break
            if runner.done():
                runner.result()  # raises what ended it
                raise RuntimeError(f"{name} stopped with {out} of {count} records out")
            if (why := failed()) is not None:
                raise RuntimeError(why)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{sink}: {out} of {count} records after {RUN_TIMEOUT:.0f} s {status()}")
            await asyncio.sleep(0.02)
    finally:
        await side.close_watch()
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
    values = await side.read_values(sink)
    result = Result(name, level, count, done_at - first_start(values), check_output(values, count), cpu,
                    count - (first[0] if first else count))
    per_record = result.cpu_us_per_record
    cpu_text = "" if per_record is None else f", thread CPU {per_record:5.1f} µs/record"
    print(f"  {name:<34} {count:>6} records out in {result.seconds:6.2f} s = {result.rate:>8,.0f} records/s"
          f"{cpu_text}   [{result.check}] (load {os.getloadavg()[0]:.1f})", flush=True)
    return result


async def fresh_topics(side: Side, tag: str, count: int) -> tuple[str, str]:
    run_id = uuid.uuid4().hex[:6]
    source, sink = f"inflight-{tag}-in-{run_id}", f"inflight-{tag}-out-{run_id}"
    await side.create_topics([source, sink])
    await side.produce(source, count)
    return source, sink


# -- streamloop ----------------------------------------------------------------


async def run_streamloop(side: Side, level: int, count: int, exactly_once: bool = False) -> Result:
    source, sink = await fresh_topics(side, f"sl{level}", count)
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=BytesSerde(), value_serde=BytesSerde())
            .map_values(simulated_io)
            .to(sink, key_serde=BytesSerde(), value_serde=BytesSerde()))
    topology = builder.build()

    clients: list[KafkaStreams] = []

    def status() -> str:
        if not clients:
            return "(the client was not made)"
        polled = sum(m.value for m in clients[0].metrics() if m.name == "records-polled-total")
        return f"(client {clients[0].state.name}, {polled:.0f} records polled)"

    async def run(stop: asyncio.Event) -> None:
        config = {
            "application.id": f"bench-inflight-{uuid.uuid4().hex[:6]}-{level}",
            "bootstrap.servers": side.bootstrap,
            "num.stream.threads": 1,
            "num.threads.per.task": level,
            "processing.ordering": "partition",
            "commit.interval.ms": 1000,
            "linger.ms": 5,
        }
        if exactly_once:
            # Output is visible at each commit: the guarantee's own default interval (100 ms).
            config["processing.guarantee"] = "exactly_once_v2"
            del config["commit.interval.ms"]
        streams = KafkaStreams(topology, config)
        clients.append(streams)
        async with streams:
            await stop.wait()

    name = f"streamloop{' eos' if exactly_once else ''} threads.per.task={level}"
    return await measure(side, name, level, source, sink, count, run, status=status,
                         cpu_ns=lambda: named_threads_cpu_ns("StreamThread"))


# -- the hand-written aiokafka loop ----------------------------------------------


async def run_aiokafka(side: KafkaSide, level: int, count: int) -> Result:
    source, sink = await fresh_topics(side, f"raw{level}", count)
    peer = PeerThread(side.bootstrap, f"bench-inflight-raw-{uuid.uuid4().hex[:6]}-{level}", source, sink, level,
                      simulated_io)

    async def run(stop: asyncio.Event) -> None:
        peer.start()
        try:
            await stop.wait()
        finally:
            await asyncio.to_thread(peer.stop)

    def failed() -> str | None:
        if peer.error is not None:
            return f"the aiokafka loop failed: {peer.error!r}"
        return None

    def cpu() -> int | None:
        return None if peer.native_id is None else thread_cpu_ns(peer.native_id)

    return await measure(side, f"raw aiokafka in flight per partition={level}", level, source, sink, count, run,
                         failed, cpu_ns=cpu)


# -- faust-streaming -----------------------------------------------------------


def faust_problem() -> str | None:
    """None when faust-streaming imports here, else why not."""
    try:
        import faust  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install
        return f"{type(exc).__name__}: {exc}"
    return None


def faust_worker(bootstrap: str, app_id: str, source: str, sink: str, concurrency: int, workdir: str) -> None:
    """The child process: a faust app with one agent, run by ``faust.Worker`` until terminated."""
    import faust

    app = faust.App(
        app_id,
        broker=f"kafka://{bootstrap}",
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=False,
        topic_disable_leader=True,
        consumer_auto_offset_reset="earliest",
        datadir=workdir,
        broker_commit_every=1000,
        producer_linger_ms=5,
    )
    source_topic = app.topic(source, key_type=bytes, value_type=bytes, partitions=PARTITIONS)
    sink_topic = app.topic(sink, key_type=bytes, value_type=bytes, partitions=PARTITIONS)

    @app.agent(source_topic, concurrency=concurrency)
    async def process(stream):  # type: ignore[no-untyped-def]
        async for key, value in stream.items():
            await sink_topic.send(key=key, value=await simulated_io(value))

    faust.Worker(app, loglevel="WARNING", quiet=True, workdir=workdir).execute_from_commandline()


async def run_faust(side: KafkaSide, level: int, count: int) -> Result:
    source, sink = await fresh_topics(side, f"faust{level}", count)
    with tempfile.TemporaryDirectory(prefix="faust-bench-") as workdir:
        log_path = Path(workdir, "worker.log")
        command = [sys.executable, THIS_FILE, "--faust-worker",
                   "--bootstrap", side.bootstrap, "--app-id", f"bench-faust-{uuid.uuid4().hex[:6]}-{level}",
                   "--source", source, "--sink", sink, "--concurrency", str(level), "--workdir", workdir]
        # Starting the worker returns at once (Popen does not wait for it); the loop then watches it.
        with log_path.open("wb") as log:  # noqa: ASYNC230 - a local file, opened once before the run
            proc = subprocess.Popen(  # noqa: ASYNC220 - see above
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

        def tail() -> str:
            lines = log_path.read_text(errors="replace").strip().splitlines()
            return " | ".join(lines[-6:]) or "(no output)"

        def failed() -> str | None:
            code = proc.poll()
            return None if code is None else f"faust worker exited with code {code}: {tail()}"

        async def run(stop: asyncio.Event) -> None:
            await stop.wait()

        try:
            return await measure(side, f"faust concurrency={level}", level, source, sink, count, run,
                                 failed, lambda: f"; worker log: {tail()}")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    await asyncio.to_thread(proc.wait, 20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    await asyncio.to_thread(proc.wait)


# -- the run -------------------------------------------------------------------


def records_for(level: int, base: int, cap: int) -> int:
    return max(base, min(base * level, cap))


def print_summary(title: str, results: dict[int, Result], in_flight_per_level: int) -> None:
    """One row per setting; "I/O bound" is what the records in flight allow if CPU cost nothing."""
    if not results:
        return
    one = results.get(1)
    print(f"\n  {title}")
    print(f"  {'setting':>8} {'in flight':>9} {'records':>8} {'records/s':>10} {'I/O bound':>10} "
          f"{'speed-up':>9} {'CPU µs/rec':>10}  output")
    for level, r in results.items():
        speed_up = f"{r.rate / one.rate:.1f}x" if one else "-"
        in_flight = level * in_flight_per_level
        cpu = "-" if r.cpu_us_per_record is None else f"{r.cpu_us_per_record:.1f}"
        print(f"  {level:>8} {in_flight:>9} {r.records:>8} {r.rate:>10,.0f} {in_flight / IO_SECONDS:>10,.0f} "
              f"{speed_up:>9} {cpu:>10}  {r.check}")


async def main_async(bootstrap: str, memory: bool, levels: list[int], base: int, cap: int,
                     with_faust: bool, exactly_once: bool = False, with_raw: bool = True) -> None:
    side: Side = MemorySide(bootstrap) if memory else KafkaSide(bootstrap, read_committed=exactly_once)
    where = "embedded broker" if memory else "Kafka broker"
    guarantee = "exactly_once_v2, output read read_committed" if exactly_once else "at_least_once"
    print(f"async map_values awaiting {IO_SECONDS * 1000:.0f} ms per record; {PARTITIONS} input partitions, "
          f"1 stream thread, processing.ordering=partition, {guarantee}; {where} {bootstrap}\n", flush=True)

    ours: dict[int, Result] = {}
    raw: dict[int, Result] = {}
    # The raw loop has no exactly-once; each of its runs follows streamloop's at the same level.
    with_raw = with_raw and isinstance(side, KafkaSide) and not exactly_once
    for level in levels:
        ours[level] = await run_streamloop(side, level, records_for(level, base, cap), exactly_once)
        if with_raw and isinstance(side, KafkaSide):
            raw[level] = await run_aiokafka(side, level, records_for(level, base, cap))

    theirs: dict[int, Result] = {}
    faust_note = None
    if exactly_once:
        faust_note = "faust-streaming: not run under --exactly-once (its agents have no exactly-once)"
    elif not with_faust:
        faust_note = "faust-streaming: not run (--no-faust)"
    elif memory:
        faust_note = "faust-streaming: not run: it needs a real Kafka broker, not the embedded one (--memory)"
    elif (problem := faust_problem()) is not None:
        faust_note = (f"faust-streaming: NOT RUN, it does not import here ({problem}); "
                      f"install it with `pip install faust-streaming` to compare")
    else:
        import faust

        print(f"\n  faust-streaming {faust.__version__}, one worker process, agent concurrency:", flush=True)
        for level in levels:
            try:
                theirs[level] = await run_faust(side, level, records_for(level, base, cap))
            except Exception as exc:
                faust_note = (f"faust-streaming: FAILED at concurrency={level}: {type(exc).__name__}: {exc}")
                break

    print_summary(f"streamloop: num.threads.per.task, records in flight per task ({PARTITIONS} tasks)",
                  ours, PARTITIONS)
    print_summary(f"raw aiokafka: records in flight per partition ({PARTITIONS} partitions)", raw, PARTITIONS)
    print_summary("faust-streaming: agent concurrency, actors sharing the input in one worker", theirs, 1)
    if ours and raw:
        print(f"\n  streamloop against the raw aiokafka loop, same records in flight per task/partition:\n"
              f"  {'in flight':>9} {'streamloop rec/s':>17} {'raw rec/s':>10} {'ratio':>7} "
              f"{'streamloop CPU µs/rec':>22} {'raw CPU µs/rec':>15}")
        for level in levels:
            if level in ours and level in raw:
                a, b = ours[level], raw[level]
                print(f"  {level:>9} {a.rate:>17,.0f} {b.rate:>10,.0f} {a.rate / b.rate:>6.2f}x "
                      f"{a.cpu_us_per_record or 0:>22.1f} {b.cpu_us_per_record or 0:>15.1f}")
    if ours and theirs:
        print(f"\n  side by side, same setting:\n  {'setting':>8} {'streamloop rec/s':>17} {'faust rec/s':>12} "
              f"{'ratio':>7}")
        for level in levels:
            if level in ours and level in theirs:
                print(f"  {level:>8} {ours[level].rate:>17,.0f} {theirs[level].rate:>12,.0f} "
                      f"{ours[level].rate / theirs[level].rate:>6.1f}x")
        # streamloop's setting N lets N records per task, so PARTITIONS * N in all, be in flight.
        same = [(n, m) for n in ours for m in theirs if n * PARTITIONS == m]
        if same:
            print(f"\n  side by side, same records in flight:\n  {'in flight':>9} {'streamloop rec/s':>24} "
                  f"{'faust rec/s':>20} {'ratio':>7}")
            for n, m in same:
                print(f"  {m:>9} {ours[n].rate:>10,.0f} (per task {n:>3}) {theirs[m].rate:>8,.0f} "
                      f"(concurrency {m:>3}) {ours[n].rate / theirs[m].rate:>6.1f}x")
    if faust_note:
        print(f"\n  {faust_note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", help="an existing broker; default: start the test broker")
    parser.add_argument("--memory", action="store_true", help="run on the embedded broker (no faust)")
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)),
                        help="settings of num.threads.per.task / faust concurrency, comma-separated")
    parser.add_argument("--records", type=int, default=1000,
                        help="records per run at setting 1; scaled by the setting up to --max-records")
    parser.add_argument("--max-records", type=int, default=24_000)
    parser.add_argument("--no-faust", action="store_true", help="skip the faust-streaming comparison")
    parser.add_argument("--no-raw", action="store_true", help="skip the hand-written aiokafka loop")
    parser.add_argument("--exactly-once", action="store_true",
                        help="streamloop under exactly_once_v2, output read read_committed (Kafka only)")
    # The faust child process (internal).
    parser.add_argument("--faust-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--app-id", help=argparse.SUPPRESS)
    parser.add_argument("--source", help=argparse.SUPPRESS)
    parser.add_argument("--sink", help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.faust_worker:
        faust_worker(args.bootstrap, args.app_id, args.source, args.sink, args.concurrency, args.workdir)
        return
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    run = lambda bootstrap: asyncio.run(main_async(  # noqa: E731
        bootstrap, args.memory, levels, args.records, args.max_records, not args.no_faust, args.exactly_once,
        not args.no_raw))
    if args.memory:
        run(f"memory://in-flight-bench-{uuid.uuid4().hex[:6]}")
    elif args.bootstrap:
        run(args.bootstrap)
    else:
        from tests.support.kafka_broker import KafkaBroker

        with KafkaBroker() as broker:
            run(broker.bootstrap)


if __name__ == "__main__":
    main()
