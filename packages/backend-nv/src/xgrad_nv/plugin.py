"""Plugin hooks of the NV backend: device "NV", renderer(s) CUDA, PTX. A stub until the backend is built."""

from __future__ import annotations

from typing import Any

from xgrad.plugin import PLUGIN_API_VERSION, DeviceSpec, RendererSpec, hookimpl

REASON = "NV backend not built yet"


def not_built() -> tuple[bool, str]:
    return False, REASON


def _not_built(name: str | None) -> Any:
    raise NotImplementedError(REASON)


@hookimpl
def xgrad_api_version() -> int:
    return PLUGIN_API_VERSION


@hookimpl
def xgrad_devices() -> list[DeviceSpec]:
    return [
        DeviceSpec(
            "NV", _not_built, priority=40, available=not_built, description="NVIDIA GPUs through the CUDA driver"
        )
    ]


@hookimpl
def xgrad_renderers() -> list[RendererSpec]:
    return [
        RendererSpec("CUDA", _not_built, available=not_built),
        RendererSpec("PTX", _not_built, available=not_built),
    ]
