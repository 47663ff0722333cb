"""The RDNA3 (gfx1100) emulator: executes the code objects clang-19 builds, vectorised over the 32 lanes of a wave.

`launch(co, name, grid, block, kernarg, mem)` runs a kernel of a loaded `xgrad_amd.elf.CodeObject` in a
`DeviceMemory` (the emulated GPU's global memory, shared with the NV backend's interpreter). Modules: `decode`
(binary -> `Inst`, checked against llvm-objdump-19), `disasm` (`Inst` -> LLVM's text), `opcodes` (the opcode table,
generated from llvm-mc-19 by `gen_opcodes`), `wave` (registers and operands), `salu`, `valu` + `valu_ops`, `packed`
(VOP3P, WMMA), `mem` (SMEM, GLOBAL/FLAT, LDS) and `launch` (dispatch, workgroups, barriers).
"""

from xgrad_amd.emulate.decode import EmulatorError, Inst, decode_at, disassemble
from xgrad_amd.emulate.launch import launch, load, unload
from xgrad_codegen.devmem import DeviceMemory, MemoryFaultError

__all__ = ["DeviceMemory", "EmulatorError", "Inst", "MemoryFaultError", "decode_at", "disassemble", "launch", "load",
           "unload"]  # fmt: skip
