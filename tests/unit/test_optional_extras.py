"""Without the 'monitor' extra, the modules that need it raise MissingExtraError naming the package."""

from __future__ import annotations

import importlib
import sys

import pytest

from engine.errors import MissingExtraError


@pytest.mark.parametrize(("module", "hidden", "package"), [
    ("engine.prometheus", "prometheus_client", "prometheus-client"),
    ("engine.console.monitor", "aiomonitor", "aiomonitor"),
])
def test_a_missing_extra_is_a_typed_error_naming_the_package(
        monkeypatch: pytest.MonkeyPatch, module: str, hidden: str, package: str) -> None:
    monkeypatch.setitem(sys.modules, hidden, None)  # import of it raises ImportError
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(MissingExtraError, match=r"pip install 'streamloop\[monitor\]'") as caught:
        importlib.import_module(module)
    assert caught.value.package == package
    assert isinstance(caught.value, ImportError)
