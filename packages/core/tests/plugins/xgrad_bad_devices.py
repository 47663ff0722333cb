"""A plugin whose runnable devices outrank xgrad_test_devices' but whose factories are broken: one returns None, one
an object missing most of `xgrad.buffer.RuntimeDevice`, one raises. Loaded with xgrad_test_devices in tests of
open-time validation and of the default device's fallback. Its renderer BADR's factory returns None."""

from xgrad.plugin import PLUGIN_API_VERSION, DeviceSpec, RendererSpec, hookimpl


class HalfDevice:
    """Has a name and compile(), but no allocator and no synchronize()."""

    def __init__(self, name: str) -> None:
        self.name = name

    def compile(self, ast: object) -> object:
        return ast


def _returns_none(name: str) -> None:
    return None


def _no_renderer(arch: str | None) -> None:
    return None


def _raises(name: str) -> object:
    raise OSError(f"{name}: driver missing on purpose")


@hookimpl
def xgrad_api_version() -> int:
    return PLUGIN_API_VERSION


@hookimpl
def xgrad_devices() -> list[DeviceSpec]:
    return [
        DeviceSpec("BADNONE", _returns_none, priority=30, available=lambda: (True, "")),
        DeviceSpec("BADHALF", HalfDevice, priority=20, available=lambda: (True, "")),
        DeviceSpec("BADRAISE", _raises, priority=10, available=lambda: (True, "")),
        DeviceSpec("BADNORUN", _returns_none, priority=0, available=lambda: (True, ""), runs_kernels=False),
        DeviceSpec("HALFNORUN", HalfDevice, priority=0, available=lambda: (True, ""), runs_kernels=False),
    ]


@hookimpl
def xgrad_renderers() -> list[RendererSpec]:
    return [RendererSpec("BADR", _no_renderer, available=lambda: (True, ""))]
