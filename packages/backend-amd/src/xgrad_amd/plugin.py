"""Plugin hooks of the AMD backend: device "AMD", renderer(s) HIP. A stub until the backend is built."""

from __future__ import annotations

from typing import Any

from xgrad.plugin import PLUGIN_API_VERSION, DeviceSpec, RendererSpec, hookimpl

REASON = "AMD backend not built yet"


def not_built() -> tuple[bool, str]:
    return False, REASON


def _not_built(name: str | None) -> Any:
    raise NotImplementedError(REASON)


@hookimpl
def xgrad_api_version() -> int:
    return PLUGIN_API_VERSION


@hookimpl
def xgrad_devices() -> list[DeviceSpec]:
    return [DeviceSpec("AMD", _not_built, priority=40, available=not_built, description="AMD GPUs through HIP/KFD")]


@hookimpl
def xgrad_renderers() -> list[RendererSpec]:
    return [
        RendererSpec("HIP", _not_built, available=not_built),
    ]
