"""The gfx11 (RDNA3) instruction decoder.

In: machine code bytes and a byte offset. Out: an `Inst` (encoding, opcode, mnemonic from `opcodes.OPCODES`, the raw
fields, a literal constant if one follows, its size) and `Inst.text()`, the instruction as llvm-objdump-19 prints it
(the tests compare the two on clang's kernels). Encodings follow AMD's RDNA3 ISA reference: SOP1/SOP2/SOPK/SOPC/SOPP,
SMEM, VOP1/VOP2/VOPC/VOP3/VOP3P/VOPD, DS, FLAT/GLOBAL/SCRATCH.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from xgrad.errors import XgradError
from xgrad_amd.emulate.opcodes import OPCODES


class EmulatorError(XgradError, RuntimeError):
    """The emulator met an instruction it does not implement, an encoding it cannot decode, or a bad launch."""


LITERAL = 255
VGPR0 = 256
# VOP3 opcodes whose bits 14:8 are an SGPR destination (carry out / VCC-like) instead of abs/op_sel
VOP3_SDST = frozenset({
    "v_add_co_u32", "v_sub_co_u32", "v_subrev_co_u32", "v_add_co_ci_u32", "v_sub_co_ci_u32", "v_subrev_co_ci_u32",
    "v_div_scale_f32", "v_div_scale_f64", "v_mad_u64_u32", "v_mad_i64_i32",
})  # fmt: skip
VGPR_DST = frozenset({"VOP1", "VOP2", "VOP3", "VOP3P"})
SGPR_DST = frozenset({"v_readfirstlane_b32", "v_readlane_b32"})
ALWAYS_LITERAL = frozenset({"v_fmamk_f32", "v_fmaak_f32", "v_fmamk_f16", "v_fmaak_f16"})
VOPD_LITERAL = frozenset({"v_dual_fmamk_f32", "v_dual_fmaak_f32"})

FLOAT_CONSTANTS = {240: 0.5, 241: -0.5, 242: 1.0, 243: -1.0, 244: 2.0, 245: -2.0, 246: 4.0, 247: -4.0}
INV_2PI = 248
NAMED = {106: "vcc_lo", 107: "vcc_hi", 124: "null", 125: "m0", 126: "exec_lo", 127: "exec_hi", 253: "scc"}
NAMED |= {235: "src_shared_base", 236: "src_shared_limit", 237: "src_private_base", 238: "src_private_limit"}


@dataclass(slots=True)
class Inst:
    """One decoded instruction. `f` holds the raw fields of its encoding by name (src0, vdst, offset, ...)."""

    addr: int
    size: int
    enc: str
    op: int
    name: str
    widths: tuple[int, ...]
    f: dict[str, int]
    literal: int | None = None
    y: Inst | None = None  # the second half of a VOPD pair
    extra: dict[str, object] = field(default_factory=dict)

    def text(self) -> str:
        """The instruction in llvm-objdump-19's syntax (mnemonic without _e32/_e64, operands, main modifiers)."""
        from xgrad_amd.emulate.disasm import format_inst

        return format_inst(self)


def _bits(w: int, lo: int, n: int) -> int:
    return (w >> lo) & ((1 << n) - 1)


def _sext(v: int, bits: int) -> int:
    return v - (1 << bits) if v & (1 << (bits - 1)) else v


