"""The vector ALU's operations as a table: name -> (destination type, source types, numpy function of 32 lanes).

In: typed numpy arrays (one element per lane). Out: the typed result. Types: f16 f32 f64 u16 i16 u32 i32 u64 i64.
Semantics follow AMD's RDNA3 ISA reference: v_exp_f32 is 2^x, v_log_f32 is log2(x), v_sin_f32/v_cos_f32 take
revolutions (sin(2*pi*x)), v_rcp/v_rsq/v_sqrt are IEEE-correct here (the hardware's are within 1 ulp), shifts take
the low 5 (6 for 64-bit) bits of the shift amount, *_u24/*_i24 multiply the low 24 bits. FMA in f32 is computed in
float64 and rounded once more (exact product, double rounding of the sum is possible but rare); f64 FMA uses
numpy's longdouble.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

A = np.ndarray
Fn = Callable[..., Any]
NP = {"f16": np.float16, "f32": np.float32, "f64": np.float64, "u16": np.uint16, "i16": np.int16, "u32": np.uint32,
      "i32": np.int32, "u64": np.uint64, "i64": np.int64}  # fmt: skip


def _fma32(a: A, b: A, c: A) -> A:
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


def _fma64(a: A, b: A, c: A) -> A:
    return (a.astype(np.longdouble) * b.astype(np.longdouble) + c.astype(np.longdouble)).astype(np.float64)


def _fma16(a: A, b: A, c: A) -> A:
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float16)


def _sh(b: A, n: int) -> A:
    return (b & (n - 1)).astype(np.uint32)


def _u24(x: A) -> A:
    return (x & np.uint32(0xFFFFFF)).astype(np.uint64)


def _i24(x: A) -> A:
    v = (x & np.uint32(0xFFFFFF)).astype(np.int64)
    return np.where(v >= 1 << 23, v - (1 << 24), v)


def _bfe(x: A, off: A, width: A, signed: bool) -> A:
    off = off.astype(np.int64) & 31
    width = width.astype(np.int64) & 31
    v = (x.astype(np.uint64) >> off.astype(np.uint64)) & ((np.uint64(1) << width.astype(np.uint64)) - np.uint64(1))
    if signed:
        sv = v.astype(np.int64)
        sign = np.where(width > 0, (sv >> np.maximum(width - 1, 0)) & 1, 0)
        sv = np.where(sign == 1, sv - (np.int64(1) << width), sv)
        return np.where(width == 0, 0, sv).astype(np.int32)
    return np.where(width == 0, 0, v).astype(np.uint32)


def _ctz(x: A) -> A:
    x = x.astype(np.uint32)
    low = x & (~x + np.uint32(1))
    r = np.zeros(x.shape, np.uint32)
    for bit in range(32):
        r = np.where(low == np.uint32(1 << bit), bit, r)
    return np.where(x == 0, np.uint32(0xFFFFFFFF), r).astype(np.uint32)


def _clz(x: A) -> A:
    x = x.astype(np.uint32)
    r = np.full(x.shape, 0xFFFFFFFF, np.uint32)
    for bit in range(32):
        r = np.where((x >> np.uint32(bit)) != 0, np.uint32(31 - bit), r)
    return r


def _min3(a: A, b: A, c: A) -> A:
    return np.asarray(np.fmin(np.fmin(a, b), c) if a.dtype.kind == "f" else np.minimum(np.minimum(a, b), c))


def _max3(a: A, b: A, c: A) -> A:
    return np.asarray(np.fmax(np.fmax(a, b), c) if a.dtype.kind == "f" else np.maximum(np.maximum(a, b), c))


def _med3(a: A, b: A, c: A) -> A:
    if a.dtype.kind == "f":
        return np.asarray(np.fmax(np.fmin(a, b), np.fmin(np.fmax(a, b), c)))
    return np.asarray(np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c)))


def _perm(a: A, b: A, sel: A) -> A:
    both = (a.astype(np.uint64) << np.uint64(32)) | b.astype(np.uint64)  # byte i of {S0, S1}, S1 the low 4 bytes
    out = np.zeros(a.shape, np.uint32)
    for i in range(4):
        s = (sel >> np.uint32(8 * i)) & np.uint32(0xFF)
        byte = ((both >> (np.minimum(s, 7).astype(np.uint64) * np.uint64(8))) & np.uint64(0xFF)).astype(np.uint32)
        sign_src = np.select(
            [s == 8, s == 9, s == 10, s == 11],
            [
                (both >> np.uint64(15)) & 1,
                (both >> np.uint64(31)) & 1,
                (both >> np.uint64(47)) & 1,
                (both >> np.uint64(63)) & 1,
            ],
            0,
        ).astype(np.uint32)
        byte = np.where(s >= 8, np.where(s == 12, 0, np.where(s >= 13, 0xFF, sign_src * 0xFF)), byte).astype(np.uint32)
        out |= byte << np.uint32(8 * i)
    return out


def _class(x: A, mask: A) -> A:
    """v_cmp_class: bit 0 sNaN, 1 qNaN, 2 -inf, 3 -normal, 4 -denormal, 5 -0, 6 +0, 7 +denormal, 8 +normal, 9 +inf."""
    f = x.astype(np.float64)
    info = np.finfo(x.dtype)
    neg = np.signbit(f)
    nan = np.isnan(f)
    bits = x.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize]).astype(np.uint64)
    quiet_bit = np.uint64(1) << np.uint64(info.nmant - 1)
    quiet = (bits & quiet_bit) != 0
    inf, zero = np.isinf(f), f == 0
    sub = ~nan & ~inf & ~zero & (np.abs(f) < float(info.smallest_normal))
    normal = ~nan & ~inf & ~zero & ~sub
    kinds = [nan & ~quiet, nan & quiet, inf & neg, normal & neg, sub & neg, zero & neg, zero & ~neg, sub & ~neg,
             normal & ~neg, inf & ~neg]  # fmt: skip
    m = mask.astype(np.uint32)
    out = np.zeros(x.shape, bool)
    for i, k in enumerate(kinds):
        out |= k & (((m >> np.uint32(i)) & 1) == 1)
    return out


def _frexp_exp(x: A) -> A:
    _, e = np.frexp(x)
    return np.where(np.isfinite(x) & (x != 0), e, 0).astype(np.int32)


def _frexp_mant(x: A) -> A:
    m, _ = np.frexp(x)
    return np.where(np.isfinite(x), m, x).astype(x.dtype)


def _cvt_i32(x: A) -> A:
    return np.asarray(
        np.clip(np.nan_to_num(np.trunc(x.astype(np.float64)), nan=0.0), -(2.0**31), 2.0**31 - 1).astype(np.int32)
    )


def _cvt_u32(x: A) -> A:
    return np.asarray(np.clip(np.nan_to_num(np.trunc(x.astype(np.float64)), nan=0.0), 0, 2.0**32 - 1).astype(np.uint32))


def _div_fixup(q: A, den: A, num: A) -> A:
    """v_div_fixup: the special cases of num / den (NaN, infinities, zero denominator), otherwise q with the
    quotient's sign. v_div_scale here never rescales (see valu._sp_div_scale), so where the unscaled Newton sequence
    ran out of range (a denormal denominator, whose reciprocal overflows) q is not finite though num / den is a number:
    there the IEEE quotient is what the hardware's scaled sequence delivers, and it is returned."""
    sign = np.signbit(num) ^ np.signbit(den)
    out = np.where(sign, -np.abs(q), np.abs(q))
    with np.errstate(all="ignore"):
        ieee = (num / den).astype(q.dtype)
        special = np.isnan(num) | np.isnan(den) | np.isinf(num) | np.isinf(den) | (den == 0)
        lost = ~np.isfinite(q) & ~np.isnan(ieee)
        return np.asarray(np.where(special | lost, ieee, out).astype(q.dtype))


