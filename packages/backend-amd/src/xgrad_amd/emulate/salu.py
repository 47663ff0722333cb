"""Scalar instructions: SOP1, SOP2, SOPK, SOPC and SOPP (ALU, compares, EXEC save/restore, branches, program end).

In: a decoded `Inst`. Out: a function of a `Wave` that executes it (and moves `pc`), built once per instruction.
Values are Python ints (32 or 64 bits); SCC is set as the RDNA3 ISA reference gives for each opcode.
"""

from __future__ import annotations

from collections.abc import Callable

from xgrad_amd.emulate.decode import EmulatorError, Inst
from xgrad_amd.emulate.wave import EXEC, M32, M64, VCC, Wave

Exec = Callable[[Wave], None]


def _s32(v: int) -> int:
    v &= M32
    return v - (1 << 32) if v & 0x80000000 else v


def _s64(v: int) -> int:
    v &= M64
    return v - (1 << 64) if v >> 63 else v


def _bfe(v: int, spec: int, bits: int, signed: bool) -> int:
    off = spec & (bits - 1)
    width = (spec >> 16) & 0x7F
    if width == 0:
        return 0
    r = (v >> off) & ((1 << width) - 1)
    if signed and r >> (width - 1) & 1 and off + width <= bits:
        r -= 1 << width
    return r


