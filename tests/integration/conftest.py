"""Fixtures the integration tests of several files share."""

from __future__ import annotations

from typing import Any

import pytest

import engine.tasks.task as task_module


@pytest.fixture
def windows(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The run loop each task chose: a ``BatchWindow`` on the Spark bulk path, else the per-record one."""
    chosen: list[Any] = []
    original = task_module.bulk_window

    def spy(task: Any) -> Any:
        window = original(task)
        chosen.append(window)
        return window

    monkeypatch.setattr(task_module, "bulk_window", spy)
    return chosen
