"""Plugin hooks of the WEBGPU backend: device "WEBGPU", renderer(s) WGSL. A stub until the backend is built."""

from __future__ import annotations

from typing import Any

from xgrad.plugin import PLUGIN_API_VERSION, DeviceSpec, RendererSpec, hookimpl

REASON = "WEBGPU backend not built yet"


def not_built() -> tuple[bool, str]:
    return False, REASON


def _not_built(name: str | None) -> Any:
    raise NotImplementedError(REASON)


@hookimpl
def xgrad_api_version() -> int:
    return PLUGIN_API_VERSION


@hookimpl
def xgrad_devices() -> list[DeviceSpec]:
    return [DeviceSpec("WEBGPU", _not_built, priority=20, available=not_built, description="WebGPU through wgpu")]


@hookimpl
def xgrad_renderers() -> list[RendererSpec]:
    return [
        RendererSpec("WGSL", _not_built, available=not_built),
    ]
