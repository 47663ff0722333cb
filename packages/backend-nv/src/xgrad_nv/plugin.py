"""Plugin hooks of the NV backend: device "NV", renderer(s) CUDA, PTX. A stub until the backend is built."""

from __future__ import annotations

from xgrad.plugin import DeviceSpec, RendererSpec, Unavailable, hookimpl
from xgrad.plugin import xgrad_api_version as xgrad_api_version

REASON = "NV backend not built yet"
not_built = Unavailable(REASON)


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
        RendererSpec("CUDA", not_built.open, available=not_built),
        RendererSpec("PTX", not_built.open, available=not_built),
    ]
