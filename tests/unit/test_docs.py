"""The documentation that is made from code stays in step with it."""

from pathlib import Path

from engine.config import reference_markdown

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_configuration_reference_lists_every_key_as_the_code_has_it() -> None:
    assert (DOCS / "configuration.md").read_text() == reference_markdown(), (
        "docs/configuration.md is stale: regenerate it with "
        "python -c \"from engine.config import reference_markdown; print(reference_markdown(), end='')\"")
