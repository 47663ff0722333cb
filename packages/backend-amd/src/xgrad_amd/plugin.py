"""Plugin hooks of the AMD backend: device "AMD" (AMD:0..N, one per GPU) and renderer "HIP" (compile-only work:
`DEV=NULL:HIP:gfx1100`). Modules are imported only when first used; the availability check never raises.

The device needs ROCm's HIP runtime (libamdhip64.so) and a GPU, or `MOCKGPU=1`: then an in-process mock of the HIP
library runs the kernels on this package's RDNA3 emulator (an emulated gfx1100). The renderer needs nothing but this
package (the compiler, clang-19 with lld-19, is needed only to build code objects).
"""

from __future__ import annotations

import importlib

from xgrad.plugin import DeviceSpec, LazyFactory, NeedsModule, RendererSpec, hookimpl
from xgrad.plugin import xgrad_api_version as xgrad_api_version

DEVICE_MODULE = "xgrad_amd.device"
RENDERER_MODULE = "xgrad_amd.renderer"
DRIVER_MODULE = "xgrad_amd.driver"
# the targets clang-19 builds for (kept here as text so that listing the plugin imports nothing heavy; the renderer's
# AMD_ARCHS is the table, a test checks that the two agree)
SUPPORTED_ARCHS = ("gfx90a", "gfx942", "gfx1100", "gfx1151", "gfx1200", "gfx1201")
UNSUPPORTED_NOTE = "gfx950 unsupported (clang-19 lacks it)"


def amd_available() -> tuple[bool, str]:
    """(True, "") when a HIP device (or the MOCKGPU emulator) can be opened, else why not. Never raises."""
    try:
        driver = importlib.import_module(DRIVER_MODULE)
        ok, why = driver.hip_available()
    except Exception as e:  # a broken install must show up as a reason, not an exception
        return False, f"AMD runtime failed to load: {type(e).__name__}: {e}"
    if ok:
        return True, ""
    return False, f"{why} (kernels build for {', '.join(SUPPORTED_ARCHS)}; {UNSUPPORTED_NOTE})"


renderer_available = NeedsModule(RENDERER_MODULE, f"HIP renderer missing (module {RENDERER_MODULE})")
_open_amd = LazyFactory(DEVICE_MODULE, "AMDDevice")
_make_renderer = LazyFactory(RENDERER_MODULE, "HIPRenderer")


@hookimpl
def xgrad_devices() -> list[DeviceSpec]:
    return [
        DeviceSpec(
            "AMD",
            _open_amd,
            priority=40,
            available=amd_available,
            description=f"AMD GPUs through the HIP runtime (libamdhip64), clang-19 code objects for "
            f"{', '.join(SUPPORTED_ARCHS)}; MOCKGPU=1: an emulated gfx1100",
        )
    ]


@hookimpl
def xgrad_renderers() -> list[RendererSpec]:
    return [
        RendererSpec(
            "HIP",
            _make_renderer,
            available=renderer_available,
            default_arch="gfx1100",
            description=f"HIP C++ for clang-19; arch: {', '.join(SUPPORTED_ARCHS)} ({UNSUPPORTED_NOTE})",
        )
    ]
