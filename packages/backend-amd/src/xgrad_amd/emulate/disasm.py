"""Print a decoded instruction as llvm-objdump-19 does, so the decoder can be checked against LLVM's disassembler.

In: an `Inst`. Out: 'mnemonic operands modifiers' text. Only what the comparison needs: operands in order with their
register ranges, inline and literal constants, neg/abs, and the offset modifiers of memory instructions.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from xgrad_amd.emulate.decode import FLOAT_CONSTANTS, INV_2PI, LITERAL, NAMED, VOP3_SDST

if TYPE_CHECKING:
    from xgrad_amd.emulate.decode import Inst


SOPP_NO_ZERO = frozenset({"s_endpgm", "s_barrier", "s_code_end", "s_icache_inv", "s_wakeup", "s_ttracedata"})


def operand(code: int, width: int = 1, literal: int | None = None, fp: bool = False) -> str:
    """One source or destination operand field (9-bit source encoding; VGPRs from 256)."""
    if code >= 256:
        n = code - 256
        return f"v{n}" if width == 1 else f"v[{n}:{n + width - 1}]"
    if code <= 105:
        return f"s{code}" if width == 1 else f"s[{code}:{code + width - 1}]"
    if 108 <= code <= 123:
        n = code - 108
        return f"ttmp{n}" if width == 1 else f"ttmp[{n}:{n + width - 1}]"
    if width == 2 and code in (106, 126):
        return "vcc" if code == 106 else "exec"
    if code in NAMED:
        return NAMED[code]
    if 128 <= code <= 192:
        return str(code - 128)
    if 193 <= code <= 208:
        return str(192 - code)
    if code in FLOAT_CONSTANTS:
        return repr(FLOAT_CONSTANTS[code])
    if code == INV_2PI:
        return "0.15915494"
    if code == LITERAL:
        return f"{literal or 0:#x}" if literal else "0"
    return f"?{code}"


def _src(inst: Inst, key: str, width: int, neg: int = 0, ab: int = 0) -> str:
    text = operand(inst.f[key], width, inst.literal)
    if ab:
        text = f"|{text}|"
    if neg:
        text = f"-{text}"
    return text


def format_inst(inst: Inst) -> str:
    """See the module docstring."""
    f, w, name = inst.f, inst.widths, inst.name
    ws = list(w) + [1] * 8
    enc = inst.enc
    ops: list[str] = []
    mods: list[str] = []
    if enc == "SOP2":
        ops = [
            operand(f["sdst"], ws[0]),
            operand(f["ssrc0"], ws[1], inst.literal),
            operand(f["ssrc1"], ws[2], inst.literal),
        ]
    elif enc == "SOP1":
        ops = [operand(f["sdst"], ws[0]), operand(f["ssrc0"], ws[1], inst.literal)][: len(w)]
        if name in ("s_setpc_b64", "s_rfe_b64"):
            ops = [operand(f["ssrc0"], 2)]
    elif enc == "SOPC":
        ops = [operand(f["ssrc0"], ws[0], inst.literal), operand(f["ssrc1"], ws[1], inst.literal)]
    elif enc == "SOPK":
        imm = f["simm16"] - (1 << 16) if f["simm16"] & 0x8000 and "_u32" not in name else f["simm16"]
        ops = [operand(f["sdst"], ws[0]), f"{imm:#x}"]
    elif enc == "SOPP":
        simm = f["simm16"]
        ops = [str(simm)] if w and (simm or name not in SOPP_NO_ZERO) else []
    elif enc == "SMEM":
        soff = f["soffset"]
        ops = [operand(f["sdata"], ws[0]), operand(f["sbase"], 2)]
        if soff != 124:
            ops.append(operand(soff, 1))
            if f["offset"]:
                mods.append(f"offset:{f['offset']:#x}")
        else:
            ops.append(f"{f['offset']:#x}" if f["offset"] else "null")
    elif enc in ("VOP1", "VOP2", "VOPC", "VOPD"):
        ops = _vop12c(inst)
    elif enc == "VOP3":
        cmpx = inst.op < 256 and name.startswith("v_cmpx")
        sdst = name in VOP3_SDST
        head = [] if cmpx else [operand(f["vdst"], ws[0])]
        if sdst:
            head.append(operand(f["sdst"], 1))
        srcs = []
        for i in range(min(len(w) - len(head), 3)):
            ab = 0 if sdst else (f["abs"] >> i) & 1
            srcs.append(_src(inst, ("src0", "src1", "src2")[i], ws[len(head) + i], (f["neg"] >> i) & 1, ab))
        ops = head + srcs
        if f["clamp"]:
            mods.append("clamp")
        if f["omod"]:
            mods.append(("", "mul:2", "mul:4", "div:2")[f["omod"]])
    elif enc == "VOP3P":
        nsrc = len(w) - 1
        ops = [operand(f["vdst"], ws[0])] + [
            _src(inst, k, ws[1 + i]) for i, k in enumerate(("src0", "src1", "src2")[:nsrc])
        ]
    elif enc == "DS":
        ops = _ds(inst, mods)
    elif enc in ("FLAT", "GLOBAL", "SCRATCH"):
        ops = _flat(inst, mods)
    text = name + (" " + ", ".join(ops) if ops else "") + (" " + " ".join(mods) if mods else "")
    if inst.y is not None:
        text += " :: " + format_inst(inst.y)
    return text


def _vop12c(inst: Inst) -> list[str]:
    f, w, name = inst.f, inst.widths, inst.name
    ws = list(w) + [1] * 4
    lit = inst.literal
    if inst.enc == "VOPC":
        first = 0 if name.startswith("v_cmpx") else 1  # v_cmp prints its VCC destination first, v_cmpx none
        srcs = [operand(f["src0"], ws[first], lit), operand(f["vsrc1"], ws[first + 1])]
        return srcs if first == 0 else ["vcc_lo", *srcs]
    if inst.enc == "VOP1":
        if len(w) == 0:
            return []
        return [operand(f["vdst"], ws[0]), operand(f["src0"], ws[1], lit)][: len(w)]
    dst = operand(f["vdst"], ws[0])
    src0 = operand(f["src0"], ws[1], lit)
    src1 = operand(f["vsrc1"], ws[2])
    if name in ("v_add_co_ci_u32", "v_sub_co_ci_u32", "v_subrev_co_ci_u32"):
        return [dst, "vcc_lo", src0, src1, "vcc_lo"]
    if name in ("v_cndmask_b32", "v_dual_cndmask_b32"):
        return [dst, src0, src1] + (["vcc_lo"] if inst.enc == "VOP2" else [])
    if name.endswith("fmamk_f32") or name == "v_fmamk_f16":
        return [dst, src0, f"{lit:#x}", src1]
    if name.endswith("fmaak_f32") or name == "v_fmaak_f16":
        return [dst, src0, src1, f"{lit:#x}"]
    if name in ("v_dual_mov_b32",):
        return [dst, src0]
    return [dst, src0, src1]


def _ds(inst: Inst, mods: list[str]) -> list[str]:
    f, w, name = inst.f, inst.widths, inst.name
    ops: list[str] = []
    rtn = "load" in name or "_rtn" in name or name in ("ds_swizzle_b32", "ds_permute_b32", "ds_bpermute_b32")
    i = 0
    if rtn:
        ops.append(operand(f["vdst"] + 256, w[0]))
        i = 1
    if i < len(w):
        ops.append(operand(f["addr"] + 256, w[i]))
        i += 1
    if i < len(w):
        ops.append(operand(f["data0"] + 256, w[i]))
        i += 1
    if i < len(w):
        ops.append(operand(f["data1"] + 256, w[i]))
    if "2addr" in name:
        if f["offset0"]:
            mods.append(f"offset0:{f['offset0']}")
        if f["offset1"]:
            mods.append(f"offset1:{f['offset1']}")
    else:
        off = f["offset0"] | f["offset1"] << 8
        if off:
            mods.append(f"offset:{off}")
    return ops


def _flat(inst: Inst, mods: list[str]) -> list[str]:
    f, w, name = inst.f, inst.widths, inst.name
    saddr = f["saddr"]
    has_saddr = inst.enc != "FLAT" and saddr not in (124, 125)
    addr = operand(f["addr"] + 256, 1 if has_saddr else 2)
    is_load = "load" in name or ("atomic" in name and f["glc"])
    ops = []
    if is_load:
        ops.append(operand(f["vdst"] + 256, w[0]))
        ops.append(addr)
        if "atomic" in name:
            ops.append(operand(f["data"] + 256, w[2]))
    else:
        ops.append(addr)
        ops.append(operand(f["data"] + 256, w[1]))
    if inst.enc != "FLAT":
        ops.append(operand(saddr, 2) if has_saddr else "off")
    if f["offset"]:
        mods.append(f"offset:{f['offset']}")
    if f["glc"] and "atomic" not in name:
        mods.append("glc")
    if f["slc"]:
        mods.append("slc")
    return ops


def literal_float(bits: int) -> float:
    """The f32 value of a 32-bit literal."""
    return float(struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0])
