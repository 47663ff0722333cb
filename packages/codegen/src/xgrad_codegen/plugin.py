"""Plugin hooks of codegen: the PYTHON device, a pure-Python interpreter of linearised programs (the test oracle)."""

from __future__ import annotations

import importlib
from typing import Any

from xgrad.plugin import PLUGIN_API_VERSION, DeviceSpec, hookimpl, module_exists

DEVICE_MODULE = "xgrad_codegen.pydevice"


def python_available() -> tuple[bool, str]:
    if not module_exists(DEVICE_MODULE):
        return False, f"PYTHON device not built yet (module {DEVICE_MODULE} missing)"
    return True, ""


def _open_python(name: str) -> Any:
    return importlib.import_module(DEVICE_MODULE).PythonDevice(name)


@hookimpl
def xgrad_api_version() -> int:
    return PLUGIN_API_VERSION


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