# name -> (fn(a, b) -> (result, scc or None to keep), 64-bit result?, 64-bit sources?)
_SOP2: dict[str, tuple[Callable[[int, int], tuple[int, int | None]], bool, bool]] = {
    "s_add_u32": (lambda a, b: (a + b, int(a + b > M32)), False, False),
    "s_sub_u32": (lambda a, b: (a - b, int(b > a)), False, False),
    "s_add_i32": (
        lambda a, b: (a + b, int(((_s32(a) + _s32(b)) > 0x7FFFFFFF) or (_s32(a) + _s32(b) < -(1 << 31)))),
        False,
        False,
    ),
    "s_sub_i32": (
        lambda a, b: (a - b, int(((_s32(a) - _s32(b)) > 0x7FFFFFFF) or (_s32(a) - _s32(b) < -(1 << 31)))),
        False,
        False,
    ),
    "s_min_i32": (lambda a, b: (a if _s32(a) < _s32(b) else b, int(_s32(a) < _s32(b))), False, False),
    "s_min_u32": (lambda a, b: (min(a, b), int(a < b)), False, False),
    "s_max_i32": (lambda a, b: (a if _s32(a) > _s32(b) else b, int(_s32(a) > _s32(b))), False, False),
    "s_max_u32": (lambda a, b: (max(a, b), int(a > b)), False, False),
    "s_and_b32": (lambda a, b: (a & b, int(a & b != 0)), False, False),
    "s_or_b32": (lambda a, b: (a | b, int(a | b != 0)), False, False),
    "s_xor_b32": (lambda a, b: (a ^ b, int(a ^ b != 0)), False, False),
    "s_and_not1_b32": (lambda a, b: (a & ~b & M32, int(a & ~b & M32 != 0)), False, False),
    "s_or_not1_b32": (lambda a, b: ((a | ~b) & M32, int((a | ~b) & M32 != 0)), False, False),
    "s_nand_b32": (lambda a, b: (~(a & b) & M32, int(~(a & b) & M32 != 0)), False, False),
    "s_nor_b32": (lambda a, b: (~(a | b) & M32, int(~(a | b) & M32 != 0)), False, False),
    "s_xnor_b32": (lambda a, b: (~(a ^ b) & M32, int(~(a ^ b) & M32 != 0)), False, False),
    "s_and_b64": (lambda a, b: (a & b, int(a & b != 0)), True, True),
    "s_or_b64": (lambda a, b: (a | b, int(a | b != 0)), True, True),
    "s_xor_b64": (lambda a, b: (a ^ b, int(a ^ b != 0)), True, True),
    "s_and_not1_b64": (lambda a, b: (a & ~b & M64, int(a & ~b & M64 != 0)), True, True),
    "s_or_not1_b64": (lambda a, b: ((a | ~b) & M64, int((a | ~b) & M64 != 0)), True, True),
    "s_lshl_b32": (lambda a, b: ((a << (b & 31)) & M32, int((a << (b & 31)) & M32 != 0)), False, False),
    "s_lshr_b32": (lambda a, b: (a >> (b & 31), int(a >> (b & 31) != 0)), False, False),
    "s_ashr_i32": (lambda a, b: (_s32(a) >> (b & 31), int(_s32(a) >> (b & 31) != 0)), False, False),
    "s_lshl1_add_u32": (lambda a, b: ((a << 1) + b, int((a << 1) + b > M32)), False, False),
    "s_lshl2_add_u32": (lambda a, b: ((a << 2) + b, int((a << 2) + b > M32)), False, False),
    "s_lshl3_add_u32": (lambda a, b: ((a << 3) + b, int((a << 3) + b > M32)), False, False),
    "s_lshl4_add_u32": (lambda a, b: ((a << 4) + b, int((a << 4) + b > M32)), False, False),
    "s_bfm_b32": (lambda a, b: ((((1 << (a & 31)) - 1) << (b & 31)) & M32, None), False, False),
    "s_mul_i32": (lambda a, b: (_s32(a) * _s32(b), None), False, False),
    "s_mul_hi_u32": (lambda a, b: ((a * b) >> 32, None), False, False),
    "s_mul_hi_i32": (lambda a, b: ((_s32(a) * _s32(b)) >> 32, None), False, False),
    "s_bfe_u32": (lambda a, b: (_bfe(a, b, 32, False), int(_bfe(a, b, 32, False) != 0)), False, False),
    "s_bfe_i32": (lambda a, b: (_bfe(a, b, 32, True), int(_bfe(a, b, 32, True) != 0)), False, False),
    "s_absdiff_i32": (lambda a, b: (abs(_s32(a) - _s32(b)), int(_s32(a) != _s32(b))), False, False),
    "s_pack_ll_b32_b16": (lambda a, b: ((a & 0xFFFF) | (b & 0xFFFF) << 16, None), False, False),
    "s_pack_lh_b32_b16": (lambda a, b: ((a & 0xFFFF) | (b & 0xFFFF0000), None), False, False),
    "s_pack_hh_b32_b16": (lambda a, b: ((a >> 16) | (b & 0xFFFF0000), None), False, False),
}
_SOP2_SHIFT64: dict[str, Callable[[int, int], int]] = {
    "s_lshl_b64": lambda a, b: (a << (b & 63)) & M64,
    "s_lshr_b64": lambda a, b: a >> (b & 63),
    "s_ashr_i64": lambda a, b: _s64(a) >> (b & 63),
    "s_bfe_u64": lambda a, b: _bfe(a, b, 64, False),
    "s_bfe_i64": lambda a, b: _bfe(a, b, 64, True),
    "s_bfm_b64": lambda a, b: (((1 << (a & 63)) - 1) << (b & 63)) & M64,
}
_SOPC: dict[str, Callable[[int, int], bool]] = {
    "s_cmp_eq_i32": lambda a, b: a == b,
    "s_cmp_lg_i32": lambda a, b: a != b,
    "s_cmp_gt_i32": lambda a, b: _s32(a) > _s32(b),
    "s_cmp_ge_i32": lambda a, b: _s32(a) >= _s32(b),
    "s_cmp_lt_i32": lambda a, b: _s32(a) < _s32(b),
    "s_cmp_le_i32": lambda a, b: _s32(a) <= _s32(b),
    "s_cmp_eq_u32": lambda a, b: a == b,
    "s_cmp_lg_u32": lambda a, b: a != b,
    "s_cmp_gt_u32": lambda a, b: a > b,
    "s_cmp_ge_u32": lambda a, b: a >= b,
    "s_cmp_lt_u32": lambda a, b: a < b,
    "s_cmp_le_u32": lambda a, b: a <= b,
    "s_bitcmp0_b32": lambda a, b: not (a >> (b & 31)) & 1,
    "s_bitcmp1_b32": lambda a, b: bool((a >> (b & 31)) & 1),
    "s_cmp_eq_u64": lambda a, b: a == b,
    "s_cmp_lg_u64": lambda a, b: a != b,
}
_SOP1_32: dict[str, Callable[[int], tuple[int, int | None]]] = {
    "s_mov_b32": lambda a: (a, None),
    "s_not_b32": lambda a: (~a & M32, int(~a & M32 != 0)),
    "s_brev_b32": lambda a: (int(f"{a:032b}"[::-1], 2), None),
    "s_bcnt1_i32_b32": lambda a: (a.bit_count(), int(a != 0)),
    "s_bcnt0_i32_b32": lambda a: (32 - a.bit_count(), int(a != M32)),
    "s_ctz_i32_b32": lambda a: ((a & -a).bit_length() - 1 if a else M32, None),
    "s_clz_i32_u32": lambda a: (32 - a.bit_length() if a else M32, None),
    "s_sext_i32_i8": lambda a: ((a & 0xFF) - ((a & 0x80) << 1), None),
    "s_sext_i32_i16": lambda a: ((a & 0xFFFF) - ((a & 0x8000) << 1), None),
    "s_abs_i32": lambda a: (abs(_s32(a)), int(a != 0)),
}
# s_<op>_saveexec_b32: D = EXEC; EXEC = f(S0, EXEC); SCC = EXEC != 0
_SAVEEXEC: dict[str, Callable[[int, int], int]] = {
    "s_and_saveexec_b32": lambda s, e: s & e,
    "s_or_saveexec_b32": lambda s, e: s | e,
    "s_xor_saveexec_b32": lambda s, e: s ^ e,
    "s_and_not1_saveexec_b32": lambda s, e: s & ~e & M32,
    "s_or_not1_saveexec_b32": lambda s, e: (s | ~e) & M32,
    "s_and_not0_saveexec_b32": lambda s, e: ~s & e & M32,
    "s_or_not0_saveexec_b32": lambda s, e: (~s | e) & M32,
    "s_nand_saveexec_b32": lambda s, e: ~(s & e) & M32,
    "s_nor_saveexec_b32": lambda s, e: ~(s | e) & M32,
    "s_xnor_saveexec_b32": lambda s, e: ~(s ^ e) & M32,
}
_BRANCH: dict[str, Callable[[Wave], bool]] = {
    "s_branch": lambda w: True,
    "s_cbranch_scc0": lambda w: w.scc == 0,
    "s_cbranch_scc1": lambda w: w.scc == 1,
    "s_cbranch_vccz": lambda w: w.s[VCC] == 0,
    "s_cbranch_vccnz": lambda w: w.s[VCC] != 0,
    "s_cbranch_execz": lambda w: w.s[EXEC] == 0,
    "s_cbranch_execnz": lambda w: w.s[EXEC] != 0,
}
# no effect in an in-order emulator: waits, scheduling hints, cache invalidations, priorities, message sends
NOPS = frozenset({
    "s_nop", "s_waitcnt", "s_waitcnt_depctr", "s_delay_alu", "s_clause", "s_sendmsg", "s_set_inst_prefetch_distance",
    "s_waitcnt_vscnt", "s_waitcnt_vmcnt", "s_waitcnt_lgkmcnt", "s_waitcnt_expcnt", "s_setprio", "s_sleep",
    "s_icache_inv", "s_round_mode", "s_denorm_mode", "s_setreg_imm32_b32", "s_setreg_b32", "s_code_end",
    "s_wait_event", "s_inst_prefetch", "buffer_gl0_inv", "buffer_gl1_inv", "s_dcache_inv", "s_gl1_inv",
})  # fmt: skip