def _sin(x: A) -> A:
    return np.sin(x.astype(np.float64) * (2 * np.pi)).astype(x.dtype)


def _cos(x: A) -> A:
    return np.cos(x.astype(np.float64) * (2 * np.pi)).astype(x.dtype)


def _ldexp(x: A, e: A) -> A:
    return np.asarray(
        np.ldexp(x, np.clip(e.view(np.int32).astype(np.int64), -2000, 2000).astype(np.int32)).astype(x.dtype)
    )


def _fract(x: A) -> A:
    with np.errstate(invalid="ignore"):
        return np.where(
            np.isinf(x), np.nan, np.minimum(x - np.floor(x), np.nextafter(x.dtype.type(1), x.dtype.type(0)))
        ).astype(x.dtype)


def _errs(fn: Fn) -> Fn:
    def run(*args: A) -> Any:
        with np.errstate(all="ignore"):
            return fn(*args)

    return run


# name -> (dst type, (src types), fn); the executor reads sources as those types and writes the result's bits
OPS: dict[str, tuple[str, tuple[str, ...], Fn]] = {}


def _op(names: str, dst: str, srcs: str, fn: Fn) -> None:
    for name in names.split():
        OPS[name] = (dst, tuple(srcs.split()), _errs(fn))


for t in ("f16", "f32", "f64"):
    _op(f"v_add_{t}", t, f"{t} {t}", lambda a, b: a + b)
    _op(f"v_sub_{t}", t, f"{t} {t}", lambda a, b: a - b)
    _op(f"v_subrev_{t}", t, f"{t} {t}", lambda a, b: b - a)
    _op(f"v_mul_{t}", t, f"{t} {t}", lambda a, b: a * b)
    _op(f"v_min_{t}", t, f"{t} {t}", np.fmin)
    _op(f"v_max_{t}", t, f"{t} {t}", np.fmax)
    _op(f"v_sqrt_{t}", t, t, np.sqrt)
    _op(f"v_rcp_{t}", t, t, lambda a: (1 / a).astype(a.dtype))
    _op(f"v_rsq_{t}", t, t, lambda a: (1 / np.sqrt(a)).astype(a.dtype))
    _op(f"v_floor_{t}", t, t, np.floor)
    _op(f"v_ceil_{t}", t, t, np.ceil)
    _op(f"v_trunc_{t}", t, t, np.trunc)
    _op(f"v_rndne_{t}", t, t, np.rint)
    _op(f"v_fract_{t}", t, t, _fract)
    _op(f"v_ldexp_{t}", t, f"{t} i32", _ldexp)
    _op(f"v_frexp_mant_{t}", t, t, _frexp_mant)
    _op(f"v_min3_{t}", t, f"{t} {t} {t}", _min3)
    _op(f"v_max3_{t}", t, f"{t} {t} {t}", _max3)
    _op(f"v_med3_{t}", t, f"{t} {t} {t}", _med3)
    _op(f"v_div_fixup_{t}", t, f"{t} {t} {t}", _div_fixup)
    _op(f"v_div_fmas_{t}", t, f"{t} {t} {t}", {"f16": _fma16, "f32": _fma32, "f64": _fma64}[t])
    _op(f"v_fma_{t} v_fmac_{t}", t, f"{t} {t} {t}", {"f16": _fma16, "f32": _fma32, "f64": _fma64}[t])
