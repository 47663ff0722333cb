"""A good plugin with runnable devices of known priorities, for tests of Device.DEFAULT and Device[...]."""

from xgrad.plugin import PLUGIN_API_VERSION, DeviceSpec, RendererSpec, hookimpl

OPENED: list[str] = []


class DummyAllocator:
    """Host memory as bytearrays: the smallest `xgrad.buffer.Allocator`."""

    def alloc(self, nbytes: int) -> bytearray:
        return bytearray(nbytes)

    def free(self, handle: bytearray, nbytes: int) -> None:
        pass

    def copyin(self, dest: bytearray, src: memoryview) -> None:
        dest[:] = src

    def copyout(self, dest: memoryview, src: bytearray) -> None:
        dest[:] = src

    def offset(self, handle: bytearray, offset: int, nbytes: int) -> memoryview:
        return memoryview(handle)[offset : offset + nbytes]


class DummyDevice:
    """Meets `xgrad.buffer.RuntimeDevice` without running anything: compile refuses."""

    def __init__(self, name: str) -> None:
        OPENED.append(name)
        self.name = name
        self.allocator = DummyAllocator()

    def compile(self, ast: object) -> object:
        raise NotImplementedError(f"{self.name} is a test device and compiles nothing")

    def synchronize(self) -> None:
        pass


def _broken_check() -> tuple[bool, str]:
    raise OSError("availability check broken on purpose")


@hookimpl
def xgrad_api_version() -> int:
    return PLUGIN_API_VERSION


@hookimpl
def xgrad_devices() -> list[DeviceSpec]:
    return [
        DeviceSpec("TESTLOW", DummyDevice, priority=1, available=lambda: (True, "")),
        DeviceSpec("TESTHIGH", DummyDevice, priority=5, available=lambda: (True, "")),
        DeviceSpec("TESTOFF", DummyDevice, priority=50, available=lambda: (False, "TESTOFF is off on purpose")),
        DeviceSpec("TESTNORUN", DummyDevice, priority=99, available=lambda: (True, ""), runs_kernels=False),
        DeviceSpec("TESTRAISES", DummyDevice, priority=98, available=_broken_check),
        DeviceSpec("TESTBROKEN", _refuse_to_open, priority=-1, available=lambda: (True, "")),
    ]


def _refuse_to_open(name: str) -> object:
    raise RuntimeError(f"{name} refuses to open on purpose")


class DummyRenderer:
    def __init__(self, arch: str | None) -> None:
        self.arch = arch


@hookimpl
def xgrad_renderers() -> list[RendererSpec]:
    return [RendererSpec("TESTR", DummyRenderer, available=lambda: (True, ""), default_arch="t1")]
