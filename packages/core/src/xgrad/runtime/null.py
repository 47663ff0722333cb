"""The NULL device: schedules and compiles every kernel for a chosen renderer and target, and runs nothing.

`DEV=NULL` uses the C renderer when a CPU backend is installed; `DEV=NULL:CUDA:sm_90` compiles for that renderer and
target (the renderer comes from whichever plugin offers it). Data written to NULL is dropped; reading it is an error.
"""

from __future__ import annotations

from typing import Any

from xgrad.buffer import ProgramInfo
from xgrad.device import Device, parse_device
from xgrad.errors import DeviceError
from xgrad.helpers import DEBUG, Effect, knobs_key
from xgrad.plugin import get_registry
from xgrad.uop.ops import KernelInfo, UOp

PROGRAM_KNOBS = Effect.CODEGEN | Effect.COMPILE  # what rendered source depends on besides the AST


class NullAllocator:
    def alloc(self, nbytes: int) -> Any:
        return ("null", nbytes)

    def free(self, handle: Any, nbytes: int) -> None:
        pass

    def copyin(self, dest: Any, src: memoryview) -> None:
        pass

    def copyout(self, dest: memoryview, src: Any) -> None:
        raise DeviceError("the NULL device runs nothing, so its tensors hold no data; use a real device to read values")

    def offset(self, handle: Any, offset: int, nbytes: int) -> Any:
        return ("null", nbytes)


class NullProgram:
    def __init__(self, info: ProgramInfo):
        self.info = info

    def __call__(self, bufs: list[Any], vals: dict[str, int], wait: bool = False) -> float | None:
        return 0.0 if wait else None


class NullDevice:
    graph: Any = None  # no device graph (see CompiledDevice.graph)

    def __init__(self, name: str):
        self.name = name
        self.allocator = NullAllocator()
        parsed = parse_device(name)
        if parsed.renderer is None and parsed.arch is not None:
            raise DeviceError(f"{name}: NULL compiles for a named renderer; write it like 'NULL:CUDA:{parsed.arch}'")
        self.renderer_name = parsed.renderer or ("C" if "C" in _renderer_names() else None)
        self.arch = parsed.arch
        self._renderer: Any = None
        self._programs: dict[tuple[UOp, str], NullProgram] = {}

    @property
    def renderer(self) -> Any:
        if self._renderer is None and self.renderer_name is not None:
            self._renderer = Device.renderer(self.renderer_name, self.arch)
        return self._renderer

    def compile(self, ast: UOp) -> NullProgram:
        key = (ast, knobs_key(PROGRAM_KNOBS))  # the rendered source follows NOOPT, BEAM, ...
        if (hit := self._programs.get(key)) is not None:
            return hit
        name = ast.arg.name if isinstance(ast.arg, KernelInfo) else "kernel"
        src = ""
        if self.renderer is not None:
            src = self.renderer.compile_only(ast)
            if DEBUG >= 4:
                print(src)
        prg = NullProgram(ProgramInfo(name, src))
        self._programs[key] = prg
        return prg

    def synchronize(self) -> None:
        pass


def _renderer_names() -> list[str]:

    return list(get_registry().renderers)
