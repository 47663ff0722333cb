from __future__ import annotations

import shutil

import pytest

from xgrad import Context
from xgrad_cpu import plugin


def test_plugin_offers_cpu_device_and_c_renderer() -> None:
    (device,) = plugin.xgrad_devices()
    (renderer,) = plugin.xgrad_renderers()
    assert (device.name, device.priority, device.runs_kernels) == ("CPU", 10, True)
    assert renderer.name == "C"
    assert plugin.xgrad_api_version() == 1


def test_cpu_unavailable_says_not_built_when_device_module_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin, "module_exists", lambda name: False)
    assert plugin.cpu_available() == (False, "CPU device not built yet (module xgrad_cpu.device missing)")


def test_cpu_unavailable_without_c_compiler_says_how_to_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin, "module_exists", lambda name: True)
    monkeypatch.setenv("PATH", "")
    with Context(CC=""):
        available, reason = plugin.cpu_available()
    assert not available
    assert "install clang or gcc" in reason


def test_cpu_unavailable_with_bad_cc_knob_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin, "module_exists", lambda name: True)
    with Context(CC="/nonexistent/cc -O2"):
        available, reason = plugin.cpu_available()
    assert not available
    assert "CC='/nonexistent/cc -O2'" in reason


def test_find_c_compiler_uses_cc_knob_with_flags() -> None:
    sh = shutil.which("sh")
    assert sh is not None
    with Context(CC=f"{sh} -x"):
        assert plugin.find_c_compiler() == f"{sh} -x"


def test_find_c_compiler_takes_first_candidate_on_path_without_cc() -> None:
    with Context(CC=""):
        found = plugin.find_c_compiler()
    assert found == next((cc for cc in plugin.COMPILER_CANDIDATES if shutil.which(cc)), None)
