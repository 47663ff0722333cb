from __future__ import annotations

import pytest

from xgrad_codegen import plugin


def test_plugin_offers_python_reference_device() -> None:
    (device,) = plugin.xgrad_devices()
    assert (device.name, device.priority, device.runs_kernels) == ("PYTHON", 0, True)
    assert plugin.xgrad_api_version() == 1


def test_python_device_unavailable_says_not_built_when_module_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("xgrad.plugin.module_exists", lambda name: False)
    assert plugin.python_available() == (False, "PYTHON device not built yet (module xgrad_codegen.pydevice missing)")
