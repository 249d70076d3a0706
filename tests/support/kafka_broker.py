"""A real, single-node Apache Kafka broker (KRaft) for the ``kafka`` tests.

The broker's jars come from Maven Central through ``tests/support/kafka/pom.xml``
(``mvn dependency:copy-dependencies``) into the git-ignored cache
``.cache/kafka/<version>/libs`` under the repository root. They are fetched
once; a marker file records a complete fetch (and the pom it came from).

Usage::

    from tests.support.kafka_broker import KafkaBroker

    with KafkaBroker() as broker:          # fetch (if needed) + start
        use(broker.bootstrap)              # "127.0.0.1:<port>"

or, as a pytest session fixture::

    @pytest.fixture(scope="session")
    def kafka_broker():
        yield from kafka_broker_session()

Command line (run from the repository root)::

    python -m tests.support.kafka_broker fetch   # only fetch the jars (for make/CI)
    python -m tests.support.kafka_broker run     # start, print the bootstrap address, wait for Ctrl-C

Needs ``java`` (17+) on PATH to run and ``mvn`` on PATH to fetch; without them
:class:`KafkaToolingError` says which one is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import concurrent.futures
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType

from tests.support.ports import free_port

__all__ = [
    "KAFKA_VERSION",
    "KafkaBroker",
    "KafkaToolingError",
    "cache_dir",
    "fetch",
    "kafka_broker_session",
]

KAFKA_VERSION = "4.1.1"

_SUPPORT_DIR = Path(__file__).resolve().parent / "kafka"
_POM = _SUPPORT_DIR / "pom.xml"
_LOG_CONFIG = _SUPPORT_DIR / "log4j2.properties"
_REPO_ROOT = Path(__file__).resolve().parents[2]
_MARKER = "fetch-complete.json"

# Small heap and a simple collector: the test broker holds little data, and a
# small JVM starts faster and leaves the machine's cores to the tests.
DEFAULT_JVM_OPTS: tuple[str, ...] = (
    "-Xms256m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
)
# The short-lived storage tool only needs to start quickly.
_TOOL_JVM_OPTS: tuple[str, ...] = (
    "-Xms64m",
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
)


class KafkaToolingError(RuntimeError):
    """The broker could not be fetched or started (names what is missing or failed)."""


def cache_dir(version: str = KAFKA_VERSION) -> Path:
    """``<repo>/.cache/kafka/<version>``; its ``libs/`` holds the broker's jars."""
    return _REPO_ROOT / ".cache" / "kafka" / version


def _require(tool: str, why: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise KafkaToolingError(
            f"'{tool}' is not on PATH; it is needed {why}. "
            f"Install it (e.g. the Debian packages openjdk-17-jre-headless for java, maven for mvn)."
        )
    return path


def _pom_digest() -> str:
    return hashlib.sha256(_POM.read_bytes()).hexdigest()


def _fetch_is_complete(version: str) -> bool:
    base = cache_dir(version)
    marker = base / _MARKER
    try:
        info = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    libs = base / "libs"
    if info.get("pom_sha256") != _pom_digest() or info.get("version") != version:
        return False
    jars = info.get("jars") or []
    return bool(jars) and all((libs / jar).is_file() for jar in jars)


def fetch(version: str = KAFKA_VERSION, *, force: bool = False) -> Path:
    """Make sure the jars of Kafka ``version`` are in the cache; return the ``libs`` dir.

    Does nothing (and needs no ``mvn``) when a complete fetch of the same pom is
    already there. Safe to call from several processes at once (file lock).
    """
    base = cache_dir(version)
    libs = base / "libs"
    if not force and _fetch_is_complete(version):
        return libs
    base.parent.mkdir(parents=True, exist_ok=True)
    lock_path = base.parent / f".{version}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not force and _fetch_is_complete(version):
                return libs
            mvn = _require("mvn", "to fetch the Kafka broker jars from Maven Central")
            base.mkdir(parents=True, exist_ok=True)
            (base / _MARKER).unlink(missing_ok=True)
            staging = base / "libs.partial"
            shutil.rmtree(staging, ignore_errors=True)
            cmd = [
                mvn,
                "-q",
                "-B",
                "-f",
                str(_POM),
                f"-Dkafka.version={version}",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={staging}",
                "dependency:copy-dependencies",
            ]
            proc = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                check=False,
            )
            jars = sorted(p.name for p in staging.glob("*.jar")) if staging.is_dir() else []
            if proc.returncode != 0 or not any(j.startswith("kafka_2.13-") for j in jars):
                raise KafkaToolingError(
                    f"Fetching Kafka {version} with Maven failed (exit {proc.returncode}):\n"
                    f"{_tail(proc.stdout, 40)}"
                )
            shutil.rmtree(libs, ignore_errors=True)
            staging.rename(libs)
            (base / _MARKER).write_text(
                json.dumps(
                    {"version": version, "pom_sha256": _pom_digest(), "jars": jars}, indent=1
                )
            )
            return libs
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _file_tail(path: Path, lines: int = 60) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return f"(no {path.name})"
    return _tail(data, lines)


