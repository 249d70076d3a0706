"""``streamloop``'s public names are imported on first use (``engine/__init__.py``, PEP 562): its
table of where each comes from, its imports for type checkers and ``__all__`` must name the same
things, and ``import streamloop`` must load none of the machinery."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import streamloop

INIT = Path(__file__).resolve().parents[2] / "engine" / "__init__.py"


def _typing_imports() -> dict[str, str]:
    """name -> module of the imports under ``if TYPE_CHECKING:``."""
    tree = ast.parse(INIT.read_text())
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.body:
                assert isinstance(child, ast.ImportFrom) and child.module is not None
                for alias in child.names:
                    found[alias.name] = child.module.removeprefix("streamloop.")
    return found


def test_the_table_the_typing_imports_and_all_name_the_same_things() -> None:
    table = {name: module for module, names in streamloop._EXPORTS.items() for name in names}
    assert table == _typing_imports()
    assert sorted(streamloop.__all__) == sorted(table)
    assert len(streamloop.__all__) == len(set(streamloop.__all__))


def test_every_public_name_resolves_to_the_object_of_its_module() -> None:
    import importlib

    for module, names in streamloop._EXPORTS.items():
        for name in names:
            assert getattr(streamloop, name) is getattr(importlib.import_module(f"streamloop.{module}"), name)
    assert set(streamloop.__all__) <= set(dir(streamloop))


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        streamloop.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("streamloop.NoSuchThing resolved")


def test_importing_the_package_loads_no_client() -> None:
    # In a fresh process: this one has imported everything already.
    probe = ("import sys, streamloop, streamloop.serdes; "
             "print(','.join(sorted(m for m in sys.modules if m.startswith('streamloop.'))))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert "streamloop.client" not in loaded.split(",")
    assert "streamloop.tasks" not in {m.rsplit(".", 1)[0] for m in loaded.split(",")} | set(loaded.split(","))