def build_scalar(inst: Inst) -> Exec:
    """The executor of one scalar instruction (advances pc by its size, or branches)."""
    name, f, lit, size = inst.name, inst.f, inst.literal, inst.size
    if name in NOPS:

        def nop(w: Wave) -> None:
            w.pc += size

        return nop
    if name in _SOP2:
        fn, wide_out, wide_in = _SOP2[name]
        a_code, b_code, d = f["ssrc0"], f["ssrc1"], f["sdst"]
        mask = M64 if wide_out else M32
        read = Wave.sread64 if wide_in else Wave.sread

        def sop2(w: Wave) -> None:
            r, scc = fn(read(w, a_code, lit), read(w, b_code, lit))
            (w.swrite64 if wide_out else w.swrite)(d, r & mask)
            if scc is not None:
                w.scc = scc
            w.pc += size

        return sop2
    if name in _SOP2_SHIFT64:
        fn64 = _SOP2_SHIFT64[name]
        a_code, b_code, d = f["ssrc0"], f["ssrc1"], f["sdst"]

        def shift64(w: Wave) -> None:
            r = fn64(w.sread64(a_code, lit), w.sread(b_code, lit)) & M64
            w.swrite64(d, r)
            w.scc = int(r != 0)
            w.pc += size

        return shift64
    if name in ("s_addc_u32", "s_subb_u32", "s_cselect_b32", "s_cselect_b64"):
        a_code, b_code, d = f["ssrc0"], f["ssrc1"], f["sdst"]

        def carry(w: Wave) -> None:
            if name == "s_cselect_b64":
                w.swrite64(d, w.sread64(a_code, lit) if w.scc else w.sread64(b_code, lit))
            else:
                a, b = w.sread(a_code, lit), w.sread(b_code, lit)
                if name == "s_cselect_b32":
                    w.swrite(d, a if w.scc else b)
                elif name == "s_addc_u32":
                    r = a + b + w.scc
                    w.swrite(d, r & M32)
                    w.scc = int(r > M32)
                else:
                    r = a - b - w.scc
                    w.swrite(d, r & M32)
                    w.scc = int(r < 0)
            w.pc += size

        return carry
    if name in _SOPC:
        cmp = _SOPC[name]
        a_code, b_code = f["ssrc0"], f["ssrc1"]
        read = Wave.sread64 if name.endswith("64") else Wave.sread

        def sopc(w: Wave) -> None:
            w.scc = int(cmp(read(w, a_code, lit), read(w, b_code, lit)))
            w.pc += size

        return sopc
    if inst.enc == "SOP1":
        return _build_sop1(inst)
    if inst.enc == "SOPK":
        return _build_sopk(inst)
    if inst.enc == "SOPP":
        return _build_sopp(inst)
    raise EmulatorError(f"unimplemented scalar instruction {name} ({inst.enc} opcode {inst.op}) at {inst.addr:#x}")


