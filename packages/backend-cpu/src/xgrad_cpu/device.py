"""The CPU device: kernels rendered as C, compiled by clang or gcc into shared objects, run on a worker pool."""

from __future__ import annotations

from typing import Any

from xgrad.buffer import ProgramInfo
from xgrad_codegen.device import CompiledDevice, launch_args
from xgrad_cpu.allocator import CPUAllocator
from xgrad_cpu.batch import CPUBatch, is_small
from xgrad_cpu.compiler import CCompiler
from xgrad_cpu.program import CPUProgram
from xgrad_cpu.renderer import CRenderer

_ALLOCATOR = CPUAllocator()  # one host memory pool shared by CPU, CPU:1, ...: copies between them are memcpy
# and one program cache per target: CPU:1 runs what CPU compiled (multi-device: compile once), but a device opened
# under another CPU_MARCH or CC has its own (a program built for AVX-512 must never run on a device built for AVX2)
_PROGRAMS: dict[str, dict[Any, Any]] = {}


class CPUDevice(CompiledDevice):
    def __init__(self, name: str):
        compiler = CCompiler()
        renderer = CRenderer(None, vector_width=compiler.vector_bytes() // 4)
        super().__init__(name, _ALLOCATOR, renderer, compiler, CPUProgram)
        self._programs = _PROGRAMS.setdefault(self.target(), {})

    def launch(self, raw: Any, bufs: list[Any], info: ProgramInfo, vals: dict[str, int], wait: bool) -> float | None:
        gs, args = launch_args(info, vals)
        result: float | None = raw.launch(bufs, gs, args, wait, 1 if is_small(info) else None)
        return result

    def batch(self, launches: list[tuple[Any, list[Any], tuple[tuple[int, int], ...], dict[str, int]]]) -> CPUBatch:
        """TinyJit's replay of consecutive kernels on this device as one call (see `batch.py`)."""
        return CPUBatch(launches)
