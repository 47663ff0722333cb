"""Plugin hooks of codegen: the PYTHON device, a pure-Python interpreter of linearised programs (the test oracle), and
its renderer for compile-only work (`DEV=NULL:PYTHON:sm_90` prints the GPU-lowered programs)."""

from __future__ import annotations

from xgrad.plugin import DeviceSpec, LazyFactory, NeedsModule, RendererSpec, hookimpl
from xgrad.plugin import xgrad_api_version as xgrad_api_version

DEVICE_MODULE = "xgrad_codegen.pydevice"


python_available = NeedsModule(DEVICE_MODULE, f"PYTHON device not built yet (module {DEVICE_MODULE} missing)")
_open_python = LazyFactory(DEVICE_MODULE, "PythonDevice")
_make_renderer = LazyFactory(DEVICE_MODULE, "PythonRenderer")


@hookimpl
def xgrad_devices() -> list[DeviceSpec]:
    return [
        DeviceSpec(
            "PYTHON",
            _open_python,
            priority=0,
            available=python_available,
            description="reference interpreter of linearised programs (slow; the test oracle)",
        )
    ]


@hookimpl
def xgrad_renderers() -> list[RendererSpec]:
    return [
        RendererSpec(
            "PYTHON",
            _make_renderer,
            available=python_available,
            description="the linear program as text; arch: a GPU (sm_90, gfx1100, gfx942) to lower for its workgroups",
        )
    ]