_op("v_mul_dx9_zero_f32 v_mul_legacy_f32", "f32", "f32 f32", lambda a, b: np.where((a == 0) | (b == 0), 0, a * b))
_op("v_fmamk_f32", "f32", "f32 f32 f32", lambda a, k, b: _fma32(a, k, b))
_op("v_fmaak_f32", "f32", "f32 f32 f32", _fma32)
_op("v_fmamk_f16", "f16", "f16 f16 f16", lambda a, k, b: _fma16(a, k, b))
_op("v_fmaak_f16", "f16", "f16 f16 f16", _fma16)
_op("v_exp_f32", "f32", "f32", np.exp2)
_op("v_exp_f16", "f16", "f16", np.exp2)
_op("v_log_f32", "f32", "f32", np.log2)
_op("v_log_f16", "f16", "f16", np.log2)
_op("v_sin_f32", "f32", "f32", _sin)
_op("v_cos_f32", "f32", "f32", _cos)
_op("v_sin_f16", "f16", "f16", _sin)
_op("v_cos_f16", "f16", "f16", _cos)
_op("v_rcp_iflag_f32", "f32", "f32", lambda a: (1 / a).astype(np.float32))
_op("v_frexp_exp_i32_f32", "i32", "f32", _frexp_exp)
_op("v_frexp_exp_i32_f64", "i32", "f64", _frexp_exp)
_op("v_frexp_exp_i16_f16", "i16", "f16", lambda a: _frexp_exp(a).astype(np.int16))
_op("v_cvt_f32_i32", "f32", "i32", lambda a: a.astype(np.float32))
_op("v_cvt_f32_u32", "f32", "u32", lambda a: a.astype(np.float32))
_op("v_cvt_i32_f32", "i32", "f32", _cvt_i32)
_op("v_cvt_u32_f32", "u32", "f32", _cvt_u32)
_op("v_cvt_i32_f64", "i32", "f64", _cvt_i32)
_op("v_cvt_u32_f64", "u32", "f64", _cvt_u32)
_op("v_cvt_f64_i32", "f64", "i32", lambda a: a.astype(np.float64))
_op("v_cvt_f64_u32", "f64", "u32", lambda a: a.astype(np.float64))
_op("v_cvt_f32_f64", "f32", "f64", lambda a: a.astype(np.float32))
_op("v_cvt_f64_f32", "f64", "f32", lambda a: a.astype(np.float64))
_op("v_cvt_f16_f32", "f16", "f32", lambda a: a.astype(np.float16))
_op("v_cvt_f32_f16", "f32", "f16", lambda a: a.astype(np.float32))
_op("v_cvt_f16_u16", "f16", "u16", lambda a: a.astype(np.float16))
_op("v_cvt_f16_i16", "f16", "i16", lambda a: a.astype(np.float16))
_op(
    "v_cvt_u16_f16",
    "u16",
    "f16",
    lambda a: np.clip(np.nan_to_num(np.trunc(a.astype(np.float32))), 0, 65535).astype(np.uint16),
)
_op(
    "v_cvt_i16_f16",
    "i16",
    "f16",
    lambda a: np.clip(np.nan_to_num(np.trunc(a.astype(np.float32))), -32768, 32767).astype(np.int16),
)
_op("v_cvt_i32_i16", "i32", "i16", lambda a: a.astype(np.int32))
_op("v_cvt_u32_u16", "u32", "u16", lambda a: a.astype(np.uint32))
_op("v_cvt_floor_i32_f32", "i32", "f32", lambda a: _cvt_i32(np.floor(a)))
_op("v_cvt_nearest_i32_f32", "i32", "f32", lambda a: _cvt_i32(np.floor(a + np.float32(0.5))))
for i in range(4):
    _op(
        f"v_cvt_f32_ubyte{i}",
        "f32",
        "u32",
        lambda a, i=i: ((a >> np.uint32(8 * i)) & np.uint32(0xFF)).astype(np.float32),
    )