def _build_sop1(inst: Inst) -> Exec:
    name, f, lit, size = inst.name, inst.f, inst.literal, inst.size
    a_code, d = f["ssrc0"], f["sdst"]
    if name in _SOP1_32:
        fn = _SOP1_32[name]

        def sop1(w: Wave) -> None:
            r, scc = fn(w.sread(a_code, lit))
            w.swrite(d, r & M32)
            if scc is not None:
                w.scc = scc
            w.pc += size

        return sop1
    if name in _SAVEEXEC:
        op = _SAVEEXEC[name]

        def saveexec(w: Wave) -> None:
            old = w.s[EXEC]
            w.s[EXEC] = op(w.sread(a_code, lit), old) & M32
            w.swrite(d, old)
            w.scc = int(w.s[EXEC] != 0)
            w.pc += size

        return saveexec
    if name in ("s_mov_b64", "s_not_b64", "s_cmov_b32", "s_cmov_b64", "s_bitset0_b32", "s_bitset1_b32"):

        def misc(w: Wave) -> None:
            if name == "s_mov_b64":
                w.swrite64(d, w.sread64(a_code, lit))
            elif name == "s_not_b64":
                r = ~w.sread64(a_code, lit) & M64
                w.swrite64(d, r)
                w.scc = int(r != 0)
            elif name == "s_cmov_b32" and w.scc:
                w.swrite(d, w.sread(a_code, lit))
            elif name == "s_cmov_b64" and w.scc:
                w.swrite64(d, w.sread64(a_code, lit))
            elif name == "s_bitset0_b32":
                w.swrite(d, w.s[d] & ~(1 << (w.sread(a_code, lit) & 31)))
            elif name == "s_bitset1_b32":
                w.swrite(d, w.s[d] | (1 << (w.sread(a_code, lit) & 31)))
            w.pc += size

        return misc
    if name == "s_getpc_b64":

        def getpc(w: Wave) -> None:
            w.swrite64(d, w.group.code_base + w.pc + size)
            w.pc += size

        return getpc
    if name in ("s_setpc_b64", "s_swappc_b64"):

        def setpc(w: Wave) -> None:
            target = w.sread64(a_code) - w.group.code_base
            if name == "s_swappc_b64":
                w.swrite64(d, w.group.code_base + w.pc + size)
            w.pc = target

        return setpc
    raise EmulatorError(f"unimplemented scalar instruction {name} (SOP1 opcode {inst.op}) at {inst.addr:#x}")


