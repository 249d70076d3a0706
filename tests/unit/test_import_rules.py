"""The shape of the code stays as docs/concepts.md ("Map of the code") draws it.

The import graph of ``engine`` and ``handlers`` is read statically (``ast``, no import
runs), from the modules found by walking the tree, so that the rules keep holding when
files are split or added. Every import statement is an edge, with when it runs:

- ``module``: at import (top of the file, a class body, ``if``/``try`` there);
- ``deferred``: inside a function. Still a runtime dependency: hiding an import in a
  function does not break a cycle, so these count as much as ``module`` ones;
- ``typing``: under ``if TYPE_CHECKING:``. Never runs. It counts for the never-edges (a
  foundation module that names a task type, even only for annotations, knows the
  machinery) but not for cycles: naming a caller's type in an annotation (``KTable.to_stream``
  returns a ``KStream``, ``KStream.group_by_key`` a ``KGroupedStream``) is what it is for.

Runtime cycles are looked for among modules, and among the children of every package (a
child is a module or a subpackage: ``streamloop.tasks`` and ``streamloop.errors`` are children of
``engine``), so that two packages that need each other are found even when no two of their
modules do. An import of a package's parent runs the parent's ``__init__`` first, but that is
not an edge: every module would depend on ``engine/__init__``, the facade that imports all.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Each package's name and its folder: the repository keeps engine/ and handlers/, which install as
# streamloop and streamloop.handlers.
PACKAGES = {"streamloop": ROOT / "engine", "streamloop.handlers": ROOT / "handlers"}

# The modules everything else is built on: they import only each other, so none of the
# machinery (threads, tasks, client, topology, transport, ...) nor the handlers.
FOUNDATION = ("streamloop.config", "streamloop.errors", "streamloop.records", "streamloop.serdes", "streamloop.clock",
              "streamloop.lifecycle", "streamloop.logcontext", "streamloop.ids", "streamloop.completed_offsets",
              "streamloop.loop_signal", "streamloop.timestamps", "streamloop.redaction")


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    kind: str  # "module", "deferred" (inside a function) or "typing" (under TYPE_CHECKING)

    def __str__(self) -> str:
        path = module_path(self.source).relative_to(ROOT)
        return f"{self.source} -> {self.target}  ({path}:{self.line}, {self.kind})"


def module_path(module: str) -> Path:
    package = max((p for p in PACKAGES if is_under(module, p)), key=len)
    base = PACKAGES[package].joinpath(*module[len(package):].split(".")[1:])
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


@cache
def modules() -> frozenset[str]:
    found = set()
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):  # rglob does not follow the engine/handlers link
            parts = (*package.split("."), *path.relative_to(folder).with_suffix("").parts)
            found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return frozenset(found)


def is_under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(body: Iterable[ast.stmt], kind: str = "module") -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement of a module, with when it runs: at import (``module``), when a
    function is called (``deferred``), or never (``typing``: under ``if TYPE_CHECKING:``)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, kind
        elif isinstance(node, ast.If):
            yield from _imports(node.body, "typing" if _is_type_checking(node.test) else kind)
            yield from _imports(node.orelse, kind)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from _imports(node.body, "typing" if kind == "typing" else "deferred")
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                for child in getattr(node, field, ()):
                    yield from _imports(getattr(child, "body", [child]) if field in ("handlers", "cases")
                                        else [child], kind)


def _resolve(importer: str, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The project modules a statement imports: ``from a import b`` is ``a.b`` when that is a
    module, else ``a`` itself. The parent packages an import runs first are not edges: every
    module would then depend on ``engine/__init__``, the public facade that imports everything."""
    known = modules()
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name in known:
                yield alias.name
        return
    base = node.module or ""
    if node.level:
        package = importer if module_path(importer).name == "__init__.py" else importer.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    if base not in known:
        return
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        yield sub if sub in known else base


@cache
def edges() -> tuple[Edge, ...]:
    found = []
    for module in sorted(modules()):
        tree = ast.parse(module_path(module).read_text(), str(module_path(module)))
        for node, kind in _imports(tree.body):
            for target in _resolve(module, node):
                if target != module:
                    found.append(Edge(module, target, node.lineno, kind))
    return tuple(found)


def runtime_edges() -> list[Edge]:
    return [e for e in edges() if e.kind != "typing"]


@dataclass(frozen=True)
class Cycle:
    members: list[str]  # the strongly connected group, sorted
    path: list[str]  # one way round it, back to where it starts
    edges: list[Edge]  # the import behind each step of the path


def find_cycles(graph: dict[str, dict[str, Edge]]) -> list[Cycle]:
    """Each strongly connected component of more than one node: its members, and one cycle
    through it as edges (break that one, run again, and the next one shows)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(node: str) -> None:  # Tarjan; the graphs are small, recursion is fine
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return [_a_cycle_in(graph, c) for c in components]


def _a_cycle_in(graph: dict[str, dict[str, Edge]], component: set[str]) -> Cycle:
    """The shortest way back to the component's first node (by name), found breadth first."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph.get(node, {})):
                if nxt not in component or nxt in came_from:
                    continue
                came_from[nxt] = node
                if nxt == start:
                    path = [start]
                    while len(path) == 1 or path[0] != start:
                        path.insert(0, came_from[path[0]])
                    steps = [graph[a][b] for a, b in itertools.pairwise(path)]
                    return Cycle(sorted(component), path, steps)
                following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle in the component {sorted(component)}")


