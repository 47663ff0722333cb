"""VOP3P instructions: packed 16-bit math (v_pk_*), mixed-precision FMA (v_fma_mix*), dot products and WMMA.

In: a decoded VOP3P `Inst`. Out: its executor. op_sel picks the half each source's low lane-half reads, op_sel_hi the
half its high lane-half reads; neg/neg_hi negate those halves (for v_fma_mix*, neg_hi is abs). WMMA (wave32,
v_wmma_f32_16x16x16_f16/bf16, v_wmma_f16_16x16x16_f16): lane l holds row l % 16 of A (16 k values in 8 VGPRs) and
column l % 16 of B; D/C's VGPR i of lane l is row 2i + l // 16 (f16 D: the low halves), column l % 16. A WMMA is a
whole-wave operation (every lane holds part of A, B and C; LLVM's WMMA intrinsics are `convergent`): one under a
partial EXEC is code a compiler moved under a lane condition, so it raises EmulatorError instead of computing.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from xgrad_amd.emulate.decode import EmulatorError, Inst
from xgrad_amd.emulate.valu import read_typed, write_typed
from xgrad_amd.emulate.wave import LANES, Waves, const_bits

Exec = Callable[[Waves], None]
_PK: dict[str, tuple[str, Callable[..., np.ndarray]]] = {
    "v_pk_add_f16": ("f16", lambda a, b: a + b),
    "v_pk_mul_f16": ("f16", lambda a, b: a * b),
    "v_pk_fma_f16": ("f16", lambda a, b, c: (a.astype(np.float64) * b + c).astype(np.float16)),
    "v_pk_max_f16": ("f16", np.fmax),
    "v_pk_min_f16": ("f16", np.fmin),
    "v_pk_add_u16": ("u16", lambda a, b: a + b),
    "v_pk_sub_u16": ("u16", lambda a, b: a - b),
    "v_pk_add_i16": ("i16", lambda a, b: a + b),
    "v_pk_sub_i16": ("i16", lambda a, b: a - b),
    "v_pk_mul_lo_u16": ("u16", lambda a, b: a * b),
    "v_pk_mad_u16": ("u16", lambda a, b, c: a * b + c),
    "v_pk_mad_i16": ("i16", lambda a, b, c: a * b + c),
    "v_pk_max_i16": ("i16", np.maximum),
    "v_pk_min_i16": ("i16", np.minimum),
    "v_pk_max_u16": ("u16", np.maximum),
    "v_pk_min_u16": ("u16", np.minimum),
    "v_pk_lshlrev_b16": ("u16", lambda a, b: b << (a & np.uint16(15))),
    "v_pk_lshrrev_b16": ("u16", lambda a, b: b >> (a & np.uint16(15))),
    "v_pk_ashrrev_i16": ("i16", lambda a, b: b >> (a & np.int16(15))),
}
_NP16 = {"f16": np.float16, "u16": np.uint16, "i16": np.int16}


def _half(w: Waves, code: int, lit: int | None, hi: bool, t: str) -> np.ndarray:
    """One 16-bit half of a packed source. A constant is a 32-bit value whose halves op_sel picks: an integer inline
    constant sign-extended to 32 bits (-1 is 0xFFFFFFFF), a float one as f16 bits in the low half (high half 0), a
    literal as is (what clang relies on: (x, x) + 1 is `1 op_sel_hi:[1,0]`, (x, x) - 1 is `-1`)."""
    if code < 256:
        c32 = (
            const_bits(code, lit, 32, False) if (128 <= code <= 208 or code == 255) else const_bits(code, lit, 16, True)
        )
        if c32 is not None:
            c = (c32 >> 16) & 0xFFFF if hi else c32 & 0xFFFF
            return np.full(LANES * w.k, c, np.uint16).view(_NP16[t])
    raw = w.vread(code, lit)
    return ((raw >> np.uint32(16)) if hi else raw).astype(np.uint16).view(_NP16[t])


def build_packed(inst: Inst) -> Exec:
    """The executor of a VOP3P instruction."""
    name, f, lit, size = inst.name, inst.f, inst.literal, inst.size
    codes = [f["src0"], f["src1"], f["src2"]]
    opsel, opsel_hi, neg, neg_hi = f["opsel"], f["opsel_hi"], f["neg"], f["neg_hi"]
    if name.startswith("v_wmma_"):
        return _build_wmma(inst)
    if name in _PK:
        t, fn = _PK[name]
        n = len(inst.widths) - 1

        def pk(w: Waves) -> None:
            lo = [_half(w, codes[i], lit, bool(opsel >> i & 1), t) for i in range(n)]
            hi = [_half(w, codes[i], lit, bool(opsel_hi >> i & 1), t) for i in range(n)]
            if t == "f16":
                lo = [-x if neg >> i & 1 else x for i, x in enumerate(lo)]
                hi = [-x if neg_hi >> i & 1 else x for i, x in enumerate(hi)]
            with np.errstate(all="ignore"):
                r_lo = np.asarray(fn(*lo)).astype(_NP16[t]).view(np.uint16).astype(np.uint32)
                r_hi = np.asarray(fn(*hi)).astype(_NP16[t]).view(np.uint16).astype(np.uint32)
            if f["clamp"] and t == "f16":
                raise EmulatorError(f"{name} with clamp at {inst.addr:#x} is not implemented")
            w.vwrite(f["vdst"], r_lo | (r_hi << np.uint32(16)))
            w.pc[w.ix] += size

        return pk
    if name.startswith("v_fma_mix"):

        def mix(w: Waves) -> None:
            args = []
            for i in range(3):
                if opsel_hi >> i & 1:
                    x = read_typed(w, codes[i], lit, "f16", bool(opsel >> i & 1)).astype(np.float32)
                else:
                    x = read_typed(w, codes[i], lit, "f32")
                if neg_hi >> i & 1:
                    x = np.abs(x)
                if neg >> i & 1:
                    x = -x
                args.append(x.astype(np.float64))
            r = args[0] * args[1] + args[2]
            if f["clamp"]:
                r = np.clip(r, 0.0, 1.0)
            if name == "v_fma_mix_f32":
                write_typed(w, f["vdst"], r.astype(np.float32), "f32")
            else:
                write_typed(w, f["vdst"], r.astype(np.float32).astype(np.float16), "f16", name == "v_fma_mixhi_f16")
            w.pc[w.ix] += size

        return mix
    if name in ("v_dot2_f32_f16", "v_dot2_f32_bf16"):
        t = "f16" if name.endswith("f16") else "u16"

        def dot2(w: Waves) -> None:
            def part(i: int, hi: bool) -> np.ndarray:
                x = _half(w, codes[i], lit, hi, t)
                v = (
                    x.astype(np.float64)
                    if t == "f16"
                    else (x.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
                )
                return -v if (neg_hi if hi else neg) >> i & 1 else v

            lo = part(0, bool(opsel & 1)) * part(1, bool(opsel & 2))
            hi = part(0, bool(opsel_hi & 1)) * part(1, bool(opsel_hi & 2))
            c = read_typed(w, codes[2], lit, "f32").astype(np.float64)
            write_typed(w, f["vdst"], (lo + hi + c).astype(np.float32), "f32")
            w.pc[w.ix] += size

        return dot2
    if name in _DOT_INT:
        return _build_dot_int(inst)
    raise EmulatorError(f"unimplemented vector instruction {name} (VOP3P opcode {inst.op}) at {inst.addr:#x}")


# integer dot products: name -> (bits per element, elements, signedness fixed (None: the neg bits pick per source))
_DOT_INT: dict[str, tuple[int, int, bool | None]] = {
    "v_dot4_i32_iu8": (8, 4, None),
    "v_dot4_u32_u8": (8, 4, False),
    "v_dot8_i32_iu4": (4, 8, None),
    "v_dot8_u32_u4": (4, 8, False),
}


def _build_dot_int(inst: Inst) -> Exec:
    """D = S2 + the sum of the products of S0's and S1's packed elements; for the iu forms neg[0]/neg[1] make S0/S1
    signed (gfx11 repurposes the modifier bits), and clamp saturates instead of wrapping."""
    f, lit, size = inst.f, inst.literal, inst.size
    bits, n, fixed = _DOT_INT[inst.name]
    signed = [bool(f["neg"] & 1), bool(f["neg"] & 2)] if fixed is None else [False, False]
    shifts = (np.arange(n, dtype=np.uint32) * bits)[:, None]

    def elements(w: Waves, code: int, sign: bool) -> np.ndarray:
        e = ((w.vread(code, lit)[None, :] >> shifts) & np.uint32((1 << bits) - 1)).astype(np.int64)
        return np.where(e >= 1 << (bits - 1), e - (1 << bits), e) if sign else e

    def dot(w: Waves) -> None:
        total = (elements(w, f["src0"], signed[0]) * elements(w, f["src1"], signed[1])).sum(axis=0)
        c = w.vread(f["src2"], lit)
        total = total + (c.view(np.int32).astype(np.int64) if fixed is None else c.astype(np.int64))
        if f["clamp"]:
            total = np.clip(total, -(1 << 31), (1 << 31) - 1) if fixed is None else np.clip(total, 0, (1 << 32) - 1)
        w.vwrite(f["vdst"], (total & 0xFFFFFFFF).astype(np.uint32))
        w.pc[w.ix] += size

    return dot


def _matrix_ab(w: Waves, code: int, kind: str) -> np.ndarray:
    """A (or B) of a WMMA per selected wave: [k, 16 lanes, 16 k-values] from 8 VGPRs of 2 halves each (lanes 0-15;
    16-31 hold a copy)."""
    regs = w.v[code - 256 : code - 256 + 8][:, w.lx].reshape(8, w.k, LANES)[:, :, :16]  # [8, waves, 16 lanes]
    halves = np.stack([regs & np.uint32(0xFFFF), regs >> np.uint32(16)], axis=1)  # [8, 2, waves, 16]
    u16 = halves.reshape(16, w.k, 16).transpose(1, 2, 0).astype(np.uint16)  # [waves, lane, k]
    if kind == "f16":
        return u16.view(np.float16).astype(np.float32)
    return (u16.astype(np.uint32) << np.uint32(16)).view(np.float32)  # bf16


def _build_wmma(inst: Inst) -> Exec:
    name, f, size = inst.name, inst.f, inst.size
    kind = "bf16" if name.endswith("_bf16") else "f16"
    out16 = name.startswith(("v_wmma_f16", "v_wmma_bf16"))
    if "iu" in name:
        raise EmulatorError(f"unimplemented vector instruction {name} (VOP3P opcode {inst.op}) at {inst.addr:#x}")
    lane = np.arange(LANES)
    rows = 2 * np.arange(8)[:, None] + lane[None, :] // 16  # [i, lane] -> m
    cols = np.broadcast_to(lane % 16, (8, LANES))

    def wmma(w: Waves) -> None:
        on = w.mask().reshape(w.k, LANES).sum(axis=1)
        if ((on > 0) & (on < LANES)).any():  # all lanes off: nothing runs, as for any VALU instruction
            lanes = int(on[(on > 0) & (on < LANES)][0])
            raise EmulatorError(
                f"{name} at {inst.addr:#x} runs with {lanes} of {LANES} lanes in EXEC: a WMMA is a whole-wave "
                "operation (every lane holds part of A, B and C; the off lanes' operands were never computed), so "
                "the compiler must not move it under a lane condition; keep its result live outside the gated code."
            )
        a = _matrix_ab(w, f["src0"], kind).astype(np.float64)  # [waves, m, k]
        b = _matrix_ab(w, f["src1"], kind).astype(np.float64)  # [waves, n, k]
        raw = w.v[f["src2"] - 256 : f["src2"] - 256 + 8][:, w.lx].reshape(8, w.k, LANES)  # [i, waves, lane]
        if out16:
            c16 = (raw & np.uint32(0xFFFF)).astype(np.uint16)
            c = (
                c16.view(np.float16).astype(np.float64)
                if kind == "f16"
                else (c16.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
            )
        else:
            c = raw.view(np.float32).astype(np.float64)
        d = np.einsum("wmk,wnk->wmn", a, b)[:, rows, cols].transpose(1, 0, 2) + c  # [i, waves, lane]
        if out16:
            if kind == "f16":
                bits = d.astype(np.float16).view(np.uint16).astype(np.uint32)
            else:
                bits = d.astype(np.float32).view(np.uint32) >> np.uint32(16)
            old = w.v[f["vdst"] - 256 : f["vdst"] - 256 + 8][:, w.lx].reshape(8, w.k, LANES)
            value = (old & np.uint32(0xFFFF0000)) | bits
        else:
            value = d.astype(np.float32).view(np.uint32)
        w.vwrite(f["vdst"], value.reshape(8, w.k * LANES))
        w.pc[w.ix] += size

    return wmma
