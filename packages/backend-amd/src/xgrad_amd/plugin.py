"""Plugin hooks of the AMD backend: device "AMD", renderer(s) HIP. A stub until the backend is built."""

from __future__ import annotations

from xgrad.plugin import DeviceSpec, RendererSpec, Unavailable, hookimpl
from xgrad.plugin import xgrad_api_version as xgrad_api_version

REASON = "AMD backend not built yet"
not_built = Unavailable(REASON)


@hookimpl
def xgrad_devices() -> list[DeviceSpec]:
    return [DeviceSpec("AMD", not_built.open, priority=40, available=not_built, description="AMD GPUs through HIP/KFD")]


@hookimpl
def xgrad_renderers() -> list[RendererSpec]:
    return [
        RendererSpec("HIP", not_built.open, available=not_built),
    ]
