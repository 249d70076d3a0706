"""The documentation that is made from code stays in step with it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamloop.config import reference_markdown

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_configuration_reference_lists_every_key_as_the_code_has_it() -> None:
    assert (DOCS / "configuration.md").read_text() == reference_markdown(), (
        "docs/configuration.md is stale: regenerate it with "
        "python -c \"from streamloop.config import reference_markdown; print(reference_markdown(), end='')\"")


def _nav_title(entry: object) -> str:
    """A nav entry's title: its key, or the page's first heading when the entry is a bare path."""
    if isinstance(entry, dict):
        return str(next(iter(entry)))
    for line in (DOCS / str(entry)).read_text().splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return str(entry)


def test_no_page_in_the_navigation_repeats_its_sections_title() -> None:
    import yaml

    nav = yaml.safe_load((DOCS.parent / "mkdocs.yml").read_text())["nav"]
    repeated = [f"{section} > {_nav_title(child)}"
                for entry in nav if isinstance(entry, dict)
                for section, children in entry.items() if isinstance(children, list)
                for child in children if _nav_title(child) == section]
    assert repeated == []


def test_the_site_builds_strict_without_a_warning(tmp_path: Path) -> None:
    """Not with --quiet: mkdocs 1.6 then drops the warnings before --strict counts them (a broken
    anchor passed that way)."""
    pytest.importorskip("mkdocs")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                           cwd=DOCS.parent, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
                           capture_output=True, text=True, timeout=300)
    warnings = [line for line in built.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert (built.returncode, warnings) == (0, [])


def test_running_in_production_covers_sizing_state_upgrades_and_each_fault() -> None:
    import yaml

    nav = yaml.safe_load((DOCS.parent / "mkdocs.yml").read_text())["nav"]
    assert {"Running in production": "operations.md"} in nav
    page = (DOCS / "operations.md").read_text()
    headings = [line[3:] for line in page.splitlines() if line.startswith("## ")]
    for heading in ("Sizing", "The state directory", "Upgrades and restarts", "What each fault does",
                    "Brokers that hold JoinGroup"):
        assert heading in headings
    faults = [line.split("|")[1].strip() for line in page.splitlines() if line.startswith("| ")]
    for fault in ("a broker restart", "a stream thread fails", "the process is killed"):
        assert any(row.startswith(fault) for row in faults), fault


# What the engine has that the docs once called missing: phrase -> (module, attribute) that has it.
PRESENT = {
    "suppress": ("streamloop.topology.tables", "KTable.suppress"),
    "KTable–KTable join": ("streamloop.topology.tables", "KTable.join"),
    "session windows": ("streamloop.state", "SessionWindows"),
}


def test_what_the_docs_call_missing_is_missing() -> None:
    import importlib

    section = (DOCS / "state.md").read_text().split("## Not (yet) here", 1)[1].split("\n## ", 1)[0]
    for phrase, (module, attribute) in PRESENT.items():
        owner: object = importlib.import_module(module)
        for part in attribute.split("."):
            owner = getattr(owner, part)
        assert phrase.lower() not in section.lower(), f"docs/state.md says {phrase!r} is missing; {attribute} has it"
    readme = (DOCS.parent / "README.md").read_text()
    import streamloop.transport.memory.group as group

    assert "cooperative" in (group.__doc__ or "").lower()
    assert "consumer groups and eager rebalances" not in readme, "README: memory:// has cooperative rebalances too"
