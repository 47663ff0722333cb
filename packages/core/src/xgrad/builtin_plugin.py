"""Core's own plugin: the NULL device (compile-only, runs nothing) and the DISK device (files as buffers).

Registered by the registry before any other plugin, whatever the plugin knobs say.
"""

from __future__ import annotations

import importlib

from xgrad.plugin import DeviceSpec, LazyFactory, hookimpl
from xgrad.plugin import xgrad_api_version as xgrad_api_version

NULL_MODULE = "xgrad.runtime.null"
DISK_MODULE = "xgrad.runtime.disk"


def _module_imports(modname: str) -> tuple[bool, str]:
    try:
        importlib.import_module(modname)
    except Exception as e:
        return False, f"module {modname} does not import ({type(e).__name__}: {e})"
    return True, ""


_open_null = LazyFactory(NULL_MODULE, "NullDevice")
_open_disk = LazyFactory(DISK_MODULE, "DiskDevice")


@hookimpl
def xgrad_devices() -> list[DeviceSpec]:
    return [
        DeviceSpec(
            name="NULL",
            factory=_open_null,
            priority=0,
            available=lambda: _module_imports(NULL_MODULE),
            runs_kernels=False,
            description="compiles kernels (NULL:<renderer>:<arch>) but runs nothing",
        ),
        DeviceSpec(
            name="DISK",
            factory=_open_disk,
            priority=0,
            available=lambda: _module_imports(DISK_MODULE),
            runs_kernels=False,
            description="a file as a buffer: DISK:/path/to/file",
        ),
    ]
