"""Reductions (sum, max, min, mean) and the ops built on them (softmax, matmul)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from xgrad.dtype import DType, dtypes, sum_acc_dtype, to_dtype
from xgrad.errors import ShapeError
from xgrad.helpers import prod
from xgrad.mixin.elementwise import ElementwiseMixin
from xgrad.uop.ops import Ops

if TYPE_CHECKING:
    from xgrad.tensor import Tensor


class ReduceMixin(ElementwiseMixin):
    __slots__ = ()

    # ---- reductions ----
    def _reduce(self, op: Ops, axis: int | Sequence[int] | None, keepdim: bool) -> Tensor:
        axes = (
            tuple(range(self.ndim))
            if axis is None
            else tuple(self._axis(a) for a in ((axis,) if isinstance(axis, int) else axis))
        )
        if self.ndim == 0:
            return self._t()
        if op is Ops.MAX and any(self.shape[a] == 0 for a in axes):
            raise ShapeError(f"max over an empty axis of shape {self.shape} has no identity")
        out_shape = tuple(1 if i in axes else s for i, s in enumerate(self.shape))
        if self.numel() == 0:
            ident = 0 if op is Ops.ADD else 1
            ret = self._tensor_cls().full(out_shape, ident, device=self.device, dtype=self.dtype)
        else:
            ret = self._new(self.uop.reduce_axis(op, axes))
        return ret if keepdim else ret.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    def sum(self, axis: int | Sequence[int] | None = None, keepdim: bool = False, dtype: DType | None = None) -> Tensor:
        """>>> Tensor([[1, 2], [3, 4]]).sum(1).tolist()
        [3, 7]"""
        acc = to_dtype(dtype) if dtype is not None else sum_acc_dtype(self.dtype)
        ret = self.cast(acc)._reduce(Ops.ADD, axis, keepdim)
        keep_low_float = dtype is None and dtypes.is_float(self.dtype)
        return ret.cast(self.dtype) if keep_low_float else ret

    def max(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        return self._reduce(Ops.MAX, axis, keepdim)

    def min(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        if dtypes.is_unsigned(self.dtype) or self.dtype == dtypes.bool:
            return -((-self.cast(dtypes.int64 if self.dtype.itemsize >= 4 else dtypes.int32)).max(axis, keepdim)).cast(
                self.dtype
            )
        return -((-self).max(axis, keepdim))

    def mean(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        out = self._float().sum(axis, keepdim)
        n = prod(self.shape) // max(1, prod(out.shape)) if out.numel() else 0
        return out / n if n else out * math.nan

    def softmax(self, axis: int = -1) -> Tensor:
        x = self._float()
        e = (x - x.max(axis, keepdim=True)).exp()
        return e / e.sum(axis, keepdim=True)

    def matmul(self, w: Tensor) -> Tensor:
        if self.ndim == 0 or w.ndim == 0:
            raise ShapeError(f"matmul needs at least 1-d tensors, got {self.shape} and {w.shape}")
        if self.shape[-1] != w.shape[-min(w.ndim, 2)]:
            raise ShapeError(
                f"matmul shapes {self.shape} and {w.shape} do not fit: {self.shape[-1]} != {w.shape[-min(w.ndim, 2)]}"
            )
        x = self.reshape(self.shape[:-1] + (1,) * min(w.ndim - 1, 1) + self.shape[-1:])
        wt = w.reshape(w.shape[:-2] + (1,) * min(self.ndim - 1, 1) + w.shape[-min(w.ndim, 2) :]).transpose(
            -1, -min(w.ndim, 2)
        )
        return (x * wt).sum(-1)

    def __matmul__(self, x: Tensor) -> Tensor:
        return self.matmul(x)
