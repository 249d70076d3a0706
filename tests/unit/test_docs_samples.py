"""Every ```python block of the documentation runs, page by page, in order.

The blocks of one page share a namespace, as a reader goes down the page. A block
that is shown but cannot run opts out with a first line
``# docs: not run: <reason>`` (keep those rare). Samples that need a broker use
the embedded one (``memory://``), never a real address.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
from pathlib import Path

import pytest

from streamloop.transport.memory import MemoryBroker

DOCS = Path(__file__).resolve().parents[2] / "docs"
BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)
OPT_OUT = re.compile(r"^#\s*docs:\s*not run:\s*(.*)$")
MAX_OPT_OUTS = 3


def python_blocks(page: Path) -> list[tuple[int, str]]:
    """(line number, code) of each ```python block of ``page``."""
    text = page.read_text()
    return [(text.count("\n", 0, m.start()) + 2, m.group(1)) for m in BLOCK.finditer(text)]


def opt_out_reason(code: str) -> str | None:
    first = code.lstrip().splitlines()[0] if code.strip() else ""
    match = OPT_OUT.match(first)
    return None if match is None else match.group(1).strip()


PAGES = sorted(p for p in DOCS.rglob("*.md") if python_blocks(p))


def test_the_docs_have_samples() -> None:
    assert len(PAGES) >= 5, f"only {[p.name for p in PAGES]} have python samples"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_every_python_sample_of_the_page_runs(page: Path) -> None:
    # A page starts on fresh embedded brokers, however often it runs in one session.
    for name in set(re.findall(r"memory://([\w.-]*)", page.read_text())):
        MemoryBroker.reset(name)
    namespace: dict[str, object] = {"__name__": f"docs_sample_{page.stem.replace('-', '_')}"}
    for line, code in python_blocks(page):
        where = f"{page.relative_to(DOCS.parent)}:{line}"
        if opt_out_reason(code) is not None:
            continue
        assert "bootstrap.servers" not in code or "memory://" in code, (
            f"{where}: a sample that runs must use the embedded broker (memory://)")
        # Samples may await at top level, as in an async service or a notebook.
        compiled = compile(code, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        if compiled.co_flags & inspect.CO_COROUTINE:
            asyncio.run(eval(compiled, namespace))  # running the docs is the point
        else:
            exec(compiled, namespace)  # running the docs is the point


def test_opt_outs_are_rare_and_say_why() -> None:
    reasons = [(p.name, line, opt_out_reason(code)) for p in PAGES for line, code in python_blocks(p)
               if opt_out_reason(code) is not None]
    assert all(len(reason or "") >= 10 for _, _, reason in reasons), f"an opt-out without a reason: {reasons}"
    assert len(reasons) <= MAX_OPT_OUTS, f"too many samples that do not run: {reasons}"


def test_the_sample_extractor_sees_blocks_and_opt_outs(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# t\n\n```python\nx = 1\n```\n\n```sh\nmake\n```\n\n"
                    "```python\n# docs: not run: a fragment of a bigger app\ny\n```\n")
    blocks = python_blocks(page)
    assert blocks == [(4, "x = 1\n"), (12, "# docs: not run: a fragment of a bigger app\ny\n")]
    assert [opt_out_reason(code) for _, code in blocks] == [None, "a fragment of a bigger app"]
