"""Vector ALU instructions: VOP1, VOP2, VOP3, VOPC, VOPD (dual issue) and VOP3P (packed 16-bit, mixed FMA, dot, WMMA).

In: a decoded `Inst`. Out: a function of `Waves` that executes it on the lanes EXEC enables in the selected waves,
built once. Sources are read as the types `valu_ops.OPS` gives, with VOP3's abs/neg source modifiers and clamp/omod
output modifiers applied; 16-bit results go to the low half of the VGPR (the high half with op_sel[3]) and keep the
other half.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from xgrad_amd.emulate.decode import LITERAL, EmulatorError, Inst
from xgrad_amd.emulate.valu_ops import CLASS, NP, OPS
from xgrad_amd.emulate.wave import EXEC, LANES, M32, VCC, Waves, bits_of, const_bits, lanes_of

Exec = Callable[[Waves], None]
Compute = Callable[[Waves], tuple[int, np.ndarray, str]]  # -> (destination code, typed value, type)
BITS = {"f16": 16, "u16": 16, "i16": 16, "bf16": 16, "f32": 32, "u32": 32, "i32": 32, "f64": 64, "u64": 64, "i64": 64}
_LANE = np.arange(LANES, dtype=np.uint32)


def read_typed(w: Waves, code: int, lit: int | None, t: str, hi: bool = False) -> np.ndarray:
    """Source `code` as 32 values of type `t` (16-bit types from the low half, or the high half when `hi`)."""
    bits = BITS[t]
    is_float = t[0] == "f"
    if bits == 64:
        return w.vread(code, lit, 2, is_float).view(NP[t])
    if bits == 32:
        return w.vread(code, lit, 1, is_float).view(NP[t])
    if code < 256:  # a constant is a 32-bit value as in VOP3P (see packed._half); op_sel may pick its high half
        c32 = (
            const_bits(code, lit, 32, False) if (128 <= code <= 208 or code == 255) else const_bits(code, lit, 16, True)
        )
        if c32 is not None:
            return np.full(LANES * w.k, (c32 >> 16) & 0xFFFF if hi else c32 & 0xFFFF, np.uint16).view(NP[t])
    raw = w.vread(code, lit, 1, is_float)
    return ((raw >> np.uint32(16)) if hi else raw).astype(np.uint16).view(NP[t])


def write_typed(
    w: Waves, code: int, value: np.ndarray, t: str, hi: bool = False, mask: np.ndarray | None = None
) -> None:
    """Write a typed result to VGPR `code` under `mask` (EXEC when None)."""
    bits = BITS[t]
    v = np.asarray(value).astype(NP[t], copy=False)
    if bits == 64:
        w.vwrite(code, v.view(np.uint64), mask)
    elif bits == 32:
        w.vwrite(code, v.view(np.uint32), mask)
    else:
        old = w.v[code - 256, w.lx]
        u = v.view(np.uint16).astype(np.uint32)
        new = (old & np.uint32(0xFFFF)) | (u << np.uint32(16)) if hi else (old & np.uint32(0xFFFF0000)) | u
        w.vwrite(code, new, mask)


def _modify(x: np.ndarray, t: str, neg: int, ab: int) -> np.ndarray:
    if t[0] != "f" or not (neg or ab):
        return x
    if ab:
        x = np.abs(x)
    return -x if neg else x


def _sources(inst: Inst) -> list[int]:
    f, name, enc = inst.f, inst.name, inst.enc
    base = name.replace("v_dual_", "v_")
    if base in ("v_fmac_f32", "v_fmac_f16", "v_fmac_f64", "v_fmac_dx9_zero_f32", "v_dot2acc_f32_f16"):  # accumulators
        return [f["src0"], f["vsrc1"] if enc in ("VOP2", "VOPD") else f["src1"], f["vdst"]]
    if base in ("v_fmamk_f32", "v_fmamk_f16"):
        return [f["src0"], LITERAL, f["vsrc1"]]
    if base in ("v_fmaak_f32", "v_fmaak_f16"):
        return [f["src0"], f["vsrc1"], LITERAL]
    if enc in ("VOP1",):
        return [f["src0"]]
    if enc in ("VOP2", "VOPC", "VOPD"):
        return [f["src0"], f["vsrc1"]]
    return [f["src0"], f["src1"], f["src2"]]


def build_compute(inst: Inst) -> Compute:
    """A table op's computation without its write (VOPD runs both halves' computations before either write)."""
    name = inst.name.replace("v_dual_", "v_")
    if name not in OPS:
        raise EmulatorError(
            f"unimplemented vector instruction {inst.name} ({inst.enc} opcode {inst.op}) at {inst.addr:#x}"
        )
    dst_t, src_t, fn = OPS[name]
    codes = _sources(inst)[: len(src_t)]
    lit = inst.literal
    vop3 = inst.enc == "VOP3"
    neg = inst.f.get("neg", 0) if vop3 else 0
    ab = inst.f.get("abs", 0) if vop3 else 0
    opsel = inst.f.get("opsel", 0) if vop3 else 0
    clamp = inst.f.get("clamp", 0) if vop3 else 0
    omod = inst.f.get("omod", 0) if vop3 else 0
    dst = inst.f["vdst"]
    mods = [(t, (neg >> i) & 1, (ab >> i) & 1, bool((opsel >> i) & 1)) for i, t in enumerate(src_t)]

    def compute(w: Waves) -> tuple[int, np.ndarray, str]:
        args = [_modify(read_typed(w, c, lit, t, hi), t, n, a) for c, (t, n, a, hi) in zip(codes, mods)]
        r = np.asarray(fn(*args))
        if omod and dst_t[0] == "f":
            r = r * {1: 2.0, 2: 4.0, 3: 0.5}[omod]
        if clamp and dst_t[0] == "f":
            r = np.clip(r, 0.0, 1.0)
        return dst, r.astype(NP[dst_t], copy=False), dst_t

    return compute


def build_vector(inst: Inst) -> Exec:
    """The executor of one VALU instruction."""
    name, size = inst.name, inst.size
    if inst.enc == "VOPD":
        return _build_vopd(inst)
    if inst.enc == "VOP3P":
        from xgrad_amd.emulate.packed import build_packed

        return build_packed(inst)
    if inst.enc == "VOPC" or (inst.enc == "VOP3" and inst.op < 256):
        return _build_cmp(inst)
    special = _SPECIAL.get(name)
    if special is not None:
        return special(inst)
    compute = build_compute(inst)
    hi = bool(inst.f.get("opsel", 0) & 8) if inst.enc == "VOP3" else False

    def run(w: Waves) -> None:
        dst, value, t = compute(w)
        write_typed(w, dst, value, t, hi)
        w.pc[w.ix] += size

    return run


def _build_vopd(inst: Inst) -> Exec:
    assert inst.y is not None
    halves = []
    for half in (inst, inst.y):
        if half.name == "v_dual_cndmask_b32":
            s0, s1, d = half.f["src0"], half.f["vsrc1"], half.f["vdst"]
            halves.append(_cndmask_compute(s0, s1, d, half.literal))
        else:
            halves.append(build_compute(half))
    size = inst.size

    def run(w: Waves) -> None:
        results = [(d, np.array(v), t) for d, v, t in (h(w) for h in halves)]  # copies: a result may view a VGPR
        for dst, value, t in results:
            write_typed(w, dst, value, t)
        w.pc[w.ix] += size

    return run


def _cndmask_compute(s0: int, s1: int, d: int, lit: int | None, sel: int = VCC) -> Compute:
    def compute(w: Waves) -> tuple[int, np.ndarray, str]:
        m = lanes_of(w.sread(sel, lit))
        return d, np.where(m, w.vread(s1, lit), w.vread(s0, lit)), "u32"

    return compute


_CMP = {"lt": np.less, "eq": np.equal, "le": np.less_equal, "gt": np.greater, "ne": np.not_equal, "lg": np.not_equal,
        "ge": np.greater_equal}  # fmt: skip


def _float_cmp(op: str) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def unordered(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.asarray(np.isnan(a) | np.isnan(b))

    table: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
        "f": lambda a, b: np.zeros(a.shape, bool), "t": lambda a, b: np.ones(a.shape, bool),
        "lt": np.less, "eq": np.equal, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
        "lg": lambda a, b: (a < b) | (a > b), "o": lambda a, b: ~unordered(a, b), "u": unordered,
        "nge": lambda a, b: ~(a >= b), "nlg": lambda a, b: ~((a < b) | (a > b)), "ngt": lambda a, b: ~(a > b),
        "nle": lambda a, b: ~(a <= b), "neq": lambda a, b: ~(a == b), "nlt": lambda a, b: ~(a < b),
    }  # fmt: skip
    return table[op]


def _build_cmp(inst: Inst) -> Exec:
    name, size, lit = inst.name, inst.size, inst.literal
    parts = name.split("_")  # v, cmp|cmpx, op, type
    cmpx = parts[1] == "cmpx"
    op, t = parts[2], parts[3]
    vop3 = inst.enc == "VOP3"
    codes = [inst.f["src0"], inst.f["vsrc1"] if not vop3 else inst.f["src1"]]
    neg = inst.f.get("neg", 0) if vop3 else 0
    ab = inst.f.get("abs", 0) if vop3 else 0
    opsel = inst.f.get("opsel", 0) if vop3 else 0
    dst = VCC if not vop3 else inst.f["vdst"]
    if op == "class":
        ts = (t, "u32")
        fn: Callable[[np.ndarray, np.ndarray], np.ndarray] = CLASS
    elif t[0] == "f":
        ts, fn = (t, t), _float_cmp(op)
    elif op in ("f", "t"):
        ts, fn = (t, t), _float_cmp(op)
    else:
        ts, fn = (t, t), _CMP[op]

    def run(w: Waves) -> None:
        a = _modify(read_typed(w, codes[0], lit, ts[0], bool(opsel & 1)), ts[0], neg & 1, ab & 1)
        b = _modify(read_typed(w, codes[1], lit, ts[1], bool(opsel & 2)), ts[1], neg & 2, ab & 2)
        with np.errstate(all="ignore"):
            result = bits_of(np.asarray(fn(a, b)) & w.mask())
        w.swrite(EXEC if cmpx else dst, result)  # gfx11's v_cmpx writes EXEC only; wave32: a 32-bit mask
        w.pc[w.ix] += size

    return run


# ------------------------------------------------------------------------------------------- special operations
def _sp_cndmask(inst: Inst) -> Exec:
    f, size, lit = inst.f, inst.size, inst.literal
    if inst.enc == "VOP2":
        compute = _cndmask_compute(f["src0"], f["vsrc1"], f["vdst"], lit)
    else:
        compute = _cndmask_compute(f["src0"], f["src1"], f["vdst"], lit, f["src2"])
    neg, ab = f.get("neg", 0), f.get("abs", 0)

    def run(w: Waves) -> None:
        d, value, _ = compute(w)
        if inst.enc == "VOP3" and (neg or ab):
            a = _modify(w.vread(f["src0"], lit).view(np.float32), "f32", neg & 1, ab & 1).view(np.uint32)
            b = _modify(w.vread(f["src1"], lit).view(np.float32), "f32", neg & 2, ab & 2).view(np.uint32)
            value = np.where(lanes_of(w.sread(f["src2"])), b, a)
        w.vwrite(d, value)
        w.pc[w.ix] += size

    return run


def _sp_carry(inst: Inst) -> Exec:
    """v_add_co_u32 / v_sub_co_u32 / v_subrev_co_u32 and their _ci forms (carry in)."""
    f, size, lit, name = inst.f, inst.size, inst.literal, inst.name
    vop3 = inst.enc == "VOP3"
    a_code = f["src0"]
    b_code = f["src1"] if vop3 else f["vsrc1"]
    cin_code = (f["src2"] if vop3 else VCC) if "_ci_" in name else None
    cout = f["sdst"] if vop3 else VCC
    d = f["vdst"]
    kind = name.split("_")[1]  # add, sub, subrev

    def run(w: Waves) -> None:
        a = w.vread(a_code, lit).astype(np.int64)
        b = w.vread(b_code, lit).astype(np.int64)
        cin = lanes_of(w.sread(cin_code)).astype(np.int64) if cin_code is not None else 0
        if kind == "add":
            r = a + b + cin
            carry = r > M32
        else:
            r = a - b - cin if kind == "sub" else b - a - cin
            carry = r < 0
        m = w.mask()
        w.vwrite(d, (r & M32).astype(np.uint32))
        w.swrite(cout, bits_of(carry & m))
        w.pc[w.ix] += size

    return run


def _sp_lanes(inst: Inst) -> Exec:
    f, size, name, lit = inst.f, inst.size, inst.name, inst.literal
    src0 = f["src0"]

    def run(w: Waves) -> None:
        waves = np.arange(w.k)
        if name == "v_readfirstlane_b32":
            e = w.s[EXEC, w.ix]
            lane = np.where(e == 0, 0, np.log2(np.where(e == 0, 1, e & -e)).astype(np.int64))
            w.swrite(f["vdst"], w.vread(src0, lit).reshape(w.k, LANES)[waves, lane])
        elif name == "v_readlane_b32":
            lane = w.sread(f["src1"], lit) & 31
            w.swrite(f["vdst"], w.vread(src0, lit).reshape(w.k, LANES)[waves, lane])
        else:  # v_writelane_b32 ignores EXEC
            lane = w.sread(f["src1"], lit) & 31
            rows = np.arange(w.n)[w.ix]
            w.v[f["vdst"] - 256].reshape(w.n, LANES)[rows, lane] = w.sread(src0, lit).astype(np.uint32)
        w.pc[w.ix] += size

    return run


def _sp_mad64(inst: Inst) -> Exec:
    """v_mad_u64_u32 / v_mad_i64_i32: D (64 bits) = S0 * S1 + S2, carry or overflow out to SDST."""
    f, size, lit, signed = inst.f, inst.size, inst.literal, inst.name == "v_mad_i64_i32"

    def run(w: Waves) -> None:
        c = w.vread(f["src2"], lit, 2)
        if signed:
            p = w.vread(f["src0"], lit).view(np.int32).astype(np.int64) * w.vread(f["src1"], lit).view(np.int32)
            ci = c.view(np.int64)
            with np.errstate(over="ignore"):
                r = p + ci
            out = ((p < 0) == (ci < 0)) & ((r < 0) != (p < 0))  # signed overflow of the 64-bit sum
            value = r.view(np.uint64)
        else:
            pu = w.vread(f["src0"], lit).astype(np.uint64) * w.vread(f["src1"], lit).astype(np.uint64)
            value = pu + c
            out = value < c  # the sum wrapped past 2^64
        w.vwrite(f["vdst"], value)
        w.swrite(f["sdst"], bits_of(out & w.mask()))
        w.pc[w.ix] += size

    return run


def _sp_div_scale(inst: Inst) -> Exec:
    """v_div_scale: the hardware rescales operands near the ends of the exponent range by 2^+-64 and flags VCC for
    v_div_fmas; here D = S0 and VCC = 0 always. Division sequences are then exact wherever the quotient and the
    reciprocal are normal numbers; v_div_fixup returns the IEEE quotient where the unscaled sequence overflowed
    (denormal denominators), and quotients in the denormal range may differ from the hardware in the last place."""
    f, size, lit = inst.f, inst.size, inst.literal
    t = "f64" if inst.name.endswith("f64") else "f32"

    def run(w: Waves) -> None:
        write_typed(w, f["vdst"], read_typed(w, f["src0"], lit, t), t)
        w.swrite(f["sdst"], np.zeros(w.k, np.int64))
        w.pc[w.ix] += size

    return run


_BELOW = ((np.int64(1) << np.arange(LANES, dtype=np.int64)) - 1).astype(np.uint32)  # bits of the lanes below each


def _sp_mbcnt(inst: Inst) -> Exec:
    """v_mbcnt_lo/hi_u32_b32: S1 + the set bits of S0 below the lane (wave32: the hi form adds nothing)."""
    f, size, lit, hi = inst.f, inst.size, inst.literal, inst.name.endswith("hi_u32_b32")

    def run(w: Waves) -> None:
        add = w.vread(f["src1"], lit)
        if hi:
            counts = np.zeros(add.shape, np.uint32)
        else:
            below = w.vread(f["src0"], lit).reshape(w.k, LANES) & _BELOW
            counts = np.bitwise_count(below).astype(np.uint32).reshape(-1)
        w.vwrite(f["vdst"], counts + add)
        w.pc[w.ix] += size

    return run


def _sp_nop(inst: Inst) -> Exec:
    size = inst.size

    def run(w: Waves) -> None:
        w.pc[w.ix] += size

    return run


_SPECIAL: dict[str, Callable[[Inst], Exec]] = {
    "v_cndmask_b32": _sp_cndmask,
    "v_add_co_u32": _sp_carry, "v_sub_co_u32": _sp_carry, "v_subrev_co_u32": _sp_carry,
    "v_add_co_ci_u32": _sp_carry, "v_sub_co_ci_u32": _sp_carry, "v_subrev_co_ci_u32": _sp_carry,
    "v_readfirstlane_b32": _sp_lanes, "v_readlane_b32": _sp_lanes, "v_writelane_b32": _sp_lanes,
    "v_mad_u64_u32": _sp_mad64, "v_mad_i64_i32": _sp_mad64,
    "v_div_scale_f32": _sp_div_scale, "v_div_scale_f64": _sp_div_scale,
    "v_mbcnt_lo_u32_b32": _sp_mbcnt, "v_mbcnt_hi_u32_b32": _sp_mbcnt,
    "v_nop": _sp_nop,
}  # fmt: skip
