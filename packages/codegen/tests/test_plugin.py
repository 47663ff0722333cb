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


def test_plugin_offers_the_python_renderer_for_compile_only_gpu_lowering() -> None:
    from kernel_helpers import data, kernel_asts

    from xgrad import Device, Tensor

    (spec,) = plugin.xgrad_renderers()
    assert spec.name == "PYTHON" and spec.factory("gfx942").has_local and not spec.factory(None).has_local
    x = Tensor(data(4, 2048)).realize()
    (ast,) = kernel_asts(lambda: x.sum(1))
    src = Device["NULL:PYTHON:sm_90"].compile(ast).info.src  # lowered for sm_90's workgroups, run nowhere
    assert "DEFINE_LOCAL" in src and "BARRIER" in src and "('lidx0', 128)" in src