def decode_at(code: bytes, pc: int) -> Inst:
    """Decode the instruction at byte offset `pc` of `code`."""
    if pc + 4 > len(code) or pc < 0:
        raise EmulatorError(f"program counter {pc:#x} is outside the kernel's {len(code)} bytes of code")
    w0 = struct.unpack_from("<I", code, pc)[0]
    w1 = struct.unpack_from("<I", code, pc + 4)[0] if pc + 8 <= len(code) else 0
    top = w0 >> 23
    f: dict[str, int]
    if top == 0x17D:
        enc, op, size = "SOP1", _bits(w0, 8, 8), 4
        f = {"sdst": _bits(w0, 16, 7), "ssrc0": _bits(w0, 0, 8)}
    elif top == 0x17E:
        enc, op, size = "SOPC", _bits(w0, 16, 7), 4
        f = {"ssrc0": _bits(w0, 0, 8), "ssrc1": _bits(w0, 8, 8)}
    elif top == 0x17F:
        enc, op, size = "SOPP", _bits(w0, 16, 7), 4
        f = {"simm16": _bits(w0, 0, 16)}
    elif w0 >> 28 == 0xB:
        enc, op, size = "SOPK", _bits(w0, 23, 5), 4
        f = {"sdst": _bits(w0, 16, 7), "simm16": _bits(w0, 0, 16)}
    elif w0 >> 30 == 0b10:
        enc, op, size = "SOP2", _bits(w0, 23, 7), 4
        f = {"sdst": _bits(w0, 16, 7), "ssrc0": _bits(w0, 0, 8), "ssrc1": _bits(w0, 8, 8)}
    elif w0 >> 31 == 0:
        if w0 >> 25 == 0x3F:
            enc, op, size = "VOP1", _bits(w0, 9, 8), 4
            f = {"vdst": _bits(w0, 17, 8), "src0": _bits(w0, 0, 9)}
        elif w0 >> 25 == 0x3E:
            enc, op, size = "VOPC", _bits(w0, 17, 8), 4
            f = {"src0": _bits(w0, 0, 9), "vsrc1": _bits(w0, 9, 8) + VGPR0}
        else:
            enc, op, size = "VOP2", _bits(w0, 25, 6), 4
            f = {"vdst": _bits(w0, 17, 8), "src0": _bits(w0, 0, 9), "vsrc1": _bits(w0, 9, 8) + VGPR0}
    else:
        size = 8
        top6 = w0 >> 26
        if top6 == 0x3D:
            enc, op = "SMEM", _bits(w0, 18, 8)
            f = {"sdata": _bits(w0, 6, 7), "sbase": _bits(w0, 0, 6) * 2, "glc": _bits(w0, 14, 1)}
            f |= {"offset": _sext(_bits(w1, 0, 21), 21), "soffset": _bits(w1, 25, 7)}
        elif top6 == 0x35:
            enc, op = "VOP3", _bits(w0, 16, 10)
            f = {"vdst": _bits(w0, 0, 8), "abs": _bits(w0, 8, 3), "opsel": _bits(w0, 11, 4), "sdst": _bits(w0, 8, 7)}
            f |= {"clamp": _bits(w0, 15, 1), "src0": _bits(w1, 0, 9), "src1": _bits(w1, 9, 9)}
            f |= {"src2": _bits(w1, 18, 9), "omod": _bits(w1, 27, 2), "neg": _bits(w1, 29, 3)}
        elif w0 >> 24 == 0xCC:
            enc, op = "VOP3P", _bits(w0, 16, 7)
            f = {"vdst": _bits(w0, 0, 8), "neg_hi": _bits(w0, 8, 3), "opsel": _bits(w0, 11, 3)}
            f |= {"opsel_hi": _bits(w1, 27, 2) | _bits(w0, 14, 1) << 2, "clamp": _bits(w0, 15, 1)}
            f |= {"src0": _bits(w1, 0, 9), "src1": _bits(w1, 9, 9), "src2": _bits(w1, 18, 9), "neg": _bits(w1, 29, 3)}
        elif top6 == 0x32:
            return _decode_vopd(code, pc, w0, w1)
        elif top6 == 0x36:
            enc, op = "DS", _bits(w0, 18, 8)
            f = {"offset0": _bits(w0, 0, 8), "offset1": _bits(w0, 8, 8), "gds": _bits(w0, 17, 1)}
            f |= {
                "addr": _bits(w1, 0, 8),
                "data0": _bits(w1, 8, 8),
                "data1": _bits(w1, 16, 8),
                "vdst": _bits(w1, 24, 8),
            }
        elif top6 == 0x37:
            enc = ("FLAT", "SCRATCH", "GLOBAL", "FLAT?")[_bits(w0, 16, 2)]
            op = _bits(w0, 18, 7)
            f = {"offset": _sext(_bits(w0, 0, 13), 13), "glc": _bits(w0, 14, 1), "slc": _bits(w0, 15, 1)}
            f |= {"addr": _bits(w1, 0, 8), "data": _bits(w1, 8, 8), "saddr": _bits(w1, 16, 7), "sve": _bits(w1, 23, 1)}
            f |= {"vdst": _bits(w1, 24, 8)}
        elif top6 == 0x38:
            enc, op = "MUBUF", _bits(w0, 18, 8)
            f = {"offset": _bits(w0, 0, 12), "vaddr": _bits(w1, 0, 8), "vdata": _bits(w1, 8, 8)}
        else:
            raise EmulatorError(f"unknown gfx11 encoding in instruction word {w0:#010x} at {pc:#x}")
    entry = OPCODES.get(enc, {}).get(op)
    if entry is None:
        raise EmulatorError(f"unknown gfx11 opcode {op} of encoding {enc} (word {w0:#010x}) at {pc:#x}")
    name, widths = entry
    if (
        "vdst" in f
        and enc in VGPR_DST
        and not (enc == "VOP3" and (op < 256 or name in SGPR_DST))
        and name not in SGPR_DST
    ):
        f["vdst"] += VGPR0  # a VGPR destination, as a 9-bit operand code like the sources
    inst = Inst(pc, size, enc, op, name, widths, f)
    if enc.startswith("VOP") and (
        name in ALWAYS_LITERAL or any(f.get(k) == LITERAL for k in ("src0", "src1", "src2") if k in f)
    ):
        inst.literal = struct.unpack_from("<I", code, pc + size)[0] if pc + size + 4 <= len(code) else 0
        inst.size += 4
    elif enc.startswith("SO") and enc not in ("SOPP", "SOPK") and LITERAL in (f.get("ssrc0"), f.get("ssrc1")):
        inst.literal = struct.unpack_from("<I", code, pc + size)[0] if pc + size + 4 <= len(code) else 0
        inst.size += 4
    elif enc == "SOPK" and name == "s_setreg_imm32_b32":
        inst.literal = struct.unpack_from("<I", code, pc + size)[0]
        inst.size += 4
    if enc in ("VOP1", "VOP2", "VOPC") and f["src0"] in (233, 234, 250):
        raise EmulatorError(f"{name} at {pc:#x} uses DPP (src0 {f['src0']}), which this emulator does not execute")
    return inst


