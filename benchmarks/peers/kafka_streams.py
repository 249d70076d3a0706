"""Apache Kafka Streams itself, the reference: ``benchmarks/java/StreamsBench.java`` on a JVM.

Its jars (kafka-streams of the broker's version, jackson, slf4j-simple) are fetched
with Maven from ``benchmarks/java/pom.xml`` into the git-ignored
``.cache/kafka-streams-bench/<version>/libs``, and the app is compiled there with javac.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from benchmarks.dsl_workloads import DSL_WORKLOADS, parameters
from benchmarks.peers.process import PeerRun

NAME = "Kafka Streams (Java)"
KAFKA_STREAMS_VERSION = "4.1.1"  # the test broker's version (tests/support/kafka_broker.py)
JAVA_DIR = Path(__file__).resolve().parents[1] / "java"
CACHE = Path(__file__).resolve().parents[2] / ".cache" / "kafka-streams-bench" / KAFKA_STREAMS_VERSION
# Kafka Streams' knob for blocking work is the number of stream threads; 4 = one per partition.
THREADS = {"stateless": 1, "count": 1, "async-io": 4, **dict.fromkeys(DSL_WORKLOADS, 1)}


class JavaPeerError(RuntimeError):
    """java, javac or mvn is missing, or fetching or compiling the app failed (with their output)."""


def version() -> str:
    return f"kafka-streams {KAFKA_STREAMS_VERSION}"


def setting(workload: str) -> str:
    threads = THREADS[workload]
    extra = "; Thread.sleep: no async processors" if workload == "async-io" else ""
    cache = "; statestore.cache.max.bytes=0" if workload == "count" or workload in DSL_WORKLOADS else ""
    if workload == "join":
        cache += f"; grace {parameters()['join.grace.ms'] // 1000} s"
    return f"num.stream.threads={threads}{extra}{cache}"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise JavaPeerError(f"'{name}' is not on PATH (Java 17+ and Maven are needed for the Kafka Streams peer)")
    return path


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
        raise JavaPeerError(f"{what} failed (exit {proc.returncode}): {tail}")


def prepare() -> None:
    """Fetch the jars once and compile the app when its source is newer than the class."""
    libs, classes = CACHE / "libs", CACHE / "classes"
    marker = CACHE / "fetched-from-pom"
    pom = JAVA_DIR / "pom.xml"
    if not marker.is_file() or marker.read_text() != pom.read_text():
        staging = CACHE / "libs.partial"
        shutil.rmtree(staging, ignore_errors=True)
        _run([_tool("mvn"), "-q", "-B", "-f", str(pom), f"-Dkafka.version={KAFKA_STREAMS_VERSION}",
              "-DincludeScope=runtime", f"-DoutputDirectory={staging}", "dependency:copy-dependencies"],
             "fetching kafka-streams with Maven")
        shutil.rmtree(libs, ignore_errors=True)
        staging.rename(libs)
        marker.write_text(pom.read_text())
    sources = sorted(JAVA_DIR.glob("*.java"))
    compiled = classes / "StreamsBench.class"
    if not compiled.is_file() or any(compiled.stat().st_mtime < s.stat().st_mtime for s in sources):
        classes.mkdir(parents=True, exist_ok=True)
        _run([_tool("javac"), "-cp", f"{libs}/*", "-d", str(classes), *map(str, sources)],
             "compiling StreamsBench.java")


def command(run: PeerRun) -> list[str]:
    classpath = f"{CACHE / 'classes'}:{CACHE / 'libs'}/*"
    # The DSL workloads' windows and gaps, from the one place both engines take them.
    properties = [f"-Dbench.{name}={value}" for name, value in parameters().items()]
    return [_tool("java"), "-cp", classpath, f"-Djava.io.tmpdir={run.workdir}", *properties, "StreamsBench",
            run.workload, run.bootstrap, run.app_id, run.source, run.sink, str(THREADS[run.workload])]
