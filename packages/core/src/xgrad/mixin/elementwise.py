"""Elementwise math, casts, `where` and the arithmetic Python operators (comparisons and bitwise ops: bitwise.py)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from xgrad.dtype import DType, dtypes, least_upper_dtype, least_upper_float, to_dtype
from xgrad.errors import ArgumentError, DeviceMismatchError, DTypeError, ShapeError
from xgrad.helpers import DISALLOW_BROADCAST
from xgrad.mixin.base import TensorBase
from xgrad.mixin.common import Scalar, broadcast_shape, weak_dtype
from xgrad.uop.ops import Ops, UOp

if TYPE_CHECKING:
    from xgrad.tensor import Tensor


def _wrapped(x: Tensor) -> Tensor:
    """x itself. For ints, `& -1` resets the value bounds the simplifier tracks: they grow without wrapping on
    overflow, and repeated squaring would make them astronomically large Python ints."""
    return x & -1 if dtypes.is_int(x.dtype) else x


class ElementwiseMixin(TensorBase):
    __slots__ = ()

    # ---- elementwise ----
    def _broadcasted(self, y: Tensor | Scalar | UOp, reverse: bool = False) -> tuple[Tensor, Tensor]:
        x: Tensor = self._t()
        if isinstance(y, UOp):  # a symbolic size (an expression of bound Variables): a 0-d tensor of its value
            y = x._tensor_cls()._sint_tensor(y, device=x.device, dtype=x.dtype)
        if not isinstance(y, TensorBase):
            if not isinstance(y, (bool, int, float)):
                raise DTypeError(f"cannot combine a Tensor with {type(y).__name__}")
            out_dt = least_upper_dtype(x.dtype, weak_dtype(y))
            x = x.cast(out_dt)
            y_t = x._const(y, operand=True)
        else:
            y_t = y
            if x.device != y_t.device:
                raise DeviceMismatchError(
                    f"tensors are on different devices: {x.device} and {y_t.device}; move one with .to()"
                )
            out_dt = least_upper_dtype(x.dtype, y_t.dtype)
            x, y_t = x.cast(out_dt), y_t.cast(out_dt)
            if x.shape != y_t.shape:
                shape = broadcast_shape(x.shape, y_t.shape)
                if DISALLOW_BROADCAST:
                    raise ShapeError(f"implicit broadcast of {x.shape} and {y_t.shape} with DISALLOW_BROADCAST=1")
                x, y_t = x._broadcast_to(shape), y_t._broadcast_to(shape)
        return (y_t, x) if reverse else (x, y_t)

    def _binop(self, op: Ops, y: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(y, reverse)
        return a._alu(op, b)

    def _alu(self, op: Ops, y: Tensor) -> Tensor:
        """`op` of self and `y`, already of one shape and dtype (from `_broadcasted`)."""
        return self._new(self.uop.alu(op, y.uop))

    def _unop(self, op: Ops) -> Tensor:
        return self._new(UOp(op, self.dtype, (self.uop,)))

    def _float(self) -> Tensor:
        return self.cast(least_upper_float(self.dtype))

    def cast(self, dtype: DType | str) -> Tensor:
        """Convert to `dtype` (a DType or its name); float to int rounds toward zero.

        >>> Tensor([1.7, -1.7]).cast(dtypes.int32).tolist()
        [1, -1]"""
        if dtype is self.uop.dtype:
            return self._t()
        dt = to_dtype(dtype)
        return self._t() if dt == self.dtype else self._new(self.uop.cast(dt))

    def _bitcast_same_size(self, dtype: DType | str) -> Tensor:
        """The bits reinterpreted as `dtype` of the same item size (the public `bitcast`, in BitwiseMixin, also
        changes item sizes)."""
        dt = to_dtype(dtype)
        if dt.itemsize != self.dtype.itemsize:
            raise DTypeError(f"bitcast between {self.dtype.name} and {dt.name} needs equal item sizes")
        return self._t() if dt == self.dtype else self._new(self.uop.bitcast(dt))

    def neg(self) -> Tensor:
        """-x (logical not for bool).

        >>> Tensor([1, -2]).neg().tolist()
        [-1, 2]"""
        return (
            self.logical_not()
            if self.dtype == dtypes.bool
            else self._unop(Ops.NEG)
            if dtypes.is_float(self.dtype)
            else self * -1
        )

    def exp2(self) -> Tensor:
        """2 ** x (ints become floats).

        >>> Tensor([0.0, 3.0]).exp2().tolist()
        [1.0, 8.0]"""
        return self._float()._unop(Ops.EXP2)

    def log2(self) -> Tensor:
        """Base-2 logarithm (ints become floats).

        >>> Tensor([1.0, 8.0]).log2().tolist()
        [0.0, 3.0]"""
        return self._float()._unop(Ops.LOG2)

    def _in_float32(self, fn: Callable[[Tensor], Tensor]) -> Tensor:
        """Compute a composed op in float32 when self is a narrower float, rounding once at the end (as torch)."""
        x = self._float()
        return fn(x.cast(dtypes.float32)).cast(x.dtype) if x.dtype.itemsize < 4 else fn(x)

    def exp(self) -> Tensor:
        """e ** x.

        >>> [round(v, 4) for v in Tensor([0.0, 1.0]).exp().tolist()]
        [1.0, 2.7183]"""
        return self._in_float32(lambda x: (x * (1 / math.log(2))).exp2())

    def log(self) -> Tensor:
        """Natural logarithm.

        >>> [round(v, 4) for v in Tensor([1.0, 10.0]).log().tolist()]
        [0.0, 2.3026]"""
        return self._in_float32(lambda x: x.log2() * math.log(2))

    def sqrt(self) -> Tensor:
        """Square root (ints become floats).

        >>> Tensor([4.0, 9.0]).sqrt().tolist()
        [2.0, 3.0]"""
        return self._float()._unop(Ops.SQRT)

    def rsqrt(self) -> Tensor:
        """1 / sqrt(x).

        >>> Tensor([4.0, 16.0]).rsqrt().tolist()
        [0.5, 0.25]"""
        return self.sqrt().reciprocal()

    def reciprocal(self) -> Tensor:
        """1 / x (ints become floats).

        >>> Tensor([2.0, 4.0]).reciprocal().tolist()
        [0.5, 0.25]"""
        return self._float()._unop(Ops.RECIPROCAL)

    def sin(self) -> Tensor:
        """Sine of radians.

        >>> [round(v, 4) for v in Tensor([0.0, 1.5707964]).sin().tolist()]
        [0.0, 1.0]"""
        return self._float()._unop(Ops.SIN)

    def cos(self) -> Tensor:
        """Cosine of radians.

        >>> [round(v, 4) for v in Tensor([0.0, 3.1415927]).cos().tolist()]
        [1.0, -1.0]"""
        return ((math.pi / 2) - self._float()).sin()

    def tan(self) -> Tensor:
        """Tangent of radians.

        >>> [round(v, 4) for v in Tensor([0.0, 0.7853982]).tan().tolist()]
        [0.0, 1.0]"""
        return self.sin() / self.cos()

    def trunc(self) -> Tensor:
        """Round toward zero; ints are unchanged.

        >>> Tensor([-1.5, 1.5]).trunc().tolist()
        [-1.0, 1.0]"""
        return self._unop(Ops.TRUNC) if dtypes.is_float(self.dtype) else self._t()

    def floor(self) -> Tensor:
        """Round down; ints are unchanged.

        >>> Tensor([-1.5, 1.5]).floor().tolist()
        [-2.0, 1.0]"""
        t = self.trunc()
        return (self._t() < t).where(t - 1, t) if dtypes.is_float(self.dtype) else self._t()

    def ceil(self) -> Tensor:
        """Round up; ints are unchanged.

        >>> Tensor([-1.5, 1.5]).ceil().tolist()
        [-1.0, 2.0]"""
        t = self.trunc()
        return (self._t() > t).where(t + 1, t) if dtypes.is_float(self.dtype) else self._t()

    def round(self) -> Tensor:
        """Round to the nearest integer, halves to even (as torch and numpy); ints are unchanged.

        >>> Tensor([0.5, 1.5, 2.5, -0.5, -1.7]).round().tolist()
        [0.0, 2.0, 2.0, -0.0, -2.0]"""
        if not dtypes.is_float(self.dtype):
            return self._t()
        f = self.floor()
        d = self - f
        half_f = f * 0.5
        odd = half_f.trunc() != half_f
        out = ((d > 0.5) | ((d == 0.5) & odd)).where(f + 1, f)
        return (out == 0).where(self * 0, out)  # -0.5 rounds to -0.0

    def _float_abs_bits(self) -> tuple[Tensor, int]:
        """The bits of |x| as a signed int, and the bits of +inf: comparisons of these are exact on every backend,
        even where float compares do not follow IEEE for nan. Narrow floats are widened first (exactly)."""
        x = self.cast(dtypes.float32) if self.dtype.itemsize < 4 else self._t()
        wide = x.dtype.itemsize == 8
        bits = x._bitcast_same_size(dtypes.int64 if wide else dtypes.int32) & (2**63 - 1 if wide else 2**31 - 1)
        return bits, 0x7FF0000000000000 if wide else 0x7F800000

    def isinf(self, detect_positive: bool = True, detect_negative: bool = True) -> Tensor:
        """Where the value is +inf (if `detect_positive`) or -inf (if `detect_negative`).

        >>> Tensor([1.0, float("inf"), -float("inf")]).isinf().tolist()
        [False, True, True]"""
        if not dtypes.is_float(self.dtype) or not (detect_positive or detect_negative):
            return self._const(False, dtypes.bool)
        bits, inf_bits = self._float_abs_bits()
        out = bits == inf_bits
        if detect_positive and detect_negative:
            return out
        return out & ((self._t() > 0) if detect_positive else (self._t() < 0))

    def isnan(self) -> Tensor:
        """Where the value is nan.

        >>> Tensor([1.0, float("nan")]).isnan().tolist()
        [False, True]"""
        if not dtypes.is_float(self.dtype):
            return self._const(False, dtypes.bool)
        bits, inf_bits = self._float_abs_bits()
        return bits > inf_bits

    def isfinite(self) -> Tensor:
        """Neither inf nor nan.

        >>> Tensor([1.0, float("inf"), float("nan")]).isfinite().tolist()
        [True, False, False]"""
        return (self.isinf() | self.isnan()).logical_not()

    def clamp(self, min_: Tensor | Scalar | None = None, max_: Tensor | Scalar | None = None) -> Tensor:
        """min(max(self, min_), max_). As torch: NaN in self or in a tensor bound gives NaN, the gradient reaches
        self where min_ <= self <= max_ (so not at NaN) and a tensor bound where the result is that bound.

        >>> Tensor([-2, 0, 5]).clamp(-1, 3).tolist()
        [-1, 0, 3]"""
        if min_ is None and max_ is None:
            raise ArgumentError("clamp needs min_ or max_ (or both)")
        x = self._t()
        # the value outside [min_, max_] (and at NaN, which is on no comparison's side) comes from a detached x, so
        # the gradient reaches x only through `inside`
        out, inside = x.detach(), None
        for bound, is_min in ((min_, True), (max_, False)):
            if bound is None:
                continue
            out = ((out < bound) if is_min else (out > bound)).where(bound, out)
            if not isinstance(bound, (bool, int, float)) and dtypes.is_float(bound.dtype):
                out = bound.isnan().where(bound.detach(), out)  # a NaN bound is a NaN result, with no gradient
            within = (x >= bound) if is_min else (x <= bound)
            inside = within if inside is None else inside & within
        assert inside is not None
        return inside.where(x, out)

    def clip(self, min_: Tensor | Scalar | None = None, max_: Tensor | Scalar | None = None) -> Tensor:
        """The same as clamp.

        >>> Tensor([-2.0, 5.0]).clip(max_=3.0).tolist()
        [-2.0, 3.0]"""
        return self.clamp(min_, max_)

    def square(self) -> Tensor:
        """x * x.

        >>> Tensor([-3, 2]).square().tolist()
        [9, 4]"""
        return self._t() * self._t()

    def abs(self) -> Tensor:
        """|x|; +0.0 at both zeros, and (as torch) a gradient of 0 there.

        >>> Tensor([-2, 0, 3]).abs().tolist()
        [2, 0, 3]"""
        if dtypes.is_unsigned(self.dtype) or self.dtype == dtypes.bool:
            return self._t()
        x = self._t()
        return (x < 0).where(-x, (x == 0).where(0, x))

    def sign(self) -> Tensor:
        """-1, 0 or 1 by the sign of x, in x's dtype; NaN stays NaN (as numpy and tinygrad; torch gives 0).

        >>> Tensor([-2.0, 0.0, 3.0]).sign().tolist()
        [-1.0, 0.0, 1.0]"""
        x = self._t()
        s = (x > 0).where(1, 0).cast(x.dtype) - (x < 0).where(1, 0).cast(x.dtype)
        return (x != x).where(x.detach(), s) if dtypes.is_float(x.dtype) else s

    def relu(self) -> Tensor:
        """max(x, 0); NaN stays NaN, and the gradient at 0 is 0 (as torch).

        >>> Tensor([-1.0, 0.0, 2.0, float("nan")]).relu().tolist()
        [0.0, 0.0, 2.0, nan]"""
        return (self._t() <= 0).where(0, self._t())

    def logical_not(self) -> Tensor:
        """True where x is zero/false (the result is bool).

        >>> Tensor([True, False]).logical_not().tolist()
        [False, True]"""
        return self._new(self.cast(dtypes.bool).uop.alu(Ops.CMPNE, True))

    def add(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """self + x, broadcasting; `reverse=True` computes x + self. bool + bool is `or`.

        >>> Tensor([1, 2]).add(10).tolist(), Tensor([1.0]).add(Tensor([2.0])).tolist()
        ([11, 12], [3.0])"""
        a, b = self._broadcasted(x, reverse)
        return a._alu(Ops.OR if a.dtype == dtypes.bool else Ops.ADD, b)  # bool + bool is "or", as in numpy

    def sub(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """self - x, broadcasting; `reverse=True` computes x - self.

        >>> Tensor([5, 3]).sub(1).tolist(), Tensor([5, 3]).sub(1, reverse=True).tolist()
        ([4, 2], [-4, -2])"""
        a, b = self._broadcasted(x, reverse)
        return a + (-b)

    def mul(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """self * x, broadcasting. bool * bool is `and`.

        >>> Tensor([1, 2]).mul(Tensor([3, 4])).tolist()
        [3, 8]"""
        a, b = self._broadcasted(x, reverse)
        return a._alu(Ops.AND if a.dtype == dtypes.bool else Ops.MUL, b)  # bool * bool is "and", as in numpy

    def div(self, x: Tensor | Scalar, reverse: bool = False, rounding_mode: str | None = None) -> Tensor:
        """True division (ints give floats); `rounding_mode='trunc'` rounds toward zero and `'floor'` down, keeping
        int dtypes.

        >>> Tensor([7, -7]).div(2).tolist(), Tensor([7, -7]).div(2, rounding_mode="trunc").tolist()
        ([3.5, -3.5], [3, -3])"""
        a, b = self._broadcasted(x, reverse)
        if rounding_mode is None:
            return a._float()._alu(Ops.FDIV, b._float())
        if rounding_mode == "trunc":
            return (a / b).trunc() if dtypes.is_float(a.dtype) else a._alu(Ops.IDIV, b)
        if rounding_mode == "floor":
            return a.idiv(b)
        raise ArgumentError(f"div rounding_mode={rounding_mode!r}: use None, 'trunc' or 'floor'")

    def idiv(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """Floor division (Python semantics) for ints; floor(a/b) for floats. An int divided by 0 is 0 (and `mod`
        gives the dividend), the minimum divided by -1 wraps to the minimum: never a trap (see the core README).

        >>> Tensor([7, -7]).idiv(2).tolist(), Tensor([7, -7]).idiv(0).tolist()
        ([3, -4], [0, 0])"""
        a, b = self._broadcasted(x, reverse)
        if dtypes.is_float(a.dtype):
            return (a / b).floor()
        q = a._alu(Ops.IDIV, b)
        if dtypes.is_unsigned(a.dtype):
            return q
        # truncation rounded up: a remainder whose sign differs from the divisor's (none for a zero divisor)
        needs_fix = (a._alu(Ops.MOD, b) != 0) & ((a < 0) != (b < 0)) & (b != 0)
        return needs_fix.where(q - 1, q)

    def mod(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """Remainder with the sign of the divisor (Python semantics); an int remainder by 0 is the dividend.

        >>> Tensor([7, -7]).mod(3).tolist(), Tensor([7, -7]).mod(0).tolist()
        ([1, 2], [7, -7])"""
        a, b = self._broadcasted(x, reverse)
        if dtypes.is_float(a.dtype):
            return a - (a / b).floor() * b
        r = a._alu(Ops.MOD, b)
        if dtypes.is_unsigned(a.dtype):
            return r
        return ((r != 0) & ((r < 0) != (b < 0))).where(r + b, r)

    def fmod(self, x: Tensor | Scalar) -> Tensor:
        """Remainder with the sign of the dividend (C's fmod); nan for a float divisor of 0, the dividend for an int 0.

        >>> Tensor([-7, 7]).fmod(3).tolist(), Tensor([-7.5]).fmod(2).tolist()
        ([-1, 1], [-1.5])"""
        a, b = self._broadcasted(x)
        if not dtypes.is_float(a.dtype):
            return a._alu(Ops.MOD, b)
        r = a - (a / b).trunc() * b
        # a/b rounded to an integer it does not reach: the remainder came out with the wrong sign; step back once
        r = ((a > 0) & (r < 0)).where(r + b.abs(), ((a < 0) & (r > 0)).where(r - b.abs(), r))
        return (b == 0).where(math.nan, r)

    def pow(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """self ** x, with torch's corner cases: x**0 is 1 (also for nan), 0**-1 is inf, a negative base needs an
        integral exponent (else nan). Integral Python exponents multiply (exact for ints, exact gradients at 0);
        ints raised to int tensors are exact too (square and multiply).

        >>> Tensor([-2.0, 0.0, 3.0]).pow(3).tolist(), Tensor([3]).pow(Tensor([19])).item()
        ([-8.0, 0.0, 27.0], 1162261467)"""
        a, b = self._broadcasted(x, reverse)
        if not reverse and not isinstance(x, TensorBase):
            # multiplying is exact for ints; for floats its rounding error grows with |x| like exp2(x*log2(a))'s
            if float(x).is_integer() and abs(x) <= (64 if dtypes.is_float(a.dtype) else 2**32):
                if int(x) < 0 and not dtypes.is_float(a.dtype):
                    raise DTypeError(f"{a.dtype.name} to a negative integer power: cast to a float dtype first")
                n = int(x)
                return a._in_float32(lambda af: af._pow_int(n)) if dtypes.is_float(a.dtype) else a._pow_int(n)
            if x == 0.5:
                return a.sqrt()
        if not dtypes.is_float(a.dtype):
            return a._pow_int_tensor(b)
        return a._in_float32(lambda af: af._pow_float(b.cast(af.dtype)))

    def _pow_int(self, n: int) -> Tensor:
        """self ** n for a Python int n, by square and multiply."""
        result: Tensor | None = None
        base = self._t()
        k = abs(n)
        while k:
            if k & 1:
                result = base if result is None else _wrapped(result * base)
            k >>= 1
            if k:
                base = _wrapped(base * base)
        out = self._const(1) if result is None else result
        return out.reciprocal() if n < 0 else out

    def _pow_int_tensor(self, e: Tensor) -> Tensor:
        """self ** e for int tensors: square and multiply over every bit of e; negative e gives 1, +-1 or 0."""
        bits = 8 * e.dtype.itemsize - (0 if dtypes.is_unsigned(e.dtype) else 1)
        ep = (e < 0).where(0, e)
        result, base = self._const(1), self._t()
        for i in range(bits):
            result = _wrapped((((ep >> i) & 1) != 0).where(result * base, result))
            base = _wrapped(base * base)
        if dtypes.is_unsigned(e.dtype):
            return result
        minus_one = ((e & 1) != 0).where(-1, 1).cast(self.dtype)
        x = self._t()
        neg = (x == 1).where(1, (x == -1).where(minus_one, 0))
        return (e < 0).where(neg, result)

    def _pow_float(self, b: Tensor) -> Tensor:
        a = self._t()
        zero = a == 0
        mag = (zero.where(1.0, a.abs()).log2() * b).exp2()
        mag = zero.where((b > 0).where(0.0, (b == 0).where(1.0, math.inf)), mag)
        int_exp = b.trunc() == b
        half = b * 0.5
        odd = int_exp & (half.trunc() != half)
        out = (a < 0).where(int_exp.where(odd.where(-mag, mag), math.nan), mag)
        # 1 ** anything, anything ** 0 and (-1) ** +-inf are 1
        one = (b == 0) | (a == 1) | ((a == -1) & b.isinf())
        return one.where(1.0, out)

    def copysign(self, x: Tensor | Scalar) -> Tensor:
        """|self| with the sign of x (the sign bit, so -0.0 counts as negative). Ints keep their dtype.

        >>> Tensor([1.0, -2.0, 3.0]).copysign(Tensor([-1.0, 1.0, -0.0])).tolist()
        [-1.0, 2.0, -3.0]"""
        a, b = self._broadcasted(x)
        if dtypes.is_float(a.dtype):
            wide = b.cast(dtypes.float32) if b.dtype.itemsize < 4 else b  # widening keeps the sign bit
            negative = wide._bitcast_same_size(dtypes.int64 if wide.dtype.itemsize == 8 else dtypes.int32) < 0
        else:
            negative = b < 0
        mag = a.abs()
        return negative.where(-mag, mag)

    def lerp(self, end: Tensor | Scalar, weight: Tensor | Scalar) -> Tensor:
        """self + (end - self) * weight.

        >>> Tensor([0.0, 10.0]).lerp(20.0, 0.25).tolist()
        [5.0, 12.5]"""
        a, e = self._broadcasted(end)
        return a + (e - a) * weight

    def isclose(self, x: Tensor | Scalar, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> Tensor:
        """|self - x| <= atol + rtol * |x| elementwise (infinities are close only to themselves).

        >>> Tensor([1.0, 1.1, float("nan")]).isclose(Tensor([1.0, 1.0, float("nan")]), equal_nan=True).tolist()
        [True, False, True]"""
        a, b = self._broadcasted(x)
        close = a == b
        af, bf = a._float(), b._float()
        finite = af.isfinite() & bf.isfinite()
        close = close | (finite & ((af - bf).abs() <= (bf.abs() * rtol + atol)))
        if equal_nan:
            close = close | (af.isnan() & bf.isnan())
        return close

    def allclose(self, x: Tensor | Scalar, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> bool:
        """Whether every element isclose.

        >>> Tensor([1.0, 2.0]).allclose(Tensor([1.0, 2.0 + 1e-6]))
        True"""
        return bool(self.isclose(x, rtol, atol, equal_nan)._t().all().item())

    def maximum(self, x: Tensor | Scalar) -> Tensor:
        """Elementwise max of self and x, broadcasting; a NaN in either propagates (as numpy and torch).

        >>> Tensor([1, 5]).maximum(Tensor([3, 2])).tolist(), Tensor([float("nan"), 1.0]).maximum(0.0).tolist()
        ([3, 5], [nan, 1.0])"""
        return self._binop(Ops.MAX, x)

    def minimum(self, x: Tensor | Scalar) -> Tensor:
        """Elementwise min of self and x, broadcasting; a NaN in either propagates.

        >>> Tensor([1, 5]).minimum(Tensor([3, 2])).tolist()
        [1, 2]"""
        a, b = self._broadcasted(x)
        if a.dtype == dtypes.bool:
            return a & b
        if dtypes.is_float(a.dtype):
            return -((-a).maximum(-b))
        return ~((~a).maximum(~b))  # bitwise not reverses the order of ints without wrapping (negation would)

    def where(self, x: Tensor | Scalar, y: Tensor | Scalar) -> Tensor:
        """Pick `x` where self is true, else `y`.

        >>> Tensor([True, False]).where(1.0, -1.0).tolist()
        [1.0, -1.0]"""
        cond = self.cast(dtypes.bool)
        if isinstance(x, TensorBase):
            xt, yt = x._broadcasted(y)
        elif isinstance(y, TensorBase):
            yt, xt = y._broadcasted(x)
        else:
            dt = least_upper_dtype(weak_dtype(x), weak_dtype(y))
            dt = dtypes.default_float if dt == dtypes.weakfloat else dtypes.default_int if dt == dtypes.weakint else dt
            xt, yt = cond._const(x, dt), cond._const(y, dt)
        shape = broadcast_shape(broadcast_shape(cond.shape, xt.shape), yt.shape)
        cond, xt, yt = cond._broadcast_to(shape), xt._broadcast_to(shape), yt._broadcast_to(shape)
        return self._new(UOp(Ops.WHERE, xt.dtype, (cond.uop, xt.uop, yt.uop)))

    # ---- operators ----
    def __neg__(self) -> Tensor:
        return self.neg()

    def __add__(self, x: Tensor | Scalar) -> Tensor:
        return self.add(x)

    def __radd__(self, x: Scalar) -> Tensor:
        return self.add(x, True)

    def __sub__(self, x: Tensor | Scalar) -> Tensor:
        return self.sub(x)

    def __rsub__(self, x: Scalar) -> Tensor:
        return self.sub(x, True)

    def __mul__(self, x: Tensor | Scalar) -> Tensor:
        return self.mul(x)

    def __rmul__(self, x: Scalar) -> Tensor:
        return self.mul(x, True)

    def __truediv__(self, x: Tensor | Scalar) -> Tensor:
        return self.div(x)

    def __rtruediv__(self, x: Scalar) -> Tensor:
        return self.div(x, True)

    def __floordiv__(self, x: Tensor | Scalar) -> Tensor:
        return self.idiv(x)

    def __rfloordiv__(self, x: Scalar) -> Tensor:
        return self.idiv(x, True)

    def __mod__(self, x: Tensor | Scalar) -> Tensor:
        return self.mod(x)

    def __rmod__(self, x: Scalar) -> Tensor:
        return self.mod(x, True)

    def __pow__(self, x: Tensor | Scalar) -> Tensor:
        return self.pow(x)

    def __rpow__(self, x: Scalar) -> Tensor:
        return self.pow(x, True)
