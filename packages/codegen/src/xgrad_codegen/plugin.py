"""Plugin hooks of codegen: the PYTHON device, a pure-Python interpreter of linearised programs (the test oracle)."""

from __future__ import annotations

from xgrad.plugin import DeviceSpec, LazyFactory, NeedsModule, hookimpl
from xgrad.plugin import xgrad_api_version as xgrad_api_version

DEVICE_MODULE = "xgrad_codegen.pydevice"


python_available = NeedsModule(DEVICE_MODULE, f"PYTHON device not built yet (module {DEVICE_MODULE} missing)")
_open_python = LazyFactory(DEVICE_MODULE, "PythonDevice")


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
