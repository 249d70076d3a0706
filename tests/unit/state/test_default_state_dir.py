"""The default ``state.dir`` is a per-user directory, never a shared one like the temp directory."""

from __future__ import annotations

import os
import sys
import tempfile

import pytest

from streamloop.config import StreamsConfig, default_state_dir

REQUIRED = {"application.id": "orders", "bootstrap.servers": "memory://"}


def test_linux_default_is_under_xdg_state_home(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert default_state_dir() == os.path.join(str(tmp_path), "streamloop")
    assert StreamsConfig(REQUIRED)["state.dir"] == os.path.join(str(tmp_path), "streamloop")


@pytest.mark.parametrize("xdg", [None, "", "relative/state"])
def test_linux_default_without_an_absolute_xdg_state_home_is_in_the_home(
        monkeypatch: pytest.MonkeyPatch, tmp_path, xdg: str | None) -> None:
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("HOME", str(tmp_path))
    if xdg is None:
        monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_STATE_HOME", xdg)
    assert default_state_dir() == os.path.join(str(tmp_path), ".local", "state", "streamloop")


def test_macos_default_is_in_application_support(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_state_dir() == os.path.join(str(tmp_path), "Library", "Application Support", "streamloop")


def test_windows_default_is_in_local_app_data(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path))
    assert default_state_dir() == os.path.join(str(tmp_path), "streamloop")


def test_the_default_is_not_the_shared_temp_directory() -> None:
    assert StreamsConfig(REQUIRED)["state.dir"] != os.path.join(tempfile.gettempdir(), "streamloop")


def test_the_test_suite_keeps_the_default_out_of_the_home() -> None:
    """conftest points $XDG_STATE_HOME into the session's temporary directory."""
    default = StreamsConfig(REQUIRED)["state.dir"]
    assert not default.startswith(os.path.join(os.path.expanduser("~"), ""))