_op("v_mov_b32", "u32", "u32", lambda a: a)
_op("v_mov_b16", "u16", "u16", lambda a: a)
_op("v_not_b32", "u32", "u32", lambda a: ~a)
_op("v_not_b16", "u16", "u16", lambda a: ~a)
_op("v_bfrev_b32", "u32", "u32", lambda a: np.array([int(f"{int(x):032b}"[::-1], 2) for x in a], np.uint32))
_op("v_ctz_i32_b32", "u32", "u32", _ctz)
_op("v_clz_i32_u32", "u32", "u32", _clz)
_op("v_and_b32", "u32", "u32 u32", lambda a, b: a & b)
_op("v_or_b32", "u32", "u32 u32", lambda a, b: a | b)
_op("v_xor_b32", "u32", "u32 u32", lambda a, b: a ^ b)
_op("v_xnor_b32", "u32", "u32 u32", lambda a, b: ~(a ^ b))
_op("v_and_b16", "u16", "u16 u16", lambda a, b: a & b)
_op("v_or_b16", "u16", "u16 u16", lambda a, b: a | b)
_op("v_xor_b16", "u16", "u16 u16", lambda a, b: a ^ b)
_op("v_lshlrev_b32", "u32", "u32 u32", lambda a, b: b << _sh(a, 32))
_op("v_lshrrev_b32", "u32", "u32 u32", lambda a, b: b >> _sh(a, 32))
_op("v_ashrrev_i32", "i32", "u32 i32", lambda a, b: b >> _sh(a, 32).astype(np.int32))
_op("v_lshlrev_b16", "u16", "u16 u16", lambda a, b: b << (a & np.uint16(15)))
_op("v_lshrrev_b16", "u16", "u16 u16", lambda a, b: b >> (a & np.uint16(15)))
_op("v_ashrrev_i16", "i16", "u16 i16", lambda a, b: b >> (a & np.uint16(15)).astype(np.int16))
_op("v_lshlrev_b64", "u64", "u32 u64", lambda a, b: b << _sh(a, 64).astype(np.uint64))
_op("v_lshrrev_b64", "u64", "u32 u64", lambda a, b: b >> _sh(a, 64).astype(np.uint64))
_op("v_ashrrev_i64", "i64", "u32 i64", lambda a, b: b >> _sh(a, 64).astype(np.int64))
_op("v_add_nc_u32", "u32", "u32 u32", lambda a, b: a + b)
_op("v_sub_nc_u32", "u32", "u32 u32", lambda a, b: a - b)
_op("v_subrev_nc_u32", "u32", "u32 u32", lambda a, b: b - a)
_op("v_add_nc_i32", "i32", "i32 i32", lambda a, b: a + b)
_op("v_sub_nc_i32", "i32", "i32 i32", lambda a, b: a - b)
_op("v_add_nc_u16", "u16", "u16 u16", lambda a, b: a + b)
_op("v_sub_nc_u16", "u16", "u16 u16", lambda a, b: a - b)
_op("v_mul_lo_u16", "u16", "u16 u16", lambda a, b: a * b)
_op("v_add_nc_i16", "i16", "i16 i16", lambda a, b: a + b)
_op("v_sub_nc_i16", "i16", "i16 i16", lambda a, b: a - b)
for t in ("i32", "u32", "i16", "u16"):
    _op(f"v_min_{t}", t, f"{t} {t}", np.minimum)
    _op(f"v_max_{t}", t, f"{t} {t}", np.maximum)
    _op(f"v_min3_{t}", t, f"{t} {t} {t}", _min3)
    _op(f"v_max3_{t}", t, f"{t} {t} {t}", _max3)
    _op(f"v_med3_{t}", t, f"{t} {t} {t}", _med3)
