"""Plugin hooks of the NV backend: device "NV", renderers CUDA and PTX (for compile-only work, DEV=NULL:CUDA:sm_90)."""

from __future__ import annotations

from xgrad.plugin import DeviceSpec, LazyFactory, NeedsModule, RendererSpec, Unavailable, hookimpl
from xgrad.plugin import xgrad_api_version as xgrad_api_version

REASON = "NV device not built yet"
not_built = Unavailable(REASON)
ARCHS = "sm_80, sm_89, sm_90, sm_120"


@hookimpl
def xgrad_devices() -> list[DeviceSpec]:
    return [
        DeviceSpec(
            "NV", not_built.open, priority=40, available=not_built, description="NVIDIA GPUs through the CUDA driver"
        )
    ]


@hookimpl
def xgrad_renderers() -> list[RendererSpec]:
    return [
        RendererSpec(
            "CUDA",
            LazyFactory("xgrad_nv.renderer", "CUDARenderer"),
            available=NeedsModule("xgrad_nv.renderer", "xgrad_nv.renderer is missing: reinstall xgrad-backend-nv"),
            default_arch="sm_90",
            description=f"CUDA C for NVRTC/nvcc; arch: {ARCHS}",
        ),
        RendererSpec(
            "PTX",
            LazyFactory("xgrad_nv.ptx", "PTXRenderer"),
            available=NeedsModule("xgrad_nv.ptx", "the PTX renderer (xgrad_nv.ptx) is not built yet"),
            default_arch="sm_90",
            description=f"PTX text for ptxas or the driver's JIT; arch: {ARCHS}",
        ),
    ]
