"""docs/testing.md works as written: its Python blocks run, top to bottom, as one script."""

from __future__ import annotations

import re
from pathlib import Path

from streamloop.transport.memory import MemoryBroker

PAGE = Path(__file__).resolve().parents[3] / "docs" / "testing.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE)


def test_the_testing_guide_has_the_ten_line_property() -> None:
    blocks = python_blocks(PAGE.read_text())
    prop = next(b for b in blocks if "@given" in b)
    assert len(prop.strip().splitlines()) <= 10


def test_every_python_block_of_the_testing_guide_runs() -> None:
    blocks = python_blocks(PAGE.read_text())
    assert len(blocks) >= 4
    # Fresh embedded brokers, as tests/unit/test_docs_samples.py gives them: that test runs this page too.
    for name in set(re.findall(r"memory://([\w.-]*)", PAGE.read_text())):
        MemoryBroker.reset(name)
    namespace: dict[str, object] = {"__name__": "docs_testing"}
    for number, block in enumerate(blocks, 1):
        exec(compile(block, f"{PAGE.name} block {number}", "exec"), namespace)
