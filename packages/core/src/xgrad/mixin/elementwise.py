"""Elementwise math, comparisons, bitwise ops and the Python operators."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from xgrad.dtype import DType, dtypes, least_upper_dtype, least_upper_float, to_dtype
from xgrad.errors import DTypeError, ShapeError, XgradError
from xgrad.helpers import DISALLOW_BROADCAST
from xgrad.mixin.base import TensorBase
from xgrad.mixin.common import Scalar, broadcast_shape, weak_dtype
from xgrad.mixin.movement import MovementMixin
from xgrad.uop.ops import Ops, UOp

if TYPE_CHECKING:
    from xgrad.tensor import Tensor


class ElementwiseMixin(MovementMixin):
    __slots__ = ()

    # ---- elementwise ----
    def _broadcasted(self, y: Tensor | Scalar, reverse: bool = False) -> tuple[Tensor, Tensor]:
        x: Tensor = self._t()
        if not isinstance(y, TensorBase):
            if not isinstance(y, (bool, int, float)):
                raise DTypeError(f"cannot combine a Tensor with {type(y).__name__}")
            out_dt = least_upper_dtype(x.dtype, weak_dtype(y))
            x = x.cast(out_dt)
            y_t = x._const(y)
        else:
            y_t = y
            if x.device != y_t.device:
                raise XgradError(f"tensors are on different devices: {x.device} and {y_t.device}; move one with .to()")
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
        return self._new(a.uop.alu(op, b.uop))

    def _unop(self, op: Ops) -> Tensor:
        return self._new(UOp(op, self.dtype, (self.uop,)))

    def _float(self) -> Tensor:
        return self.cast(least_upper_float(self.dtype))

    def cast(self, dtype: DType | str) -> Tensor:
        dt = to_dtype(dtype)
        return self._t() if dt == self.dtype else self._new(self.uop.cast(dt))

    def bitcast(self, dtype: DType | str) -> Tensor:
        dt = to_dtype(dtype)
        if dt.itemsize != self.dtype.itemsize:
            raise DTypeError(f"bitcast between {self.dtype.name} and {dt.name} needs equal item sizes")
        return self._t() if dt == self.dtype else self._new(self.uop.bitcast(dt))

    def neg(self) -> Tensor:
        return (
            self.logical_not()
            if self.dtype == dtypes.bool
            else self._unop(Ops.NEG)
            if dtypes.is_float(self.dtype)
            else self * -1
        )

    def exp2(self) -> Tensor:
        return self._float()._unop(Ops.EXP2)

    def log2(self) -> Tensor:
        return self._float()._unop(Ops.LOG2)

    def _in_float32(self, fn: Callable[[Tensor], Tensor]) -> Tensor:
        """Compute a composed op in float32 when self is a narrower float, rounding once at the end (as torch)."""
        x = self._float()
        return fn(x.cast(dtypes.float32)).cast(x.dtype) if x.dtype.itemsize < 4 else fn(x)

    def exp(self) -> Tensor:
        return self._in_float32(lambda x: (x * (1 / math.log(2))).exp2())

    def log(self) -> Tensor:
        return self._in_float32(lambda x: x.log2() * math.log(2))

    def sqrt(self) -> Tensor:
        return self._float()._unop(Ops.SQRT)

    def rsqrt(self) -> Tensor:
        return self.sqrt().reciprocal()

    def reciprocal(self) -> Tensor:
        return self._float()._unop(Ops.RECIPROCAL)

    def sin(self) -> Tensor:
        return self._float()._unop(Ops.SIN)

    def cos(self) -> Tensor:
        return ((math.pi / 2) - self._float()).sin()

    def tan(self) -> Tensor:
        return self.sin() / self.cos()

    def trunc(self) -> Tensor:
        return self._unop(Ops.TRUNC) if dtypes.is_float(self.dtype) else self._t()

    def floor(self) -> Tensor:
        t = self.trunc()
        return (self < t).where(t - 1, t) if dtypes.is_float(self.dtype) else self._t()

    def ceil(self) -> Tensor:
        t = self.trunc()
        return (self > t).where(t + 1, t) if dtypes.is_float(self.dtype) else self._t()

    def square(self) -> Tensor:
        return self._t() * self._t()

    def abs(self) -> Tensor:
        return self._t() if dtypes.is_unsigned(self.dtype) or self.dtype == dtypes.bool else self.maximum(-self)

    def sign(self) -> Tensor:
        return (self > 0).where(1, 0).cast(self.dtype) - (self < 0).where(1, 0).cast(self.dtype)

    def relu(self) -> Tensor:
        return (self > 0).where(self._t(), 0)

    def sigmoid(self) -> Tensor:
        return (1 + (-self._float()).exp()).reciprocal()

    def tanh(self) -> Tensor:
        return 2.0 * (2.0 * self._float()).sigmoid() - 1.0

    def logical_not(self) -> Tensor:
        return self._new(self.cast(dtypes.bool).uop.alu(Ops.CMPNE, True))

    def add(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        return a._binop(Ops.OR if a.dtype == dtypes.bool else Ops.ADD, b)  # bool + bool is "or", as in numpy

    def sub(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        return a + (-b)

    def mul(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        return a._binop(Ops.AND if a.dtype == dtypes.bool else Ops.MUL, b)  # bool * bool is "and", as in numpy

    def div(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        return a._float()._binop(Ops.FDIV, b._float())

    def idiv(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """Floor division (Python semantics) for ints; floor(a/b) for floats."""
        a, b = self._broadcasted(x, reverse)
        if dtypes.is_float(a.dtype):
            return (a / b).floor()
        q = a._binop(Ops.IDIV, b)
        needs_fix = (a._binop(Ops.MOD, b) != 0) & ((a < 0) != (b < 0)) if not dtypes.is_unsigned(a.dtype) else None
        return q if needs_fix is None else needs_fix.where(q - 1, q)

    def mod(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """Remainder with the sign of the divisor (Python semantics)."""
        a, b = self._broadcasted(x, reverse)
        if dtypes.is_float(a.dtype):
            return a - (a / b).floor() * b
        r = a._binop(Ops.MOD, b)
        if dtypes.is_unsigned(a.dtype):
            return r
        return ((r != 0) & ((r < 0) != (b < 0))).where(r + b, r)

    def pow(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        if not isinstance(x, TensorBase) and not reverse and x == 2:
            return self._t() * self._t()
        af = a._float()
        mag = (af.abs().log2() * b._float()).exp2()
        # negative base: sign from the parity of an integral exponent, nan otherwise
        bf = b._float()
        is_int_exp = bf.trunc() == bf
        odd = (bf.abs() % 2) == 1
        signed = (af < 0).where(is_int_exp.where(odd.where(-mag, mag), math.nan), mag)
        out = (bf == 0).where(1.0, signed)
        return out if dtypes.is_float(a.dtype) else out.cast(a.dtype)

    def maximum(self, x: Tensor | Scalar) -> Tensor:
        return self._binop(Ops.MAX, x)

    def minimum(self, x: Tensor | Scalar) -> Tensor:
        a, b = self._broadcasted(x)
        if a.dtype == dtypes.bool:
            return a & b
        return -((-a).maximum(-b)) if not dtypes.is_unsigned(a.dtype) else (a < b).where(a, b)

    def where(self, x: Tensor | Scalar, y: Tensor | Scalar) -> Tensor:
        """Pick `x` where self is true, else `y`."""
        cond = self.cast(dtypes.bool)
        if isinstance(x, TensorBase):
            xt, yt = x._broadcasted(y)
        elif isinstance(y, TensorBase):
            yt, xt = y._broadcasted(x)
        else:
            dt = least_upper_dtype(weak_dtype(x), weak_dtype(y))
            dt = (
                dtypes.default_float()
                if dt == dtypes.weakfloat
                else dtypes.default_int()
                if dt == dtypes.weakint
                else dt
            )
            xt, yt = cond._const(x, dt), cond._const(y, dt)
        shape = broadcast_shape(broadcast_shape(cond.shape, xt.shape), yt.shape)
        cond, xt, yt = cond._broadcast_to(shape), xt._broadcast_to(shape), yt._broadcast_to(shape)
        return self._new(UOp(Ops.WHERE, xt.dtype, (cond.uop, xt.uop, yt.uop)))

    def _cmp(self, op: Ops, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        return self._new(a.uop.alu(op, b.uop))

    def __lt__(self, x: Tensor | Scalar) -> Tensor:
        return self._cmp(Ops.CMPLT, x)

    def __gt__(self, x: Tensor | Scalar) -> Tensor:
        return self._cmp(Ops.CMPLT, x, True)

    def __le__(self, x: Tensor | Scalar) -> Tensor:
        return (self > x).logical_not()

    def __ge__(self, x: Tensor | Scalar) -> Tensor:
        return (self < x).logical_not()

    def __eq__(self, x: Tensor | Scalar) -> Tensor:  # type: ignore[override]
        return self._cmp(Ops.CMPEQ, x)

    __hash__ = object.__hash__  # defining __eq__ would otherwise make tensors unhashable

    def __ne__(self, x: Tensor | Scalar) -> Tensor:  # type: ignore[override]
        return self._cmp(Ops.CMPNE, x)

    def _bitop(self, op: Ops, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        if dtypes.is_float(a.dtype):
            raise DTypeError(f"{op.name.lower()} is only for integer or bool tensors, not {a.dtype.name}")
        return a._binop(op, b)

    def bitwise_and(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        return self._bitop(Ops.AND, x, reverse)

    def bitwise_or(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        return self._bitop(Ops.OR, x, reverse)

    def bitwise_xor(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        return self._bitop(Ops.XOR, x, reverse)

    def lshift(self, x: Tensor | int, reverse: bool = False) -> Tensor:
        return self._bitop(Ops.SHL, x, reverse)

    def rshift(self, x: Tensor | int, reverse: bool = False) -> Tensor:
        return self._bitop(Ops.SHR, x, reverse)

    def bitwise_not(self) -> Tensor:
        if self.dtype == dtypes.bool:
            return self.logical_not()
        return self._bitop(Ops.XOR, -1 if not dtypes.is_unsigned(self.dtype) else int(dtypes.max(self.dtype)))

    # ---- operators ----
    def __neg__(self) -> Tensor:
        return self.neg()

    def __invert__(self) -> Tensor:
        return self.bitwise_not()

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

    def __and__(self, x: Tensor | Scalar) -> Tensor:
        return self.bitwise_and(x)

    def __rand__(self, x: Scalar) -> Tensor:
        return self.bitwise_and(x, True)

    def __or__(self, x: Tensor | Scalar) -> Tensor:
        return self.bitwise_or(x)

    def __ror__(self, x: Scalar) -> Tensor:
        return self.bitwise_or(x, True)

    def __xor__(self, x: Tensor | Scalar) -> Tensor:
        return self.bitwise_xor(x)

    def __rxor__(self, x: Scalar) -> Tensor:
        return self.bitwise_xor(x, True)

    def __lshift__(self, x: int) -> Tensor:
        return self.lshift(x)

    def __rshift__(self, x: int) -> Tensor:
        return self.rshift(x)
