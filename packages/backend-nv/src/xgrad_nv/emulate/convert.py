"""`cvt`: conversions between the PTX types with their rounding and saturation modifiers (PTX ISA 9.7.9.21).

In: one parsed `cvt{.rnd}{.ftz}{.sat}.dtype.atype`. Out: a step. Float -> integer rounds by `.rni/.rzi/.rmi/.rpi`
(`.rzi` when none is given), saturates to the destination's range and maps NaN to 0. Narrowing float -> float rounds
to nearest even (`.rn`, the default), or toward zero/-inf/+inf (`.rz/.rm/.rp`: the nearest result stepped one ulp
where it lies on the wrong side); the same for integer -> float (exact comparison for 32-bit integers, through
float64 for 64-bit ones). A float -> same float `cvt` with `.rni/.rzi/.rmi/.rpi` rounds to an integral value.
`.sat` on a float destination clamps to [0, 1]; on an integer one it clamps to the destination's range.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from xgrad_nv.emulate.parse import TYPE_BYTES, Instruction
from xgrad_nv.emulate.values import NP, Array, Decoder, Mask, Step, bf16_to_f32, f32_to_bf16, is_float

OPS: dict[str, Callable[[Instruction, Decoder], Step]] = {}

_INT_ROUND: dict[str, Callable[[Array], Array]] = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil}
_FLOAT_ROUND = ("rn", "rz", "rm", "rp")


def _int_range(t: str) -> tuple[int, int]:
    info = np.iinfo(NP[t])
    return int(info.min), int(info.max)


def float_to_int(x: Array, t: str, mode: str) -> Array:
    """Round float values to integer type `t`, saturating, NaN -> 0."""
    r = _INT_ROUND[mode](np.asarray(x, np.float64))
    lo, hi = _int_range(t)
    dt = NP[t]
    out = np.clip(np.nan_to_num(r, nan=0.0), lo, hi)
    res = out.astype(dt)
    if TYPE_BYTES[t] == 8:  # float64 cannot hold the top of a 64-bit range: fix the clipped ends exactly
        res = np.where(r >= float(hi), dt.type(hi), res)
        res = np.where(r <= float(lo), dt.type(lo), res)
        res = np.where(np.isnan(r), dt.type(0), res)
    return np.asarray(res, dt)


def _directed(exact: Array, r: Array, mode: str) -> Array:
    """Step the round-to-nearest result `r` one ulp where it lies on the wrong side of `exact` for `mode`."""
    if mode == "rn":
        return r
    rv = r.astype(np.float64)
    ex = np.asarray(exact, np.float64)
    if mode == "rz":
        bad = np.abs(rv) > np.abs(ex)
        toward = np.zeros((), r.dtype)
    elif mode == "rm":
        bad = rv > ex
        toward = np.asarray(-np.inf, r.dtype)
    else:
        bad = rv < ex
        toward = np.asarray(np.inf, r.dtype)
    return np.where(bad, np.nextafter(r, toward), r).astype(r.dtype)


def to_float(x: Array, src: str, dst: str, mode: str) -> Array:
    """Convert values of PTX type `src` (already decoded: bf16 as float32) to float type `dst` with rounding `mode`."""
    if dst in ("bf16",):
        f = np.asarray(x, np.float32) if src not in ("f64",) and not (src[0] in "su" and TYPE_BYTES[src] >= 4) else None
        if f is None:
            f = _directed(x, np.asarray(x, np.float64).astype(np.float32), "rz" if mode == "rz" else "rn")
        return f32_to_bf16(f, mode)
    dt = NP[dst]
    r = np.asarray(x).astype(dt)
    if mode != "rn":
        r = _directed(x, r, mode)
    return r


def _cvt(ins: Instruction, dec: Decoder) -> Step:
    types = [p for p in ins.op[1:] if p in TYPE_BYTES]
    if len(types) != 2:
        raise dec.error("cvt needs a destination and a source type")
    dst, src = types
    mods = set(ins.op[1:])
    sat = "sat" in mods or "satfinite" in mods
    irnd = next((m for m in ins.op if m in _INT_ROUND), None)
    frnd = next((m for m in ins.op if m in _FLOAT_ROUND), "rn")
    if dst == "tf32" and src == "f32":  # .rna: to 10 mantissa bits, ties away from zero; NaN/inf kept
        a32 = dec.src(ins.operands[1], "u32")
        w32 = dec.dst(ins.operands[0], "b32")

        def tf32(st: Any, m: Mask) -> None:
            u = np.asarray(a32(st), np.uint32)
            special = (u & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
            rounded = (u + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
            w32(st, np.where(special, u, rounded).astype(np.uint32), m)

        return tf32
    if dst in ("f16x2", "bf16x2") and src == "f32":  # d = {cvt(a) in the upper half, cvt(b) in the lower}
        return _cvt_pack(ins, dec, dst[:-2], frnd, sat)
    if dst in ("e4m3x2", "e5m2x2") or src in ("e4m3x2", "e5m2x2") or "relu" in mods:
        raise dec.error(f"cvt {'.'.join(ins.op)} (fp8 / relu forms) is not supported")
    a = dec.src(ins.operands[1], src)
    w = dec.dst(ins.operands[0], dst)
    src_f = is_float(src)
    dst_f = is_float(dst)

    def value(st: Any) -> Array:
        v = a(st)
        return bf16_to_f32(v) if src == "bf16" else v

    if src_f and not dst_f:
        mode = irnd or "rzi"
        return lambda st, m: w(st, float_to_int(value(st), dst, mode), m)
    if not src_f and not dst_f:
        if sat:
            lo, hi = _int_range(dst)

            def sat_int(st: Any, m: Mask) -> None:
                v = a(st)
                if v.dtype.kind == "u":
                    r = np.minimum(v, np.uint64(hi)).astype(NP[dst])
                else:
                    r = np.clip(v.astype(np.int64), max(lo, -(2**63)), min(hi, 2**63 - 1)).astype(NP[dst])
                    if NP[dst].kind == "u":
                        r = np.where(v < 0, NP[dst].type(0), np.minimum(v.astype(np.uint64), np.uint64(hi))).astype(
                            NP[dst]
                        )
                w(st, r, m)

            return sat_int
        return lambda st, m: w(st, a(st).astype(NP[dst]), m)
    if dst_f and not src_f:
        return lambda st, m: w(st, to_float(a(st), src, dst, frnd), m)
    # float -> float
    if irnd is not None:
        f = _INT_ROUND[irnd]

        def integral(st: Any, m: Mask) -> None:
            v = value(st)
            r = f(v)
            r = to_float(r, "f32" if src == "bf16" else src, dst, "rn")
            if sat:
                r = _clamp01(r, dst)
            w(st, r, m)

        return integral

    def narrow(st: Any, m: Mask) -> None:
        v = value(st)
        if sat:
            v = np.where(np.isnan(v), 0, np.clip(v, 0, 1)).astype(v.dtype)
        w(st, to_float(v, "f32" if src == "bf16" else src, dst, frnd), m)

    return narrow


def _cvt_pack(ins: Instruction, dec: Decoder, half: str, mode: str, sat: bool) -> Step:
    hi_src = dec.src(ins.operands[1], "f32")
    lo_src = dec.src(ins.operands[2], "f32")
    w = dec.dst(ins.operands[0], "b32")

    def bits(v: Array) -> Array:
        v = np.asarray(v, np.float32)
        if sat:
            v = np.where(np.isnan(v), 0, np.clip(v, 0, 1)).astype(np.float32)
        r = to_float(v, "f32", half, mode)
        return np.ascontiguousarray(r).view(np.uint16).astype(np.uint32)

    def step(st: Any, m: Mask) -> None:
        w(st, (bits(hi_src(st)) << np.uint32(16)) | bits(lo_src(st)), m)

    return step


def _clamp01(r: Array, t: str) -> Array:
    if t == "bf16":
        f = bf16_to_f32(r)
        return f32_to_bf16(np.where(np.isnan(f), 0, np.clip(f, 0, 1)).astype(np.float32))
    return np.where(np.isnan(r), 0, np.clip(r, 0, 1)).astype(r.dtype)


OPS["cvt"] = _cvt