def _decode_vopd(code: bytes, pc: int, w0: int, w1: int) -> Inst:
    opx, opy = _bits(w0, 22, 4), _bits(w0, 17, 5)
    ex, ey = OPCODES["VOPDX"].get(opx), OPCODES["VOPDY"].get(opy)
    if ex is None or ey is None:
        raise EmulatorError(f"unknown gfx11 VOPD opcode pair X={opx} Y={opy} (word {w0:#010x}) at {pc:#x}")
    vdstx = _bits(w1, 24, 8)
    vdsty = _bits(w1, 17, 7) << 1 | (~vdstx & 1)
    fx = {"src0": _bits(w0, 0, 9), "vsrc1": _bits(w0, 9, 8) + VGPR0, "vdst": vdstx + VGPR0}
    fy = {"src0": _bits(w1, 0, 9), "vsrc1": _bits(w1, 9, 8) + VGPR0, "vdst": vdsty + VGPR0}
    x = Inst(pc, 8, "VOPD", opx, ex[0], ex[1], fx)
    y = Inst(pc, 8, "VOPD", opy, ey[0], ey[1], fy)
    if LITERAL in (fx["src0"], fy["src0"]) or ex[0] in VOPD_LITERAL or ey[0] in VOPD_LITERAL:
        lit = struct.unpack_from("<I", code, pc + 8)[0] if pc + 12 <= len(code) else 0
        x.literal = y.literal = lit
        x.size = 12
    x.y = y
    return x


def disassemble(code: bytes, base: int = 0) -> list[Inst]:
    """Decode `code` start to end (a linear sweep, as llvm-objdump does); addresses are offsets plus `base`."""
    out = []
    pc = 0
    while pc + 4 <= len(code):
        inst = decode_at(code, pc)
        inst.addr = base + pc
        out.append(inst)
        pc += inst.size
    return out