def _port_accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _probe_metadata(bootstrap: str, timeout: float) -> int:
    """Ask the broker for cluster metadata with aiokafka; return how many brokers it lists.

    Runs on its own event loop in a worker thread, so it works whether or not the
    caller is inside a running loop. A KRaft broker lists itself only once it is
    registered and unfenced, i.e. ready to host topics.
    """

    async def probe() -> int:
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(
            bootstrap_servers=bootstrap,
            client_id="streamloop-broker-probe",
            request_timeout_ms=max(1000, int(timeout * 1000)),
        )
        try:
            await asyncio.wait_for(admin.start(), timeout)
            cluster = await asyncio.wait_for(admin.describe_cluster(), timeout)
            return len(cluster.get("brokers") or [])
        finally:
            await admin.close()

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kafka-probe") as pool:
        return pool.submit(asyncio.run, probe()).result()


_live: set[KafkaBroker] = set()
_live_lock = threading.Lock()


@atexit.register
def _stop_leftovers() -> None:
    with _live_lock:
        leftovers = list(_live)
    for broker in leftovers:
        with contextlib.suppress(Exception):
            broker.stop(timeout=5.0)


class KafkaBroker:
    """One KRaft node (``process.roles=broker,controller``) on free loopback ports.

    ``properties`` override or add ``server.properties`` entries. Every broker
    has its own temp dir for data and logs (``server.log``, ``stdout.log``),
    removed by :meth:`stop` unless ``keep_dir`` is true.
    """

    def __init__(
        self,
        *,
        version: str = KAFKA_VERSION,
        properties: Mapping[str, object] | None = None,
        start_timeout: float = 60.0,
        jvm_opts: tuple[str, ...] = DEFAULT_JVM_OPTS,
        keep_dir: bool = False,
    ) -> None:
        self.version = version
        self.properties = dict(properties or {})
        self.start_timeout = start_timeout
        self.jvm_opts = tuple(jvm_opts)
        self.keep_dir = keep_dir
        self.port: int | None = None
        self.controller_port: int | None = None
        self.dir: Path | None = None
        self.startup_seconds: float | None = None
        """Wall time of the last :meth:`start` (storage format + JVM start + readiness)."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._stdout: object | None = None
        self._paused = False

    # -- info -------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """``"127.0.0.1:<port>"``; valid from :meth:`start` to :meth:`stop` (also while the
        process is stopped or paused by a fault: the address does not change)."""
        if self.port is None:
            raise KafkaToolingError("the broker is not started")
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path | None:
        return None if self.dir is None else self.dir / "server.log"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        """The last lines of the broker's log and of the JVM's own output."""
        if self.dir is None:
            return "(the broker has no log dir)"
        return (
            f"--- {self.dir / 'server.log'} ---\n{_file_tail(self.dir / 'server.log', lines)}\n"
            f"--- {self.dir / 'stdout.log'} ---\n{_file_tail(self.dir / 'stdout.log', 20)}"
        )

    # -- lifecycle --------------------------------------------------------------------

    def fetch(self) -> Path:
        """Fetch the jars into the cache unless already there; return the ``libs`` dir."""
        return fetch(self.version)

    def start(self) -> KafkaBroker:
        """Fetch if needed, format the storage, start the JVM and wait until it serves metadata."""
        if self._proc is not None:
            raise KafkaToolingError("the broker is already started")
        java = _require("java", "to run the Kafka test broker")
        libs = self.fetch()
        t0 = time.monotonic()
        last_error: KafkaToolingError | None = None
        for _attempt in range(3):
            try:
                self._start_once(java, libs, t0)
                self.startup_seconds = time.monotonic() - t0
                with _live_lock:
                    _live.add(self)
                return self
            except _PortClash as clash:  # another process took a port between pick and bind
                last_error = KafkaToolingError(str(clash))
                continue
        assert last_error is not None
        raise last_error

    def _start_once(self, java: str, libs: Path, t0: float) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="streamloop-kafka-"))
        try:
            self.port = free_port()
            self.controller_port = free_port(exclude=(self.port,))
            config = self.dir / "server.properties"
            config.write_text(self._server_properties())
            tool = [java, *_TOOL_JVM_OPTS, *self._log_opts(), "-cp", str(libs / "*"), "kafka.tools.StorageTool"]
            cluster_id = self._run_tool([*tool, "random-uuid"]).strip().splitlines()[-1].strip()
            self._run_tool([*tool, "format", "-t", cluster_id, "-c", str(config)])
            self._launch(java, libs, t0 + self.start_timeout)
        except BaseException:
            clash = self._log_mentions("Address already in use")
            self.stop()
            if clash:
                raise _PortClash("a port picked for the broker was taken meanwhile") from None
            raise

    def _log_opts(self) -> tuple[str, ...]:
        return (f"-Dlog4j2.configurationFile={_LOG_CONFIG}", f"-Dkafka.logs.dir={self.dir}")

    def _launch(self, java: str, libs: Path, deadline: float) -> None:
        """Start the JVM on the formatted dir and the picked ports; wait until it serves metadata."""
        assert self.dir is not None
        if self._stdout is None:
            self._stdout = open(self.dir / "stdout.log", "ab")  # noqa: SIM115 (closed in stop)
        self._proc = subprocess.Popen(
            [java, *self.jvm_opts, *self._log_opts(), "-cp", str(libs / "*"), "kafka.Kafka",
             str(self.dir / "server.properties")],
            cwd=self.dir,
            stdin=subprocess.DEVNULL,
            stdout=self._stdout,  # type: ignore[arg-type]
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in a terminal reaches us, not the JVM
        )
        self._paused = False
        self._wait_ready(deadline)

    # -- faults: the same broker (data dir, ports) goes away and comes back --------------

    def stop_process(self, *, kill: bool = False, timeout: float = 15.0) -> None:
        """Stop the JVM (SIGTERM, a controlled shutdown; SIGKILL with ``kill``) and keep its data
        dir and ports, so that :meth:`start_process` brings the same broker back."""
        if self.dir is None or self.port is None:
            raise KafkaToolingError("the broker is not started")
        proc, self._proc = self._proc, None
        if proc is not None:
            _end_process(proc, signal.SIGKILL if kill else signal.SIGTERM, timeout)
        self._paused = False

    def start_process(self) -> None:
        """Start the JVM stopped by :meth:`stop_process` again on the same dir and ports.

        Raises ``KafkaToolingError`` when a port was taken meanwhile (the broker cannot move:
        its clients know it by address).
        """
        if self.dir is None or self.port is None:
            raise KafkaToolingError("the broker was never started (or is stopped for good)")
        if self.running:
            raise KafkaToolingError("the broker process is already running")
        self._proc = None
        t0 = time.monotonic()
        try:
            self._launch(_require("java", "to run the Kafka test broker"), self.fetch(), t0 + self.start_timeout)
        except BaseException:
            proc, self._proc = self._proc, None
            if proc is not None:
                _end_process(proc, signal.SIGKILL, 10)
            raise
        self.startup_seconds = time.monotonic() - t0

    def restart(self, *, kill: bool = False) -> None:
        """:meth:`stop_process` then :meth:`start_process`: the broker is gone for as long as
        its shutdown and start take (a few seconds)."""
        self.stop_process(kill=kill)
        self.start_process()

    def bounce(self, seconds: float, *, kill: bool = False) -> None:
        """Stop the broker, keep it down ``seconds``, start it again (blocking: call it from a
        worker thread in async code)."""
        self.stop_process(kill=kill)
        time.sleep(seconds)
        self.start_process()

    def pause(self) -> None:
        """Freeze the JVM (SIGSTOP): connections stay open and nothing answers, like a broker in a
        long GC pause or on a partitioned network."""
        if not self.running:
            raise KafkaToolingError("the broker process is not running")
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """Thaw the JVM frozen by :meth:`pause` (SIGCONT)."""
        if self._proc is not None and self._paused:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signal.SIGCONT)
        self._paused = False

    @property
    def paused(self) -> bool:
        return self._paused

    def _run_tool(self, cmd: list[str]) -> str:
        proc = subprocess.run(
            cmd,
            cwd=self.dir,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if proc.returncode != 0:
            raise KafkaToolingError(
                f"{' '.join(cmd[-3:])} failed (exit {proc.returncode}):\n"
                f"{_tail(proc.stdout + proc.stderr, 30)}"
            )
        return proc.stdout

    def _wait_ready(self, deadline: float) -> None:
        assert self._proc is not None and self.port is not None
        bootstrap = f"127.0.0.1:{self.port}"
        last: BaseException | None = None
        while True:
            code = self._proc.poll()
            if code is not None:
                raise KafkaToolingError(
                    f"the Kafka broker exited with code {code} while starting\n{self.log_tail()}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KafkaToolingError(
                    f"the Kafka broker did not answer a metadata request on {bootstrap} within "
                    f"{self.start_timeout:.0f} s (last error: {last!r})\n{self.log_tail()}"
                )
            if _port_accepts(self.port):
                try:
                    if _probe_metadata(bootstrap, min(5.0, max(1.0, remaining))) > 0:
                        return
                    last = KafkaToolingError("metadata lists no broker yet")
                except Exception as exc:  # not ready yet: refused, timed out, …
                    last = exc
            time.sleep(0.05)

    def _log_mentions(self, text: str) -> bool:
        if self.dir is None:
            return False
        return any(
            text in _file_tail(self.dir / name, 200) for name in ("server.log", "stdout.log")
        )

    def _server_properties(self) -> str:
        assert self.dir is not None
        props: dict[str, object] = {
            "process.roles": "broker,controller",
            "node.id": 1,
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.dir / "data"),
            "num.partitions": 1,
            "auto.create.topics.enable": "false",
            "delete.topic.enable": "true",
            "offsets.topic.replication.factor": 1,
            "offsets.topic.num.partitions": 1,
            "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1,
            "transaction.state.log.num.partitions": 1,
            "share.coordinator.state.topic.replication.factor": 1,
            "share.coordinator.state.topic.min.isr": 1,
            "group.initial.rebalance.delay.ms": 0,
            # Let tests use short session timeouts (the default minimum is 6 s).
            "group.min.session.timeout.ms": 500,
            # Keep records whatever their timestamps (7 days by default): many tests stamp theirs in
            # 1970 or 2023, and the retention check (30 s after start, then every 5 minutes) would
            # delete them from input and output topics under a running test. Topics that set their
            # own retention.ms (windowed changelogs) still apply it: see tests.support.event_time.
            "log.retention.ms": -1,
        }
        props.update(self.properties)
        return "".join(f"{k}={_prop_value(v)}\n" for k, v in props.items())

    def stop(self, timeout: float = 15.0) -> None:
        """Terminate the JVM (SIGTERM; SIGKILL after ``timeout`` s) and remove the temp dir."""
        with _live_lock:
            _live.discard(self)
        self.resume()  # a frozen JVM cannot handle SIGTERM
        proc, self._proc = self._proc, None
        if proc is not None:
            _end_process(proc, signal.SIGTERM, timeout)
        if self._stdout is not None:
            self._stdout.close()  # type: ignore[attr-defined]
            self._stdout = None
        if self.dir is not None and not self.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        self.port = None
        self.controller_port = None

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"running on {self.bootstrap}" if self.running else "stopped"
        return f"<KafkaBroker {self.version} {state}>"


class _PortClash(Exception):
    pass


def _end_process(proc: subprocess.Popen[bytes], sig: signal.Signals, timeout: float) -> None:
    """Send ``sig`` and wait ``timeout`` s for the exit; SIGKILL after that."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(10)


