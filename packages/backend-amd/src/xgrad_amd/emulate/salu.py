"""Scalar instructions: SOP1, SOP2, SOPK, SOPC and SOPP (ALU, compares, EXEC save/restore, branches, program end).

In: a decoded `Inst`. Out: a function of `Waves` that executes it for the selected waves (and moves their pc), built
once per instruction. Values are int64 arrays with one 32-bit value per wave (uint64 for 64-bit operands); SCC is set
as the RDNA3 ISA reference gives for each opcode.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from xgrad_amd.emulate.decode import EmulatorError, Inst
from xgrad_amd.emulate.wave import EXEC, M32, VCC, Waves

Exec = Callable[[Waves], None]
A = np.ndarray
T32 = 1 << 32


def _s32(v: A) -> A:
    v = v & M32
    return np.where(v >= 1 << 31, v - T32, v)


def _nz(v: A) -> A:
    return np.asarray(v != 0).astype(np.int64)


def _bfe(v: A, spec: A, bits: int, signed: bool) -> A:
    off = (spec & (bits - 1)).astype(np.uint64)
    width = ((spec >> 16) & 0x7F).astype(np.uint64)
    u = v.astype(np.uint64)
    field = (u >> off) & ((np.uint64(1) << np.minimum(width, np.uint64(63))) - np.uint64(1))
    if signed:
        w = width.astype(np.int64)
        f = field.astype(np.int64)
        negative = (w > 0) & (((f >> np.maximum(w - 1, 0)) & 1) == 1)
        field = np.where(negative, f - (np.int64(1) << w), f).astype(np.uint64)
    return np.where(width == 0, np.uint64(0), field)


def _add_i32(a: A, b: A) -> tuple[A, A]:
    r = _s32(a) + _s32(b)
    return r, ((r > 0x7FFFFFFF) | (r < -(1 << 31))).astype(np.int64)


def _sub_i32(a: A, b: A) -> tuple[A, A]:
    r = _s32(a) - _s32(b)
    return r, ((r > 0x7FFFFFFF) | (r < -(1 << 31))).astype(np.int64)


Op2 = Callable[[A, A], tuple[A, A | None]]
# 32-bit SOP2: name -> fn(a, b) -> (result, SCC or None to keep it)
_SOP2: dict[str, Op2] = {
    "s_add_u32": lambda a, b: (a + b, (a + b > M32).astype(np.int64)),
    "s_sub_u32": lambda a, b: (a - b, (b > a).astype(np.int64)),
    "s_add_i32": _add_i32,
    "s_sub_i32": _sub_i32,
    "s_min_i32": lambda a, b: (np.where(_s32(a) < _s32(b), a, b), (_s32(a) < _s32(b)).astype(np.int64)),
    "s_min_u32": lambda a, b: (np.minimum(a, b), (a < b).astype(np.int64)),
    "s_max_i32": lambda a, b: (np.where(_s32(a) > _s32(b), a, b), (_s32(a) > _s32(b)).astype(np.int64)),
    "s_max_u32": lambda a, b: (np.maximum(a, b), (a > b).astype(np.int64)),
    "s_and_b32": lambda a, b: (a & b, _nz(a & b)),
    "s_or_b32": lambda a, b: (a | b, _nz(a | b)),
    "s_xor_b32": lambda a, b: (a ^ b, _nz(a ^ b)),
    "s_and_not1_b32": lambda a, b: (a & ~b & M32, _nz(a & ~b & M32)),
    "s_or_not1_b32": lambda a, b: ((a | ~b) & M32, _nz((a | ~b) & M32)),
    "s_nand_b32": lambda a, b: (~(a & b) & M32, _nz(~(a & b) & M32)),
    "s_nor_b32": lambda a, b: (~(a | b) & M32, _nz(~(a | b) & M32)),
    "s_xnor_b32": lambda a, b: (~(a ^ b) & M32, _nz(~(a ^ b) & M32)),
    "s_lshl_b32": lambda a, b: ((a << (b & 31)) & M32, _nz((a << (b & 31)) & M32)),
    "s_lshr_b32": lambda a, b: (a >> (b & 31), _nz(a >> (b & 31))),
    "s_ashr_i32": lambda a, b: (_s32(a) >> (b & 31), _nz(_s32(a) >> (b & 31))),
    "s_lshl1_add_u32": lambda a, b: ((a << 1) + b, ((a << 1) + b > M32).astype(np.int64)),
    "s_lshl2_add_u32": lambda a, b: ((a << 2) + b, ((a << 2) + b > M32).astype(np.int64)),
    "s_lshl3_add_u32": lambda a, b: ((a << 3) + b, ((a << 3) + b > M32).astype(np.int64)),
    "s_lshl4_add_u32": lambda a, b: ((a << 4) + b, ((a << 4) + b > M32).astype(np.int64)),
    "s_bfm_b32": lambda a, b: ((((np.int64(1) << (a & 31)) - 1) << (b & 31)) & M32, None),
    "s_mul_i32": lambda a, b: ((a * b) & M32, None),
    "s_mul_hi_u32": lambda a, b: ((a.astype(np.uint64) * b.astype(np.uint64) >> np.uint64(32)).astype(np.int64), None),
    "s_mul_hi_i32": lambda a, b: ((_s32(a) * _s32(b)) >> 32, None),
    "s_bfe_u32": lambda a, b: (_bfe(a, b, 32, False).astype(np.int64), _nz(_bfe(a, b, 32, False))),
    "s_bfe_i32": lambda a, b: (_bfe(a, b, 32, True).astype(np.int64), _nz(_bfe(a, b, 32, True) & np.uint64(M32))),
    "s_absdiff_i32": lambda a, b: (np.abs(_s32(a) - _s32(b)), _nz(np.abs(_s32(a) - _s32(b)))),
    "s_pack_ll_b32_b16": lambda a, b: ((a & 0xFFFF) | (b & 0xFFFF) << 16, None),
    "s_pack_lh_b32_b16": lambda a, b: ((a & 0xFFFF) | (b & 0xFFFF0000), None),
    "s_pack_hh_b32_b16": lambda a, b: ((a >> 16) | (b & 0xFFFF0000), None),
}
U64 = np.uint64
# 64-bit SOP2 (uint64 operands; shifts and bitfield specs take a 32-bit second operand): name -> (fn, wide second)
_SOP2_64: dict[str, tuple[Callable[[A, A], A], bool]] = {
    "s_and_b64": (lambda a, b: a & b, True),
    "s_or_b64": (lambda a, b: a | b, True),
    "s_xor_b64": (lambda a, b: a ^ b, True),
    "s_and_not1_b64": (lambda a, b: a & ~b, True),
    "s_or_not1_b64": (lambda a, b: a | ~b, True),
    "s_nand_b64": (lambda a, b: ~(a & b), True),
    "s_nor_b64": (lambda a, b: ~(a | b), True),
    "s_xnor_b64": (lambda a, b: ~(a ^ b), True),
    "s_lshl_b64": (lambda a, b: a << (b & 63).astype(U64), False),
    "s_lshr_b64": (lambda a, b: a >> (b & 63).astype(U64), False),
    "s_ashr_i64": (lambda a, b: (a.view(np.int64) >> (b & 63)).view(U64), False),
    "s_bfe_u64": (lambda a, b: _bfe(a, b, 64, False), False),
    "s_bfe_i64": (lambda a, b: _bfe(a, b, 64, True), False),
    "s_bfm_b64": (lambda a, b: ((U64(1) << (a & 63).astype(U64)) - U64(1)) << (b & 63).astype(U64), False),
}
_SOPC: dict[str, Callable[[A, A], A]] = {
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
    "s_bitcmp0_b32": lambda a, b: ((a >> (b & 31)) & 1) == 0,
    "s_bitcmp1_b32": lambda a, b: ((a >> (b & 31)) & 1) == 1,
    "s_cmp_eq_u64": lambda a, b: a == b,
    "s_cmp_lg_u64": lambda a, b: a != b,
}


def _ctz(a: A) -> A:
    low = a & -a
    return np.where(a == 0, M32, np.log2(np.where(low == 0, 1, low)).astype(np.int64))


def _clz(a: A) -> A:
    bits = np.floor(np.log2(np.where(a == 0, 1, a).astype(np.float64))).astype(np.int64)
    return np.where(a == 0, M32, 31 - bits)


def _brev(a: A) -> A:
    u = a.astype(np.uint32)
    r = np.zeros_like(u)
    for i in range(32):
        r |= ((u >> np.uint32(i)) & np.uint32(1)) << np.uint32(31 - i)
    return r.astype(np.int64)


_SOP1_32: dict[str, Callable[[A], tuple[A, A | None]]] = {
    "s_mov_b32": lambda a: (a, None),
    "s_not_b32": lambda a: (~a & M32, _nz(~a & M32)),
    "s_brev_b32": lambda a: (_brev(a), None),
    "s_bcnt1_i32_b32": lambda a: (np.bitwise_count(a).astype(np.int64), _nz(a)),
    "s_bcnt0_i32_b32": lambda a: (32 - np.bitwise_count(a).astype(np.int64), _nz(a - M32)),
    "s_ctz_i32_b32": lambda a: (_ctz(a), None),
    "s_clz_i32_u32": lambda a: (_clz(a), None),
    "s_sext_i32_i8": lambda a: ((a & 0xFF) - ((a & 0x80) << 1), None),
    "s_sext_i32_i16": lambda a: ((a & 0xFFFF) - ((a & 0x8000) << 1), None),
    "s_abs_i32": lambda a: (np.abs(_s32(a)), _nz(a)),
}
# s_<op>_saveexec_b32: D = EXEC; EXEC = f(S0, EXEC); SCC = EXEC != 0
_SAVEEXEC: dict[str, Callable[[A, A], A]] = {
    "s_and_saveexec_b32": lambda s, e: s & e,
    "s_or_saveexec_b32": lambda s, e: s | e,
    "s_xor_saveexec_b32": lambda s, e: s ^ e,
    "s_and_not1_saveexec_b32": lambda s, e: s & ~e,
    "s_or_not1_saveexec_b32": lambda s, e: s | ~e,
    "s_and_not0_saveexec_b32": lambda s, e: ~s & e,
    "s_or_not0_saveexec_b32": lambda s, e: ~s | e,
    "s_nand_saveexec_b32": lambda s, e: ~(s & e),
    "s_nor_saveexec_b32": lambda s, e: ~(s | e),
    "s_xnor_saveexec_b32": lambda s, e: ~(s ^ e),
}
_BRANCH: dict[str, Callable[[Waves], A | bool]] = {
    "s_branch": lambda w: True,
    "s_cbranch_scc0": lambda w: w.scc[w.ix] == 0,
    "s_cbranch_scc1": lambda w: w.scc[w.ix] == 1,
    "s_cbranch_vccz": lambda w: w.s[VCC, w.ix] == 0,
    "s_cbranch_vccnz": lambda w: w.s[VCC, w.ix] != 0,
    "s_cbranch_execz": lambda w: w.s[EXEC, w.ix] == 0,
    "s_cbranch_execnz": lambda w: w.s[EXEC, w.ix] != 0,
}
# no effect in an in-order emulator: waits, scheduling hints, cache invalidations, priorities, message sends; s_barrier
# too, as the scheduler runs no wave past an instruction another wave of the batch has not reached
NOPS = frozenset({
    "s_nop", "s_waitcnt", "s_waitcnt_depctr", "s_delay_alu", "s_clause", "s_sendmsg", "s_set_inst_prefetch_distance",
    "s_waitcnt_vscnt", "s_waitcnt_vmcnt", "s_waitcnt_lgkmcnt", "s_waitcnt_expcnt", "s_setprio", "s_sleep",
    "s_icache_inv", "s_round_mode", "s_denorm_mode", "s_setreg_imm32_b32", "s_setreg_b32", "s_code_end",
    "s_wait_event", "s_inst_prefetch", "buffer_gl0_inv", "buffer_gl1_inv", "s_dcache_inv", "s_gl1_inv", "s_barrier",
})  # fmt: skip


def build_scalar(inst: Inst) -> Exec:
    """The executor of one scalar instruction (advances pc by its size, or branches)."""
    name, f, lit, size = inst.name, inst.f, inst.literal, inst.size
    if name in NOPS:

        def nop(w: Waves) -> None:
            w.pc[w.ix] += size

        return nop
    if name in _SOP2:
        fn = _SOP2[name]
        a_code, b_code, d = f["ssrc0"], f["ssrc1"], f["sdst"]

        def sop2(w: Waves) -> None:
            r, scc = fn(w.sread(a_code, lit), w.sread(b_code, lit))
            w.swrite(d, r)
            if scc is not None:
                w.scc[w.ix] = scc
            w.pc[w.ix] += size

        return sop2
    if name in _SOP2_64:
        fn64, wide_b = _SOP2_64[name]
        a_code, b_code, d = f["ssrc0"], f["ssrc1"], f["sdst"]

        def sop2_64(w: Waves) -> None:
            b = w.sread64(b_code, lit) if wide_b else w.sread(b_code, lit)
            r = fn64(w.sread64(a_code, lit), b).astype(U64)
            w.swrite64(d, r)
            w.scc[w.ix] = r != 0
            w.pc[w.ix] += size

        return sop2_64
    if name in ("s_addc_u32", "s_subb_u32", "s_cselect_b32", "s_cselect_b64"):
        a_code, b_code, d = f["ssrc0"], f["ssrc1"], f["sdst"]

        def carry(w: Waves) -> None:
            scc = w.scc[w.ix]
            if name == "s_cselect_b64":
                w.swrite64(d, np.where(scc != 0, w.sread64(a_code, lit), w.sread64(b_code, lit)))
            else:
                a, b = w.sread(a_code, lit), w.sread(b_code, lit)
                if name == "s_cselect_b32":
                    w.swrite(d, np.where(scc != 0, a, b))
                elif name == "s_addc_u32":
                    r = a + b + scc
                    w.swrite(d, r)
                    w.scc[w.ix] = r > M32
                else:
                    r = a - b - scc
                    w.swrite(d, r)
                    w.scc[w.ix] = r < 0
            w.pc[w.ix] += size

        return carry
    if name in _SOPC:
        cmp = _SOPC[name]
        a_code, b_code = f["ssrc0"], f["ssrc1"]
        wide = name.endswith("64")

        def sopc(w: Waves) -> None:
            if wide:
                w.scc[w.ix] = cmp(w.sread64(a_code, lit), w.sread64(b_code, lit))
            else:
                w.scc[w.ix] = cmp(w.sread(a_code, lit), w.sread(b_code, lit))
            w.pc[w.ix] += size

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

        def sop1(w: Waves) -> None:
            r, scc = fn(w.sread(a_code, lit))
            w.swrite(d, r)
            if scc is not None:
                w.scc[w.ix] = scc
            w.pc[w.ix] += size

        return sop1
    if name in _SAVEEXEC:
        op = _SAVEEXEC[name]

        def saveexec(w: Waves) -> None:
            old = w.s[EXEC, w.ix].copy()
            w.swrite(EXEC, op(w.sread(a_code, lit), old) & M32)
            w.swrite(d, old)
            w.scc[w.ix] = w.s[EXEC, w.ix] != 0
            w.pc[w.ix] += size

        return saveexec
    if name in ("s_mov_b64", "s_not_b64", "s_cmov_b32", "s_cmov_b64", "s_bitset0_b32", "s_bitset1_b32"):

        def misc(w: Waves) -> None:
            if name == "s_mov_b64":
                w.swrite64(d, w.sread64(a_code, lit))
            elif name == "s_not_b64":
                r = ~w.sread64(a_code, lit)
                w.swrite64(d, r)
                w.scc[w.ix] = r != 0
            elif name == "s_cmov_b32":
                w.swrite(d, np.where(w.scc[w.ix] != 0, w.sread(a_code, lit), w.sread(d)))
            elif name == "s_cmov_b64":
                w.swrite64(d, np.where(w.scc[w.ix] != 0, w.sread64(a_code, lit), w.sread64(d)))
            elif name == "s_bitset0_b32":
                w.swrite(d, w.sread(d) & ~(np.int64(1) << (w.sread(a_code, lit) & 31)))
            else:
                w.swrite(d, w.sread(d) | (np.int64(1) << (w.sread(a_code, lit) & 31)))
            w.pc[w.ix] += size

        return misc
    if name == "s_getpc_b64":

        def getpc(w: Waves) -> None:
            w.swrite64(d, (w.code_base + w.pc[w.ix] + size).astype(U64))
            w.pc[w.ix] += size

        return getpc
    if name in ("s_setpc_b64", "s_swappc_b64"):

        def setpc(w: Waves) -> None:
            target = w.sread64(a_code).astype(np.int64) - w.code_base
            if name == "s_swappc_b64":
                w.swrite64(d, (w.code_base + w.pc[w.ix] + size).astype(U64))
            w.pc[w.ix] = target

        return setpc
    raise EmulatorError(f"unimplemented scalar instruction {name} (SOP1 opcode {inst.op}) at {inst.addr:#x}")


def _build_sopk(inst: Inst) -> Exec:
    name, f, size = inst.name, inst.f, inst.size
    d, imm = f["sdst"], f["simm16"]
    simm = imm - (1 << 16) if imm & 0x8000 else imm
    if name in NOPS or name.startswith("s_waitcnt"):

        def nop(w: Waves) -> None:
            w.pc[w.ix] += size

        return nop
    if name.startswith("s_cmpk_"):
        cmp = _SOPC["s_cmp_" + name[7:]]
        k = imm if name.endswith("u32") else simm & M32

        def cmpk(w: Waves) -> None:
            w.scc[w.ix] = cmp(w.sread(d), np.full(w.k, k, np.int64))
            w.pc[w.ix] += size

        return cmpk
    if name not in ("s_movk_i32", "s_cmovk_i32", "s_addk_i32", "s_mulk_i32", "s_getreg_b32"):
        raise EmulatorError(f"unimplemented scalar instruction {name} (SOPK opcode {inst.op}) at {inst.addr:#x}")

    def sopk(w: Waves) -> None:
        if name == "s_movk_i32":
            w.swrite(d, np.full(w.k, simm & M32, np.int64))
        elif name == "s_cmovk_i32":
            w.swrite(d, np.where(w.scc[w.ix] != 0, simm & M32, w.sread(d)))
        elif name == "s_addk_i32":
            r = _s32(w.sread(d)) + simm
            w.scc[w.ix] = (r > 0x7FFFFFFF) | (r < -(1 << 31))
            w.swrite(d, r)
        elif name == "s_mulk_i32":
            w.swrite(d, _s32(w.sread(d)) * simm)
        else:  # s_getreg_b32: the hardware registers read as 0 (default modes)
            w.swrite(d, np.zeros(w.k, np.int64))
        w.pc[w.ix] += size

    return sopk


def _build_sopp(inst: Inst) -> Exec:
    name, size = inst.name, inst.size
    imm = inst.f["simm16"]
    simm = imm - (1 << 16) if imm & 0x8000 else imm
    if name in _BRANCH:
        cond = _BRANCH[name]
        target = 4 * simm

        def branch(w: Waves) -> None:
            w.pc[w.ix] += size + np.where(cond(w), target, 0)

        return branch
    if name in ("s_endpgm", "s_endpgm_saved"):

        def end(w: Waves) -> None:
            w.done[w.ix] = True

        return end
    raise EmulatorError(f"unimplemented scalar instruction {name} (SOPP opcode {inst.op}) at {inst.addr:#x}")
