"""The RDNA3 (gfx1100) emulator: executes the code objects clang-19 builds, vectorised with numpy over the 32 lanes of
each wave and over all the waves of a launch, which run in lockstep (the lowest program counter first).

`launch(co, name, grid, block, kernarg, mem)` runs a kernel of a loaded `xgrad_amd.elf.CodeObject` in a
`DeviceMemory` (the emulated GPU's global memory, shared with the NV backend's interpreter). Modules: `decode`
(binary -> `Inst`, checked against llvm-objdump-19), `disasm` (`Inst` -> LLVM's text), `opcodes` (the opcode table,
generated from llvm-mc-19 by `gen_opcodes`), `wave` (the registers of a batch of waves, operands), `salu`, `valu` +
`valu_ops`, `packed` (VOP3P, WMMA), `mem` (SMEM, GLOBAL/FLAT/SCRATCH, LDS) and `dispatch` (launch, the lockstep
scheduler).

Known limits: DPP, dynamic stacks, image/buffer memory and 64-lane waves are not executed (they raise
`EmulatorError` naming the instruction); v_div_scale never rescales (see `valu._sp_div_scale`); transcendentals and
v_rcp/v_rsq/v_sqrt are IEEE-exact here where the hardware is within about 1 ulp.
"""

from xgrad_amd.emulate.decode import EmulatorError, Inst, decode_at, disassemble
from xgrad_amd.emulate.dispatch import launch, load, unload
from xgrad_codegen.devmem import DeviceMemory, MemoryFaultError

__all__ = [
    "DeviceMemory", "EmulatorError", "Inst", "MemoryFaultError", "decode_at", "disassemble", "dispatch", "launch",
    "load", "unload",
]  # fmt: skip
