"""The CPU device: kernels rendered as C, compiled by clang or gcc into shared objects, run on a worker pool."""

from __future__ import annotations

from xgrad_codegen.device import CompiledDevice
from xgrad_cpu.allocator import CPUAllocator
from xgrad_cpu.compiler import CCompiler
from xgrad_cpu.program import CPUProgram
from xgrad_cpu.renderer import CRenderer

_ALLOCATOR = CPUAllocator()  # one host memory pool shared by CPU, CPU:1, ...: copies between them are memcpy


class CPUDevice(CompiledDevice):
    def __init__(self, name: str):
        super().__init__(name, _ALLOCATOR, CRenderer(None), CCompiler(), CPUProgram)
