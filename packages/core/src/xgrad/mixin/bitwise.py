"""Comparisons, bitwise ops and their Python operators (`<`, `==`, `&`, `|`, `^`, `~`, `<<`, `>>`).

Comparisons give bool tensors; `<=`/`>=` on floats are false where either side is nan. Bitwise ops take ints or
bools (floats raise DTypeError)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from xgrad.dtype import dtypes
from xgrad.errors import DTypeError
from xgrad.mixin.common import Scalar
from xgrad.mixin.elementwise import ElementwiseMixin
from xgrad.uop.ops import Ops

if TYPE_CHECKING:
    from xgrad.tensor import Tensor


class BitwiseMixin(ElementwiseMixin):
    __slots__ = ()

    def _cmp(self, op: Ops, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        return self._new(a.uop.alu(op, b.uop))

    def __lt__(self, x: Tensor | Scalar) -> Tensor:
        return self._cmp(Ops.CMPLT, x)

    def __gt__(self, x: Tensor | Scalar) -> Tensor:
        return self._cmp(Ops.CMPLT, x, True)

    def __le__(self, x: Tensor | Scalar) -> Tensor:
        a, b = self._broadcasted(x)
        return (a < b) | (a == b) if dtypes.is_float(a.dtype) else (a > b).logical_not()  # nan <= x is False

    def __ge__(self, x: Tensor | Scalar) -> Tensor:
        a, b = self._broadcasted(x)
        return (a > b) | (a == b) if dtypes.is_float(a.dtype) else (a < b).logical_not()

    def __eq__(self, x: Tensor | Scalar) -> Tensor:  # type: ignore[override]
        return self._cmp(Ops.CMPEQ, x)

    __hash__ = object.__hash__  # defining __eq__ would otherwise make tensors unhashable

    def __ne__(self, x: Tensor | Scalar) -> Tensor:  # type: ignore[override]
        return self._cmp(Ops.CMPNE, x)

    def _bitop(self, op: Ops, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        if dtypes.is_float(a.dtype):
            raise DTypeError(f"{op.name.lower()} is only for integer or bool tensors, not {a.dtype.name}")
        return a._alu(op, b)

    def bitwise_and(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """Bitwise and of ints or bools (floats raise DTypeError).

        >>> Tensor([12]).bitwise_and(10).tolist()
        [8]"""
        return self._bitop(Ops.AND, x, reverse)

    def bitwise_or(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """Bitwise or of ints or bools.

        >>> Tensor([12]).bitwise_or(10).tolist()
        [14]"""
        return self._bitop(Ops.OR, x, reverse)

    def bitwise_xor(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """Bitwise xor of ints or bools.

        >>> Tensor([12]).bitwise_xor(10).tolist()
        [6]"""
        return self._bitop(Ops.XOR, x, reverse)

    def lshift(self, x: Tensor | int, reverse: bool = False) -> Tensor:
        """Shift the bits left by x (ints only).

        >>> Tensor([1, 3]).lshift(2).tolist()
        [4, 12]"""
        return self._bitop(Ops.SHL, x, reverse)

    def rshift(self, x: Tensor | int, reverse: bool = False) -> Tensor:
        """Shift the bits right by x (ints only).

        >>> Tensor([8, 12]).rshift(2).tolist()
        [2, 3]"""
        return self._bitop(Ops.SHR, x, reverse)

    def bitwise_not(self) -> Tensor:
        """Flip every bit (logical not for bool).

        >>> Tensor([0, 5]).bitwise_not().tolist()
        [-1, -6]"""
        if self.dtype == dtypes.bool:
            return self.logical_not()
        return self._bitop(Ops.XOR, -1 if not dtypes.is_unsigned(self.dtype) else int(dtypes.max(self.dtype)))

    # ---- operators ----
    def __invert__(self) -> Tensor:
        return self.bitwise_not()

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
