"""A PTX interpreter: runs a PTX module's kernels over a grid of threads with numpy, on an emulated device memory.

It backs the NV device under `MOCKGPU=1` (the CUDA renderer's kernels as NVRTC's PTX, the PTX renderer's text as
is). Every thread of a chunk of blocks is one lane of numpy arrays; see `machine.py` for the scheduling, `alu.py`,
`convert.py`, `memory.py` and `warp.py` for the instructions and what precision each computes in.

    mem = DeviceMemory()
    mod = load_ptx(ptx_text)
    mod.launch("kernel", grid=(4, 1, 1), block=(128, 1, 1), args=[out_addr, in_addr, n], mem=mem)
"""

from xgrad_codegen.devmem import DeviceMemory, MemoryFaultError
from xgrad_nv.emulate.errors import EmulatorError
from xgrad_nv.emulate.machine import Kernel, Module, load_ptx

__all__ = ["DeviceMemory", "EmulatorError", "Kernel", "MemoryFaultError", "Module", "load_ptx"]