def _build_sopk(inst: Inst) -> Exec:
    name, f, size = inst.name, inst.f, inst.size
    d, imm = f["sdst"], f["simm16"]
    simm = imm - (1 << 16) if imm & 0x8000 else imm
    if name in NOPS or name.startswith("s_waitcnt"):

        def nop(w: Wave) -> None:
            w.pc += size

        return nop
    if name.startswith("s_cmpk_"):
        cmp = _SOPC["s_cmp_" + name[7:]]
        k = imm if name.endswith("u32") else simm & M32

        def cmpk(w: Wave) -> None:
            w.scc = int(cmp(w.s[d], k))
            w.pc += size

        return cmpk

    def sopk(w: Wave) -> None:
        if name == "s_movk_i32":
            w.swrite(d, simm & M32)
        elif name == "s_cmovk_i32":
            if w.scc:
                w.swrite(d, simm & M32)
        elif name == "s_addk_i32":
            r = _s32(w.s[d]) + simm
            w.scc = int(r > 0x7FFFFFFF or r < -(1 << 31))
            w.swrite(d, r & M32)
        elif name == "s_mulk_i32":
            w.swrite(d, (_s32(w.s[d]) * simm) & M32)
        elif name == "s_getreg_b32":
            w.swrite(d, 0)
        else:
            raise EmulatorError(f"unimplemented scalar instruction {name} (SOPK opcode {inst.op}) at {inst.addr:#x}")
        w.pc += size

    return sopk


def _build_sopp(inst: Inst) -> Exec:
    name, size = inst.name, inst.size
    imm = inst.f["simm16"]
    simm = imm - (1 << 16) if imm & 0x8000 else imm
    if name in _BRANCH:
        cond = _BRANCH[name]
        target = 4 * simm

        def branch(w: Wave) -> None:
            w.pc += size + (target if cond(w) else 0)

        return branch
    if name in ("s_endpgm", "s_endpgm_saved"):

        def end(w: Wave) -> None:
            w.done = True

        return end
    if name == "s_barrier":

        def barrier(w: Wave) -> None:
            w.pc += size
            w.at_barrier = True

        return barrier
    raise EmulatorError(f"unimplemented scalar instruction {name} (SOPP opcode {inst.op}) at {inst.addr:#x}")