_op("v_mul_lo_u32", "u32", "u32 u32", lambda a, b: a * b)
_op(
    "v_mul_hi_u32",
    "u32",
    "u32 u32",
    lambda a, b: ((a.astype(np.uint64) * b.astype(np.uint64)) >> np.uint64(32)).astype(np.uint32),
)
_op(
    "v_mul_hi_i32",
    "i32",
    "i32 i32",
    lambda a, b: ((a.astype(np.int64) * b.astype(np.int64)) >> np.int64(32)).astype(np.int32),
)
_op("v_mul_u32_u24", "u32", "u32 u32", lambda a, b: (_u24(a) * _u24(b)).astype(np.uint32))
_op("v_mul_hi_u32_u24", "u32", "u32 u32", lambda a, b: ((_u24(a) * _u24(b)) >> np.uint64(32)).astype(np.uint32))
_op("v_mul_i32_i24", "i32", "u32 u32", lambda a, b: (_i24(a) * _i24(b)).astype(np.int32))
_op("v_mul_hi_i32_i24", "i32", "u32 u32", lambda a, b: ((_i24(a) * _i24(b)) >> 32).astype(np.int32))
_op("v_mad_u32_u24", "u32", "u32 u32 u32", lambda a, b, c: (_u24(a) * _u24(b) + c).astype(np.uint32))
_op("v_mad_i32_i24", "i32", "u32 u32 i32", lambda a, b, c: (_i24(a) * _i24(b) + c).astype(np.int32))
_op("v_mad_u16", "u16", "u16 u16 u16", lambda a, b, c: a * b + c)
_op("v_bfe_u32", "u32", "u32 u32 u32", lambda a, b, c: _bfe(a, b, c, False))
_op("v_bfe_i32", "i32", "u32 u32 u32", lambda a, b, c: _bfe(a, b, c, True))
_op("v_bfi_b32", "u32", "u32 u32 u32", lambda a, b, c: (a & b) | (~a & c))
_op(
    "v_bfm_b32",
    "u32",
    "u32 u32",
    lambda a, b: (((np.uint64(1) << (a & 31).astype(np.uint64)) - np.uint64(1)) << (b & 31).astype(np.uint64)).astype(
        np.uint32
    ),
)
_op(
    "v_alignbit_b32",
    "u32",
    "u32 u32 u32",
    lambda a, b, c: (((a.astype(np.uint64) << np.uint64(32)) | b) >> (c & 31).astype(np.uint64)).astype(np.uint32),
)
_op(
    "v_alignbyte_b32",
    "u32",
    "u32 u32 u32",
    lambda a, b, c: (((a.astype(np.uint64) << np.uint64(32)) | b) >> (8 * (c & 3)).astype(np.uint64)).astype(np.uint32),
)
_op("v_lshl_add_u32", "u32", "u32 u32 u32", lambda a, b, c: (a << _sh(b, 32)) + c)
_op("v_add_lshl_u32", "u32", "u32 u32 u32", lambda a, b, c: (a + b) << _sh(c, 32))
_op("v_add3_u32", "u32", "u32 u32 u32", lambda a, b, c: a + b + c)
_op("v_lshl_or_b32", "u32", "u32 u32 u32", lambda a, b, c: (a << _sh(b, 32)) | c)
_op("v_and_or_b32", "u32", "u32 u32 u32", lambda a, b, c: (a & b) | c)
_op("v_or3_b32", "u32", "u32 u32 u32", lambda a, b, c: a | b | c)
_op("v_xor3_b32", "u32", "u32 u32 u32", lambda a, b, c: a ^ b ^ c)
_op("v_xad_u32", "u32", "u32 u32 u32", lambda a, b, c: (a ^ b) + c)
_op("v_perm_b32", "u32", "u32 u32 u32", _perm)
_op("v_bcnt_u32_b32", "u32", "u32 u32", lambda a, b: np.array([int(x).bit_count() for x in a], np.uint32) + b)
_op("v_pack_b32_f16", "u32", "u16 u16", lambda a, b: a.astype(np.uint32) | (b.astype(np.uint32) << np.uint32(16)))
_op(
    "v_cvt_pk_rtz_f16_f32",
    "u32",
    "f32 f32",
    lambda a, b: (
        a.astype(np.float16).view(np.uint16).astype(np.uint32)
        | (b.astype(np.float16).view(np.uint16).astype(np.uint32) << np.uint32(16))
    ),
)
_op("v_cvt_pk_u16_u32", "u32", "u32 u32", lambda a, b: np.minimum(a, 0xFFFF) | (np.minimum(b, 0xFFFF) << np.uint32(16)))
_op(
    "v_cvt_pk_i16_i32",
    "u32",
    "i32 i32",
    lambda a, b: (
        (np.clip(a, -32768, 32767).astype(np.int16).view(np.uint16).astype(np.uint32))
        | (np.clip(b, -32768, 32767).astype(np.int16).view(np.uint16).astype(np.uint32) << np.uint32(16))
    ),
)


def _dot2acc(a: A, b: A, c: A) -> A:
    """v_dot2acc_f32_f16: the two f16 products of the packed sources summed into the f32 accumulator."""
    halves = [
        ((x >> np.uint32(16 * i)) & np.uint32(0xFFFF)).astype(np.uint16).view(np.float16)
        for x in (a, b)
        for i in (0, 1)
    ]
    a0, a1, b0, b1 = (h.astype(np.float64) for h in halves)
    return np.asarray((a0 * b0 + a1 * b1 + c.astype(np.float64)).astype(np.float32))


_op("v_dot2acc_f32_f16", "f32", "u32 u32 f32", _dot2acc)
CLASS = _class
