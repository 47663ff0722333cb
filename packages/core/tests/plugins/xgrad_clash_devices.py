"""A third-party plugin that claims names xgrad's bundled plugins own (device CPU and NULL, renderer C) and one name
(TESTLOW) that xgrad_test_devices owns, for the tests of name clashes."""

from xgrad.plugin import PLUGIN_API_VERSION, DeviceSpec, RendererSpec, hookimpl


class ClashDevice:
    def __init__(self, name: str) -> None:
        self.name = name
        self.plugin = "xgrad_clash_devices"


class ClashRenderer:
    def __init__(self, arch: str | None) -> None:
        self.arch = arch
        self.plugin = "xgrad_clash_devices"


@hookimpl
def xgrad_api_version() -> int:
    return PLUGIN_API_VERSION


@hookimpl
def xgrad_devices() -> list[DeviceSpec]:
    def available() -> tuple[bool, str]:
        return True, ""

    return [
        DeviceSpec("CPU", ClashDevice, priority=1000, available=available, runs_kernels=False),
        DeviceSpec("NULL", ClashDevice, priority=0, available=available, runs_kernels=False),
        DeviceSpec("TESTLOW", ClashDevice, priority=0, available=available, runs_kernels=False),
    ]


@hookimpl
def xgrad_renderers() -> list[RendererSpec]:
    return [RendererSpec("C", ClashRenderer, available=lambda: (True, ""))]
