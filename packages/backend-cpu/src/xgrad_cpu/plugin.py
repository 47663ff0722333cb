"""Plugin hooks of the CPU backend: device "CPU" and renderer "C". Modules are imported only when first used."""

from __future__ import annotations

import shlex
import shutil

from xgrad.helpers import CC
from xgrad.plugin import DeviceSpec, LazyFactory, NeedsModule, RendererSpec, hookimpl, module_exists
from xgrad.plugin import xgrad_api_version as xgrad_api_version

DEVICE_MODULE = "xgrad_cpu.device"
RENDERER_MODULE = "xgrad_cpu.renderer"


# newest clang first; plain `clang` last because an old one (< 15) lacks _Float16 on x86-64, which gcc >= 12 has
COMPILER_CANDIDATES = ("clang-19", "clang-18", "clang-17", "clang-16", "clang-15", "gcc", "clang")


def find_c_compiler() -> str | None:
    """The C compiler to use: $CC if set (must exist), else the first of COMPILER_CANDIDATES on PATH, else None."""
    if CC.value:
        words = shlex.split(CC.value)
        return CC.value if words and shutil.which(words[0]) else None
    return next((cc for cc in COMPILER_CANDIDATES if shutil.which(cc)), None)


def cpu_available() -> tuple[bool, str]:
    if not module_exists(DEVICE_MODULE):
        return False, f"CPU device not built yet (module {DEVICE_MODULE} missing)"
    if find_c_compiler() is None:
        if CC.value:
            return False, f"CC={CC.value!r} is not an executable on PATH; fix CC or unset it to use clang or gcc"
        return False, "no C compiler found: install clang or gcc (apt-get install clang), or set CC"
    return True, ""


renderer_available = NeedsModule(RENDERER_MODULE, f"C renderer not built yet (module {RENDERER_MODULE} missing)")
_open_cpu = LazyFactory(DEVICE_MODULE, "CPUDevice")
_make_renderer = LazyFactory(RENDERER_MODULE, "CRenderer")


@hookimpl
def xgrad_devices() -> list[DeviceSpec]:
    return [
        DeviceSpec(
            "CPU",
            _open_cpu,
            priority=10,
            available=cpu_available,
            description="C kernels compiled with clang or gcc, multithreaded",
        )
    ]


@hookimpl
def xgrad_renderers() -> list[RendererSpec]:
    return [RendererSpec("C", _make_renderer, available=renderer_available, description="C99 with clang/gcc vectors")]
