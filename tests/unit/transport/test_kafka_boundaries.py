"""The Kafka transport's boundaries: aiokafka only inside ``engine/transport/kafka/``, and the
transport knows nothing of the machinery that drives it (tasks, threads, the client)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
KAFKA_PACKAGE = ("engine", "transport", "kafka")
MACHINERY = ("streamloop.tasks", "streamloop.threads", "streamloop.client")


def _imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (lazy imports inside functions too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            found.add(node.module)
    return found


def _sources(root: Path, *packages: str) -> list[Path]:
    return sorted(p for package in packages for p in (root / package).rglob("*.py"))


def aiokafka_outside_transport(root: Path) -> list[str]:
    """Files of ``engine`` and ``handlers`` that import aiokafka outside the Kafka transport."""
    offenders = []
    for path in _sources(root, "engine", "handlers"):
        if path.relative_to(root).parts[:3] == KAFKA_PACKAGE:
            continue
        if any(m == "aiokafka" or m.startswith("aiokafka.") for m in _imported_modules(path)):
            offenders.append(str(path.relative_to(root)))
    return offenders


def transport_imports_of_machinery(root: Path) -> list[str]:
    """``file: module`` for each import of tasks, threads or the client by the transport."""
    return [
        f"{path.relative_to(root)}: {module}"
        for path in _sources(root, "engine/transport")
        for module in sorted(_imported_modules(path))
        if any(module == m or module.startswith(m + ".") for m in MACHINERY)
    ]


def test_aiokafka_is_imported_only_by_the_kafka_transport() -> None:
    assert aiokafka_outside_transport(ROOT) == []


def test_the_transport_imports_no_tasks_threads_or_client() -> None:
    assert transport_imports_of_machinery(ROOT) == []


def test_the_checks_see_an_offending_import(tmp_path: Path) -> None:
    (tmp_path / "engine" / "transport" / "kafka").mkdir(parents=True)
    (tmp_path / "handlers").mkdir()
    (tmp_path / "engine" / "transport" / "kafka" / "consumer.py").write_text("import aiokafka\n")
    (tmp_path / "engine" / "collector.py").write_text("def f():\n    from aiokafka.partitioner import murmur2\n")
    (tmp_path / "engine" / "transport" / "memory.py").write_text("from streamloop.tasks.task import StreamTask\n")
    assert aiokafka_outside_transport(tmp_path) == ["engine/collector.py"]
    assert transport_imports_of_machinery(tmp_path) == ["engine/transport/memory.py: streamloop.tasks.task"]


def _kafka_client_modules_after(code: str) -> list[str]:
    import subprocess
    import sys

    probe = f"{code}\nimport sys\nprint(sorted(m for m in sys.modules if m == 'aiokafka' or m.startswith('aiokafka.')))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=True)
    return [line for line in done.stdout.splitlines() if line.startswith("[")][-1:]


def test_an_application_on_the_memory_broker_never_loads_the_kafka_client() -> None:
    """The core (collector, commits, timeouts, partitioning) is transport-neutral: only a Kafka
    ``bootstrap.servers`` loads aiokafka."""
    loaded = _kafka_client_modules_after(
        "from streamloop import KafkaStreams, StreamsBuilder\n"
        "from streamloop.transport.memory import MemoryBroker\n"
        "MemoryBroker.for_url('memory://boundary').create_topics({'in': 2, 'out': 2})\n"
        "builder = StreamsBuilder()\n"
        "builder.stream('in').group_by_key().count().to_stream().to('out')\n"
        "with KafkaStreams(builder.build(), {'application.id': 'boundary', 'default.dsl.store': 'in_memory',\n"
        "                                    'bootstrap.servers': 'memory://boundary'}) as streams:\n"
        "    streams.wait_for_state(__import__('streamloop').ClientState.RUNNING, timeout=30)\n")
    assert loaded == ["[]"]
