"""Decompositions: rewrite what a renderer lacks into what it has.

IR in: a kernel AST after lane expansion (scalar values): SINK of STOREs over INDEX/LOAD/PARAM, ALU ops, CAST, BITCAST,
CONST, RANGE, REDUCE, WHERE. IR out: the same kind of AST in which
- bfloat16 and fp8 buffers are uint16 and uint8 memory and their values are float32, decoded and rounded with integer
  ops on the bits (`pm_emulate_bf16`, `pm_emulate_fp8`);
- EXP2, LOG2 and SIN are polynomial approximations made of ADD, MUL, FDIV, comparisons and bit ops
  (`pm_transcendental`);
- other ALU ops the renderer lacks are spelled with ones it has (`pm_decompose_missing`).
`decompositions_for(renderer)` picks the passes from the renderer's `supported_ops` and `native_dtypes` alone.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

from xgrad.dtype import DType, dtypes, truncate
from xgrad.uop.ops import GroupOp, Ops, UOp
from xgrad.uop.pattern import PatternMatcher, UPat

F32, F64, I32, I64, U32 = dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64, dtypes.uint32


class Renderer(Protocol):
    """What `decompositions_for` reads from a renderer."""

    @property
    def supported_ops(self) -> frozenset[Ops]: ...

    @property
    def native_dtypes(self) -> frozenset[DType]: ...


# ---- small builders ----
def _k(dtype: DType, value: int | float) -> UOp:
    return UOp.const(dtype, value)


def _bits_const(dtype: DType, bits: int) -> UOp:
    """A float constant given by its bit pattern (NaN and inf without float literals)."""
    return _k(U32 if dtype == F32 else I64, bits).bitcast(dtype)


def _round_f32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def _float_bits(x: float, dtype: DType) -> int:
    fmt = ("f", "I") if dtype == F32 else ("d", "q")
    return int(struct.unpack(fmt[1], struct.pack(fmt[0], x))[0])


def _horner(x: UOp, coeffs: list[float]) -> UOp:
    """coeffs[0] + coeffs[1]*x + coeffs[2]*x**2 + ..."""
    acc = _k(x.dtype, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = acc * x + c
    return acc


def _abs(x: UOp) -> UOp:
    """|x| of a float32/float64 by clearing the sign bit."""
    if x.dtype == F32:
        return x.bitcast(U32).alu(Ops.AND, 0x7FFFFFFF).bitcast(F32)
    return x.bitcast(I64).alu(Ops.AND, 0x7FFFFFFFFFFFFFFF).bitcast(F64)


# ---- bfloat16 / fp8 emulation ----
@dataclass(frozen=True)
class _Fp8:
    mant: int  # mantissa bits
    bias: int
    max_bits: int  # bit pattern of the largest finite magnitude (where encoding saturates)
    nan_bits: int  # the NaN encoding produces (OCP formats add the sign)
    kind: str  # "fn": all-ones pattern is NaN, no inf; "inf": IEEE-like inf and NaNs; "fnuz": 0x80 is the only NaN


_FP8: dict[DType, _Fp8] = {
    dtypes.fp8e4m3: _Fp8(3, 7, 0x7E, 0x7F, "fn"),
    dtypes.fp8e5m2: _Fp8(2, 15, 0x7B, 0x7E, "inf"),
    dtypes.fp8e4m3fnuz: _Fp8(3, 8, 0x7F, 0x80, "fnuz"),
    dtypes.fp8e5m2fnuz: _Fp8(2, 16, 0x7F, 0x80, "fnuz"),
}


def _storage(dtype: DType) -> DType:
    return (dtypes.uint16 if dtype.scalar() == dtypes.bfloat16 else dtypes.uint8).vec(dtype.count)


def _bf16_round_bits(x: UOp) -> UOp:
    """float32 -> uint32 whose top half is the nearest bfloat16 (ties to even, overflow to inf, NaN -> quiet NaN)."""
    bits = x.bitcast(U32)
    lsb = bits.alu(Ops.SHR, 16).alu(Ops.AND, 1)
    rounded = (bits + 0x7FFF + lsb).alu(Ops.AND, 0xFFFF0000)
    is_nan = _k(U32, 0x7F800000).lt(bits.alu(Ops.AND, 0x7FFFFFFF))
    return is_nan.where(bits.alu(Ops.AND, 0x80000000).alu(Ops.OR, 0x7FC00000), rounded)


def _fp8_bits(x: UOp, f: _Fp8) -> UOp:
    """float32 -> int32 holding the fp8 pattern: ties to even, saturating at the largest finite value."""
    bits = x.bitcast(I32)
    is_nan = _k(I32, 0x7F800000).lt(bits.alu(Ops.AND, 0x7FFFFFFF))
    mag = is_nan.where(0, bits.alu(Ops.AND, 0x7FFFFFFF))
    # normal range: round the float32 pattern to `mant` mantissa bits, then move the exponent to the fp8 bias
    shift = 23 - f.mant
    lsb = mag.alu(Ops.SHR, shift).alu(Ops.AND, 1)
    normal = (mag + ((1 << (shift - 1)) - 1) + lsb).alu(Ops.SHR, shift) + ((f.bias - 127) << f.mant)
    normal = normal.lt(f.max_bits).where(normal, f.max_bits)
    # subnormal range: the value in units of the smallest subnormal, rounded by the 2**23 trick (ties to even)
    small = mag.lt((128 - f.bias) << 23)
    units = small.where(mag, 0).bitcast(F32) * float(2 ** (f.bias + f.mant - 1))
    sub = ((units + 8388608.0) - 8388608.0).cast(I32)
    out = small.where(sub, normal)
    sign = bits.lt(0).where(0x80, _k(I32, 0))
    if f.kind == "fnuz":  # no negative zero
        return is_nan.where(f.nan_bits, out.ne(0).where(out.alu(Ops.OR, sign), 0))
    return is_nan.where(sign.alu(Ops.OR, f.nan_bits), out.alu(Ops.OR, sign))


def _fp8_value(b: UOp, f: _Fp8) -> UOp:
    """uint32 holding an fp8 pattern -> its float32 value (exact)."""
    mag = b.alu(Ops.AND, 0x7F)
    normal = mag.alu(Ops.SHL, 23 - f.mant) + ((127 - f.bias) << 23)
    sub = (mag.cast(F32) * (2.0 ** (1 - f.bias - f.mant))).bitcast(U32)
    mag_bits = mag.alu(Ops.SHR, f.mant).ne(0).where(normal, sub)
    if f.kind == "fn":
        mag_bits = mag.ne(0x7F).where(mag_bits, 0x7FC00000)
    if f.kind == "inf":
        mag_bits = mag.lt(0x7C).where(mag_bits, mag.eq(0x7C).where(_k(U32, 0x7F800000), 0x7FC00000))
    value = mag_bits.alu(Ops.OR, b.alu(Ops.AND, 0x80).alu(Ops.SHL, 24)).bitcast(F32)
    if f.kind == "fnuz":
        return b.ne(0x80).where(value, _bits_const(F32, 0x7FC00000))
    return value


def _encode(x: UOp, dtype: DType) -> UOp:
    """float32 -> the storage pattern (uint16 / uint8) of the nearest `dtype` value."""
    if dtype.scalar() == dtypes.bfloat16:
        return _bf16_round_bits(x).alu(Ops.SHR, 16).cast(_storage(dtype))
    return _fp8_bits(x, _FP8[dtype.scalar()]).cast(_storage(dtype))


def _decode(bits: UOp, dtype: DType) -> UOp:
    """A storage pattern (any int dtype) -> the float32 value of `dtype` it encodes."""
    wide = bits.cast(U32)
    if dtype.scalar() == dtypes.bfloat16:
        return wide.alu(Ops.SHL, 16).bitcast(F32)
    return _fp8_value(wide, _FP8[dtype.scalar()])


def _narrow_f32(x: UOp) -> UOp:
    """`x` as float32, rounded to odd when float32 cannot hold it: a second rounding to a format of 22 or fewer
    significant bits then equals a single rounding of `x`. (int64 beyond 2**53 goes through float64 first.)"""
    d = x.dtype.scalar()
    if d == F32:
        return x
    if dtypes.is_bool(d) or d.itemsize <= 2:
        return x.cast(F32)
    wide = x if d == F64 else x.cast(F64)
    f = wide.cast(F32)
    back = f.cast(F64)
    bits = f.bitcast(U32)
    rounded_away = wide.lt(back).ne(wide.lt(0.0))
    toward_zero = rounded_away.where(bits + 0xFFFFFFFF, bits)  # adding 2**32-1 subtracts one, modulo 2**32
    return back.ne(wide).where(toward_zero.alu(Ops.OR, 1), bits).bitcast(F32)


def round_to(x: UOp, dtype: DType) -> UOp:
    """float32 `x` rounded to the nearest `dtype` (bfloat16 or fp8) value, as a float32."""
    if dtype.scalar() == dtypes.bfloat16:
        return _bf16_round_bits(x).bitcast(F32)
    return _decode(_encode(x, dtype), dtype)


def _storage_index(idx: UOp) -> UOp:
    mem = _storage(idx.dtype)
    return idx.replace(dtype=mem, src=(idx.src[0].replace(dtype=mem), *idx.src[1:]))


def to_storage(x: UOp) -> UOp:
    return x.replace(dtype=_storage(x.dtype))


def lower_load(x: UOp, idx: UOp) -> UOp:
    return _decode(UOp(Ops.LOAD, _storage(x.dtype), (_storage_index(idx),)), x.dtype)


def lower_store(x: UOp, idx: UOp, v: UOp) -> UOp:
    return x.replace(src=(_storage_index(idx), _encode(_narrow_f32(v), idx.dtype)))


def lower_const(x: UOp) -> UOp:
    return _k(F32.vec(x.dtype.count), truncate(x.dtype)(x.arg))


def lower_cast(x: UOp) -> UOp:
    return round_to(_narrow_f32(x.src[0]), x.dtype)


def lower_bitcast_to(x: UOp) -> UOp:
    src = x.src[0]
    return _decode(src if src.dtype == _storage(x.dtype) else src.bitcast(_storage(x.dtype)), x.dtype)


def lower_bitcast_from(x: UOp, v: UOp, dtype: DType) -> UOp | None:
    """BITCAST of a value that was `dtype` and is float32 now (the sizes no longer agree): bitcast its pattern."""
    if x.dtype.itemsize != dtype.itemsize:
        return None
    bits = _encode(v, dtype)
    return bits if bits.dtype == x.dtype else bits.bitcast(x.dtype)


def compute_in_float32(x: UOp) -> UOp:
    return x.replace(dtype=F32.vec(x.dtype.count))


def drop_noop_cast(x: UOp) -> UOp | None:
    return x.src[0] if x.src[0].dtype == x.dtype else None


def _emulation_table(emulated: tuple[DType, ...]) -> PatternMatcher:
    """The rules that move `emulated` dtypes to integer memory and float32 math. With a single dtype the table also
    lowers BITCASTs from it (with several, a float32 value no longer says which format it came from)."""
    dts = frozenset(emulated)
    rules: list[tuple[UPat, Callable[..., UOp | None]]] = [
        (UPat(Ops.PARAM, dts, name="x"), to_storage),
        (UPat(Ops.LOAD, dts, src=(UPat(Ops.INDEX, name="idx"),), name="x"), lower_load),
        (UPat(Ops.STORE, src=(UPat(Ops.INDEX, dts, name="idx"), UPat.var("v")), name="x"), lower_store),
        (UPat(Ops.CONST, dts, name="x"), lower_const),
        (UPat(Ops.CAST, dts, name="x"), lower_cast),
        (UPat(Ops.BITCAST, dts, name="x"), lower_bitcast_to),
        (UPat(GroupOp.ALU | {Ops.REDUCE}, dts, name="x"), compute_in_float32),
        (UPat(Ops.CAST, name="x"), drop_noop_cast),
    ]
    if len(emulated) == 1:
        fn = functools.partial(lower_bitcast_from, dtype=emulated[0])
        rules.append((UPat(Ops.BITCAST, src=(UPat(dtype=F32, name="v"),), name="x"), fn))
    return PatternMatcher(rules)


pm_emulate_bf16 = _emulation_table((dtypes.bfloat16,))
pm_emulate_fp8_by_dtype: dict[DType, PatternMatcher] = {d: _emulation_table((d,)) for d in dtypes.fp8s}
pm_emulate_fp8 = _emulation_table(dtypes.fp8s)  # all four at once; BITCAST from fp8 needs the per-dtype tables


# ---- transcendental functions ----
_PI = Fraction("3.1415926535897932384626433832795028841971693993751058209749445923078164062862089986280348253421170679")


def _split(value: Fraction, pieces: int, bits: int, last_bits: int) -> list[float]:
    """Cody-Waite pieces of `value`: the first ones hold `bits` significant bits (so k*piece is exact for small k),
    the last one `last_bits`; their sum is `value` to about pieces*bits + last_bits bits."""
    out: list[float] = []
    rest = value
    for i in range(pieces):
        keep = last_bits if i == pieces - 1 else bits
        e = rest.numerator.bit_length() - rest.denominator.bit_length()
        while Fraction(2) ** e > rest:
            e -= 1
        q = Fraction(2) ** (e - keep + 1)
        piece = math.floor(rest / q) * q
        out.append(float(piece))
        rest -= piece
    return out


@dataclass(frozen=True)
class _Float:
    """Constants of the approximations for one float dtype."""

    dtype: DType
    int_dtype: DType
    mant: int
    bias: int
    magic: float  # 1.5 * 2**mant: (x + magic) - magic rounds x to an integer, ties to even
    exp2_coeffs: list[float]  # Taylor series of 2**f on [-0.5, 0.5]
    log2_coeffs: list[float]  # ln(m) = 2s + 2s*z*P(z), s = (m-1)/(m+1), z = s*s, m in [sqrt(1/2), sqrt(2))
    inv_ln2: float
    sin_coeffs: list[float]  # sin(r) = r + r * z * P(z), z = r*r, r in [-pi/4, pi/4]
    cos_coeffs: list[float]  # cos(r) = 1 + z * P(z)
    pio2: list[float]  # pi/2 in Cody-Waite pieces
    two_over_pi: float


def _make_float(
    dtype: DType,
    int_dtype: DType,
    mant: int,
    bias: int,
    n_exp: int,
    n_log: int,
    n_sin: int,
    pieces: int,
    split_bits: int,
) -> _Float:
    rnd = _round_f32 if dtype == F32 else float
    ln2 = math.log(2.0)
    return _Float(
        dtype,
        int_dtype,
        mant,
        bias,
        1.5 * 2.0**mant,
        [rnd(ln2**k / math.factorial(k)) for k in range(n_exp + 1)],
        [rnd(1 / (2 * j + 3)) for j in range(n_log)],
        rnd(1 / ln2),
        [rnd((-1) ** (j + 1) / math.factorial(2 * j + 3)) for j in range(n_sin)],
        [rnd((-1) ** (j + 1) / math.factorial(2 * j + 2)) for j in range(n_sin + 1)],
        [rnd(p) for p in _split(_PI / 2, pieces, split_bits, mant + 1)],
        rnd(2 / math.pi),
    )


_FLOATS: dict[DType, _Float] = {
    F32: _make_float(F32, I32, 23, 127, n_exp=7, n_log=5, n_sin=4, pieces=6, split_bits=8),
    F64: _make_float(F64, I64, 52, 1023, n_exp=13, n_log=11, n_sin=8, pieces=4, split_bits=30),
}


def _pow2(k: UOp, p: _Float) -> UOp:
    """2**k for an integer k with a normal result, built in the exponent bits."""
    return (k + p.bias).alu(Ops.SHL, p.mant).bitcast(p.dtype)


def _exp2(x: UOp, p: _Float) -> UOp:
    is_nan = x.ne(x)
    lo, hi = -(p.bias + p.mant + 2), p.bias + 2  # beyond these the result is 0 / inf
    c = x.lt(lo).where(float(lo), x)
    c = _k(p.dtype, hi).lt(c).where(float(hi), c)
    c = is_nan.where(0.0, c)
    n = (c + p.magic) - p.magic
    poly = _horner(c - n, p.exp2_coeffs)
    k = n.cast(p.int_dtype)
    half = k.alu(Ops.SHR, 1)
    return is_nan.where(x, poly * _pow2(half, p) * _pow2(k - half, p))  # two factors: 2**k may not be normal


def _log2(x: UOp, p: _Float) -> UOp:
    ok = _k(p.dtype, 0.0).lt(x).logical_and(x.lt(math.inf))
    w = ok.where(x, 1.0)
    tiny = w.lt(2.0 ** (1 - p.bias))  # subnormal: scale into the normal range first
    w = tiny.where(w * 2.0 ** (p.mant + 1), w)
    # w = m * 2**e with m in [sqrt(1/2), sqrt(2)): shift the pattern so the exponent field splits there
    sqrt_half = _float_bits(math.sqrt(0.5), p.dtype)
    t = w.bitcast(p.int_dtype) - sqrt_half
    m = (t.alu(Ops.AND, (1 << p.mant) - 1) + sqrt_half).bitcast(p.dtype)
    e = t.alu(Ops.SHR, p.mant).cast(p.dtype) + tiny.where(_k(p.dtype, -(p.mant + 1)), 0.0)
    u = m - 1.0  # exact
    s = u.alu(Ops.FDIV, m + 1.0)
    # ln(m) = 2*atanh(s) = 2s + 2s*z*P(z); 2s = u - s*u keeps the leading term exact
    z = s * s
    ln_m = (u - s * u) + (s + s) * (z * _horner(z, p.log2_coeffs))
    ret = e + ln_m * p.inv_ln2
    ret = x.lt(math.inf).where(ret, x)  # +inf and NaN
    ret = x.lt(0.0).where(_bits_const(p.dtype, _float_bits(math.nan, p.dtype)), ret)
    return x.ne(0.0).where(ret, -math.inf)


def _sin(x: UOp, p: _Float) -> UOp:
    finite = _abs(x).lt(math.inf)
    a = finite.where(x, 0.0)
    kf = (a * p.two_over_pi + p.magic) - p.magic
    r = a
    for piece in p.pio2:  # Cody-Waite: a - k*pi/2 with the first products exact
        r = r + kf * -piece
    r = r.lt(-1.0).where(-1.0, _k(p.dtype, 1.0).lt(r).where(1.0, r))  # only |x| far beyond the exact range gets here
    z = r * r
    sin_r = r + r * (z * _horner(z, p.sin_coeffs))
    cos_r = z * _horner(z, p.cos_coeffs) + 1.0
    # the quadrant: k mod 4 (a float k beyond 2**30 is a multiple of 4 in float32 and in the float64 range used)
    q = _abs(kf).lt(2.0**30).where(kf, 0.0).cast(p.int_dtype)
    ret = q.alu(Ops.AND, 1).ne(0).where(cos_r, sin_r)
    ret = q.alu(Ops.AND, 2).ne(0).where(ret.neg(), ret)
    ret = x.ne(0.0).where(ret, x)  # sin(-0.0) is -0.0
    return finite.where(ret, _bits_const(p.dtype, _float_bits(math.nan, p.dtype)))


def _approximate(x: UOp, fn: Callable[[UOp, _Float], UOp]) -> UOp | None:
    if not dtypes.is_float(x.dtype) or x.dtype.count != 1:
        return None
    work = F64 if x.dtype == F64 else F32
    arg = x.src[0] if x.src[0].dtype == work else x.src[0].cast(work)
    ret = fn(arg, _FLOATS[work])
    return ret if work == x.dtype else ret.cast(x.dtype)


def lower_exp2(x: UOp) -> UOp | None:
    return _approximate(x, _exp2)


def lower_log2(x: UOp) -> UOp | None:
    return _approximate(x, _log2)


def lower_sin(x: UOp) -> UOp | None:
    return _approximate(x, _sin)


pm_transcendental = PatternMatcher(
    [
        (UPat(Ops.EXP2, name="x"), lower_exp2),
        (UPat(Ops.LOG2, name="x"), lower_log2),
        (UPat(Ops.SIN, name="x"), lower_sin),
    ]
)


# ---- other missing ops ----
def split_mulacc(x: UOp, a: UOp, b: UOp, c: UOp) -> UOp:
    return UOp(Ops.ADD, x.dtype, (UOp(Ops.MUL, x.dtype, (a, b)), c))


def split_sub(x: UOp, a: UOp, b: UOp) -> UOp:
    return UOp(Ops.ADD, x.dtype, (a, UOp(Ops.NEG, x.dtype, (b,))))


def neg_as_mul(x: UOp) -> UOp | None:
    if dtypes.is_bool(x.dtype):
        return None
    return UOp(Ops.MUL, x.dtype, (x.src[0], _k(x.dtype, -1)))


def cmpeq_as_not_cmpne(x: UOp) -> UOp:
    return UOp(Ops.CMPNE, x.dtype, (UOp(Ops.CMPNE, x.dtype, x.src), _k(x.dtype, True)))


def max_as_where(x: UOp, a: UOp, b: UOp) -> UOp:
    """b < a ? a : b, or a where a is NaN (a NaN in b propagates through the failed comparison)."""
    cmp_dtype = dtypes.bool.vec(x.dtype.count)
    take_a = UOp(Ops.CMPLT, cmp_dtype, (b, a))
    if dtypes.is_float(x.dtype):
        take_a = UOp(Ops.OR, cmp_dtype, (take_a, UOp(Ops.CMPNE, cmp_dtype, (a, a))))
    return UOp(Ops.WHERE, x.dtype, (take_a, a, b))


def reciprocal_as_fdiv(x: UOp) -> UOp:
    return UOp(Ops.FDIV, x.dtype, (_k(x.dtype, 1.0), x.src[0]))


def mod_as_idiv(x: UOp, a: UOp, b: UOp) -> UOp:
    quotient = UOp(Ops.IDIV, x.dtype, (a, b))
    return UOp(Ops.ADD, x.dtype, (a, UOp(Ops.MUL, x.dtype, (UOp(Ops.MUL, x.dtype, (quotient, b)), _k(x.dtype, -1)))))


def shl_as_mul(x: UOp, a: UOp, c: UOp) -> UOp:
    return UOp(Ops.MUL, x.dtype, (a, _k(x.dtype, 1 << int(c.arg))))


def shr_as_idiv(x: UOp, a: UOp, c: UOp) -> UOp | None:
    if not dtypes.is_unsigned(x.dtype):  # IDIV truncates, an arithmetic shift floors
        return None
    return UOp(Ops.IDIV, x.dtype, (a, _k(x.dtype, 1 << int(c.arg))))


pm_decompose_missing = PatternMatcher(
    [
        (UPat(Ops.MULACC, src=(UPat.var("a"), UPat.var("b"), UPat.var("c")), name="x"), split_mulacc),
        (UPat(Ops.SUB, src=(UPat.var("a"), UPat.var("b")), name="x"), split_sub),
        (UPat(Ops.NEG, name="x"), neg_as_mul),
        (UPat(Ops.CMPEQ, name="x"), cmpeq_as_not_cmpne),
        (UPat(Ops.MAX, dtypes.bool, src=(UPat.var("a"), UPat.var("b"))), lambda a, b: UOp(Ops.OR, a.dtype, (a, b))),
        (UPat(Ops.MAX, src=(UPat.var("a"), UPat.var("b")), name="x"), max_as_where),
        (UPat(Ops.RECIPROCAL, name="x"), reciprocal_as_fdiv),
        (UPat(Ops.MOD, src=(UPat.var("a"), UPat.var("b")), name="x"), mod_as_idiv),
        (UPat(Ops.XOR, dtypes.bool, src=(UPat.var("a"), UPat.var("b"))), lambda a, b: UOp(Ops.CMPNE, a.dtype, (a, b))),
        (UPat(Ops.SHL, src=(UPat.var("a"), UPat.cvar("c")), name="x"), shl_as_mul),
        (UPat(Ops.SHR, src=(UPat.var("a"), UPat.cvar("c")), name="x"), shr_as_idiv),
    ]
)


# ---- choosing the passes ----
def _rules_for_missing(pm: PatternMatcher, supported: frozenset[Ops]) -> PatternMatcher | None:
    """The rules of `pm` that rewrite ops missing from `supported` (None if there are none)."""
    rules = [(pat, fn) for pat, fn in pm.rules if pat.ops is not None and not pat.ops & supported]
    return PatternMatcher(rules) if rules else None


def decompositions_for(renderer: Renderer) -> list[tuple[str, PatternMatcher]]:
    """The ordered (pass name, matcher) list a renderer needs, chosen from its declared ops and dtypes only.
    Emulation comes first (it makes float32 math that the later passes may decompose further)."""
    ops, dts = renderer.supported_ops, renderer.native_dtypes
    passes: list[tuple[str, PatternMatcher]] = []
    if dtypes.bfloat16 not in dts:
        passes.append(("emulate bfloat16", pm_emulate_bf16))
    for d in dtypes.fp8s:
        if d not in dts:
            passes.append((f"emulate {d.name}", pm_emulate_fp8_by_dtype[d]))
    if (pm := _rules_for_missing(pm_transcendental, ops)) is not None:
        passes.append(("approximate transcendentals", pm))
    if (pm := _rules_for_missing(pm_decompose_missing, ops)) is not None:
        passes.append(("decompose missing ops", pm))
    return passes