def _prop_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def kafka_broker_session(**kwargs: object) -> Iterator[KafkaBroker]:
    """Generator for a pytest fixture: yields a started :class:`KafkaBroker`, stops it after.

    ``kwargs`` go to :class:`KafkaBroker` (``properties=``, ``start_timeout=`` …).
    """
    broker = KafkaBroker(**kwargs)  # type: ignore[arg-type]
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.kafka_broker",
        description="Fetch or run the single-node Kafka broker used by the kafka tests.",
    )
    parser.add_argument("--version", default=KAFKA_VERSION, help="Kafka version (Maven)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="fetch the broker jars into the cache (no-op when present)")
    run = sub.add_parser("run", help="start a broker and wait until Ctrl-C")
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra server.properties entry (repeatable)",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            libs = fetch(args.version)
            print(f"Kafka {args.version}: {len(list(libs.glob('*.jar')))} jars in {libs}")
            return 0
        props = dict(item.split("=", 1) for item in args.set)
        broker = KafkaBroker(version=args.version, properties=props)
        broker.start()
    except KafkaToolingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        print(broker.bootstrap, flush=True)
        print(
            f"(started in {broker.startup_seconds:.1f} s; log: {broker.log_path}; Ctrl-C stops)",
            file=sys.stderr,
            flush=True,
        )
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        with contextlib.suppress(KeyboardInterrupt):
            while not stop.wait(0.5):
                if not broker.running:
                    print(f"the broker died\n{broker.log_tail()}", file=sys.stderr)
                    return 1
    finally:
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
