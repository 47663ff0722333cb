"""Comparisons, bitwise ops and their Python operators (`<`, `==`, `&`, `|`, `^`, `~`, `<<`, `>>`).

Comparisons give bool tensors; `<=`/`>=` on floats are false where either side is nan. Bitwise ops take ints or
bools (floats raise DTypeError)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xgrad.dtype import DType, dtypes, to_dtype
from xgrad.engine.realize import realize_base, reinterpret_memory
from xgrad.errors import DTypeError, ShapeError
from xgrad.mixin.base import TensorBase
from xgrad.mixin.common import Scalar
from xgrad.mixin.symbolic_shapes import as_size
from xgrad.uop.ops import Ops
from xgrad.uop.symshape import shape_str, sym_equal

if TYPE_CHECKING:
    from xgrad.tensor import Tensor


_UINT_OF_SIZE = {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}


class BitwiseMixin(TensorBase):
    __slots__ = ()

    def bitcast(self, dtype: DType | str) -> Tensor:
        """Reinterpret the bits as `dtype`. Between item sizes (as tinygrad's), the last axis scales by the ratio
        of the sizes, in little-endian byte order: float32 (..., n) -> uint16 (..., 2n); uint8 (..., 4n) ->
        float32 (..., n). The last axis may be symbolic.

        >>> Tensor([1.0]).bitcast(dtypes.int32).tolist()
        [1065353216]
        >>> Tensor([1.0]).bitcast(dtypes.uint16).tolist()
        [0, 16256]
        >>> Tensor([0, 0, 128, 63], dtype=dtypes.uint8).bitcast(dtypes.float32).tolist()
        [1.0]
        """
        dt = to_dtype(dtype)
        old, new = self.dtype.itemsize, dt.itemsize
        if dt != self.dtype and isinstance(self.device, str) and self.device.startswith("DISK"):
            return self._bitcast_disk(dt)
        if old == new:
            return self._t()._bitcast_same_size(dt)
        if old not in _UINT_OF_SIZE or new not in _UINT_OF_SIZE:
            raise DTypeError(f"bitcast between {self.dtype.name} and {dt.name}: no unsigned int holds their items")
        if self.ndim == 0:
            raise ShapeError(
                f"bitcast of a 0-d {self.dtype.name} tensor to {dt.name} changes the item count; reshape it to (1,) "
                "first"
            )
        lead, n = self.shape[:-1], self.shape[-1]
        bits = self._t().bitcast(_UINT_OF_SIZE[old]) if self.dtype != _UINT_OF_SIZE[old] else self._t()
        narrow, wide = _UINT_OF_SIZE[min(old, new)], _UINT_OF_SIZE[max(old, new)]
        if old > new:  # each item splits into `ratio` narrower ones, the low bytes first
            ratio = old // new
            mask = (1 << (8 * new)) - 1
            parts = [((bits >> (8 * new * k)) & mask).cast(narrow) for k in range(ratio)]
            out = parts[0].stack(*parts[1:], dim=-1).reshape(*lead, n * ratio)
        else:  # `ratio` items join into one wider item
            ratio = new // old
            count: Any = as_size(n // ratio)
            if not sym_equal(count * ratio, n):
                raise ShapeError(
                    f"bitcast of shape {shape_str(self.shape)} from {self.dtype.name} to {dt.name}: the last axis "
                    f"must be a multiple of {ratio}"
                )
            grouped = bits.reshape(*lead, count, ratio)
            out = grouped[..., 0].cast(wide)
            for k in range(1, ratio):
                out = out | (grouped[..., k].cast(wide) << (8 * old * k))
        return out if dt == out.dtype else out.bitcast(dt)

    def _bitcast_disk(self, dt: DType) -> Tensor:
        """A DISK tensor's bitcast: the same bytes of the file seen as `dt` (a view to read and assign in place, as
        tinygrad's); the tensor must cover one contiguous run of the file, its last axis a whole number of items."""
        if self.ndim == 0 or (self.shape[-1] * self.dtype.itemsize) % dt.itemsize:
            raise ShapeError(
                f"bitcast of a DISK tensor of shape {shape_str(self.shape)} from {self.dtype.name} to {dt.name}: the "
                f"last axis must hold a whole number of {dt.name} items"
            )
        realize_base(self._t())
        shape = (*self.shape[:-1], self.shape[-1] * self.dtype.itemsize // dt.itemsize)
        return self._tensor_cls()(reinterpret_memory(self.uop, dt)).reshape(shape)

    def _cmp(self, op: Ops, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._t()._broadcasted(x, reverse)
        return self._new(a.uop.alu(op, b.uop))

    def __lt__(self, x: Tensor | Scalar) -> Tensor:
        return self._cmp(Ops.CMPLT, x)

    def __gt__(self, x: Tensor | Scalar) -> Tensor:
        return self._cmp(Ops.CMPLT, x, True)

    def __le__(self, x: Tensor | Scalar) -> Tensor:
        a, b = self._t()._broadcasted(x)
        return (a < b) | (a == b) if dtypes.is_float(a.dtype) else (a > b).logical_not()  # nan <= x is False

    def __ge__(self, x: Tensor | Scalar) -> Tensor:
        a, b = self._t()._broadcasted(x)
        return (a > b) | (a == b) if dtypes.is_float(a.dtype) else (a < b).logical_not()

    def __eq__(self, x: Tensor | Scalar) -> Tensor:  # type: ignore[override]
        return self._cmp(Ops.CMPEQ, x)

    __hash__ = object.__hash__  # defining __eq__ would otherwise make tensors unhashable

    def __ne__(self, x: Tensor | Scalar) -> Tensor:  # type: ignore[override]
        return self._cmp(Ops.CMPNE, x)

    def _bitop(self, op: Ops, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._t()._broadcasted(x, reverse)
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
            return self._t().logical_not()
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