def _describe(cycles: list[Cycle], what: str) -> str:
    lines = [f"{len(cycles)} group(s) of {what} that import each other at runtime; break each cycle by "
             "moving the shared type down (into a module both may import) or by passing a callable:"]
    for cycle in cycles:
        lines.append(f"  {', '.join(cycle.members)}; one cycle: {' -> '.join(cycle.path)}")
        lines.extend(f"      {edge}" for edge in cycle.edges)
    return "\n".join(lines)


def _graph(pairs: Iterable[tuple[str, str, Edge]]) -> dict[str, dict[str, Edge]]:
    graph: dict[str, dict[str, Edge]] = {}
    for source, target, edge in pairs:
        if source != target:
            graph.setdefault(source, {}).setdefault(target, edge)
    return graph


def _child_of(package: str, module: str) -> str | None:
    """The child of ``package`` (a module or subpackage) that holds ``module``, if any."""
    if not module.startswith(package + "."):
        return None
    return f"{package}.{module[len(package) + 1:].split('.')[0]}"


def packages() -> list[str]:
    return sorted(m for m in modules() if module_path(m).name == "__init__.py")


def test_the_graph_sees_the_imports_it_must() -> None:
    """The rules below mean something only if the graph holds the imports it should."""
    assert {"streamloop", "streamloop.handlers", "streamloop.tasks", "streamloop.errors"} <= modules()
    found = {(e.source, e.target) for e in edges()}
    assert ("streamloop", "streamloop.config") in found  # absolute, ``from streamloop.config import StreamsConfig``
    assert any(is_under(s, "streamloop.tasks") and t == "streamloop.errors" for s, t in found)
    relative = [e for e in edges() if e.source.startswith("streamloop.transport.memory.")
                and e.target.startswith("streamloop.transport.memory.")]
    assert relative, "relative imports (from .x import y) are resolved"


def test_runtime_imports_have_no_cycle_between_modules() -> None:
    cycles = find_cycles(_graph((e.source, e.target, e) for e in runtime_edges()))
    assert not cycles, _describe(cycles, "modules")


@pytest.mark.parametrize("package", packages())
def test_runtime_imports_have_no_cycle_between_the_children_of_a_package(package: str) -> None:
    pairs = []
    for edge in runtime_edges():
        source, target = _child_of(package, edge.source), _child_of(package, edge.target)
        if source is not None and target is not None:
            pairs.append((source, target, edge))
    cycles = find_cycles(_graph(pairs))
    assert not cycles, _describe(cycles, f"the children of {package}")


def _never(sources: Iterable[str], targets: Iterable[str]) -> list[Edge]:
    sources, targets = tuple(sources), tuple(targets)
    return [e for e in edges()
            if any(is_under(e.source, s) for s in sources) and any(is_under(e.target, t) for t in targets)]


def test_handlers_import_nothing_of_the_engine() -> None:
    """Handlers are the user's side: they decide with an answer and never reach into the engine."""
    wrong = [e for e in _never(["streamloop.handlers"], ["streamloop"])
             if not is_under(e.target, "streamloop.handlers")]
    assert not wrong, "handlers/ imports the engine:\n" + "\n".join(f"  {e}" for e in wrong)


def test_the_foundation_imports_only_the_foundation() -> None:
    assert all(module_path(m).exists() for m in FOUNDATION), "a foundation module was moved: update FOUNDATION"
    wrong = [e for e in edges() if any(is_under(e.source, f) for f in FOUNDATION)
             and not any(is_under(e.target, f) for f in FOUNDATION)]
    assert not wrong, "the foundation imports what is built on it:\n" + "\n".join(f"  {e}" for e in wrong)


def test_the_transport_knows_no_tasks_threads_or_client() -> None:
    wrong = _never(["streamloop.transport"], ["streamloop.tasks", "streamloop.threads", "streamloop.client"])
    assert not wrong, "engine/transport imports the machinery above it:\n" + "\n".join(f"  {e}" for e in wrong)


def test_the_schema_registry_serdes_stand_on_the_foundation_alone() -> None:
    """Serdes a user may take without the engine's machinery: only the foundation and themselves."""
    wrong = [e for e in edges() if is_under(e.source, "streamloop.schema_registry")
             and not any(is_under(e.target, f) for f in (*FOUNDATION, "streamloop.schema_registry"))]
    assert not wrong, "engine/schema_registry imports the machinery:\n" + "\n".join(f"  {e}" for e in wrong)


def test_a_cycle_is_reported_by_its_edges() -> None:
    """The checker itself: a made-up cycle is found and named edge by edge."""
    a_b, b_c, c_a = (Edge("x.a", "x.b", 1, "module"), Edge("x.b", "x.c", 2, "deferred"),
                     Edge("x.c", "x.a", 3, "module"))
    graph = _graph([(e.source, e.target, e) for e in (a_b, b_c, c_a)])
    assert find_cycles(graph) == [Cycle(["x.a", "x.b", "x.c"], ["x.a", "x.b", "x.c", "x.a"], [a_b, b_c, c_a])]
    assert find_cycles(_graph([(e.source, e.target, e) for e in (a_b, b_c)])) == []


def test_an_import_is_told_by_when_it_runs() -> None:
    source = "\n".join([
        "import engine.a",
        "if TYPE_CHECKING:", "    import engine.b",
        "try:", "    import engine.c", "except ImportError:", "    pass",
        "class K:", "    import engine.d", "    def f(self):", "        import engine.e", ""])
    kinds = {n.names[0].name: kind for n, kind in _imports(ast.parse(source).body) if isinstance(n, ast.Import)}
    assert kinds == {"engine.a": "module", "engine.b": "typing", "engine.c": "module", "engine.d": "module",
                     "engine.e": "deferred"}
