"""Data-dependent selection without a gather primitive: gather, scatter, scatter_reduce, masked_fill, masked_select,
nonzero and one_hot. Each compares an index with `arange` to get a one-hot mask, then picks with `where` and reduces
over the one-hot axis, so every op is built of primitives and autograd covers it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from xgrad.dtype import DType, dtypes
from xgrad.errors import ArgumentError, DeviceMismatchError, DTypeError, ShapeError
from xgrad.helpers import prod
from xgrad.mixin.base import TensorBase
from xgrad.mixin.common import Scalar, broadcast_shape
from xgrad.uop.ops import Ops, UOp


class ScatterReduceError(ArgumentError, TypeError):
    """`scatter(reduce=...)` got a name it does not know: a `TypeError` as tinygrad's (and an `ArgumentError`)."""


if TYPE_CHECKING:
    from xgrad.tensor import Tensor

SCATTER_REDUCES = ("sum", "prod", "mean", "amax", "amin")


class GatherMixin(TensorBase):
    __slots__ = ()

    # ---- helpers ----
    def _scalar(self, value: Scalar, dtype: DType | None = None) -> Tensor:
        """A 0-d constant on self's device (broadcasts against anything)."""
        return self._new(UOp.const(dtype or self.dtype, value, self.device, ()))

    def _pick(self, mask: Tensor, axis: int) -> Tensor:
        """Sum of self over `axis` where `mask` holds (one element at most is expected), in self's dtype."""
        return mask.where(self._t(), self._scalar(0)).sum(axis).cast(self.dtype)

    def _one_hot_mask(self, n: int) -> Tensor:
        """Bool mask of shape self.shape + (n,): True where the last index equals self."""
        return self._t().unsqueeze(-1) == self._tensor_cls().arange(n, device=self.device)

    def _check_index(self, index: Tensor, what: str) -> None:
        if not dtypes.is_int(index.dtype) or index.dtype == dtypes.bool:
            raise DTypeError(f"{what} index must have an integer dtype, not {index.dtype.name}; cast it with .int()")
        if index.device != self.device:
            raise DeviceMismatchError(
                f"{what} index is on {index.device}, the tensor on {self.device}; move it with .to()"
            )

    def _inclusive_count(self) -> Tensor:
        """For a 1-d tensor of 0/1 ints: element i holds the sum of elements 0..i (quadratic work, no memory)."""
        n = self.shape[0]
        if n == 0:
            return self._t()
        return self._t().pad(((n - 1, 0),)).unfold(0, n, 1).sum(-1)

    # ---- gather / scatter ----
    def gather(self, dim: int, index: Tensor) -> Tensor:
        """Pick along `dim`: `out[i][j] = self[index[i][j]][j]` for dim 0. `index` has self's number of axes and is no
        larger on the other axes; out-of-range indices read 0.

        >>> Tensor([[1, 2], [3, 4]]).gather(1, Tensor([[1], [0]])).tolist()
        [[2], [3]]
        """
        self._check_index(index, "gather")
        if self.ndim == 0:
            return self._t().reshape(1).gather(0, index.reshape(1)).reshape(())
        d = self._axis(dim)
        if index.ndim != self.ndim or any(i > s for k, (i, s) in enumerate(zip(index.shape, self.shape)) if k != d):
            raise ShapeError(
                f"gather index of shape {index.shape} does not fit {self.shape} along dim {d}: it needs "
                f"{self.ndim} axes, each no larger than self's except dim {d}"
            )
        x = self._t().shrink(tuple(None if k == d else (0, i) for k, i in enumerate(index.shape)))
        return x.unsqueeze(-1).transpose(d, -1)._pick(index._one_hot_mask(self.shape[d]), -1)

    def _scatter_masks(self, dim: int, index: Tensor, src: Tensor | Scalar, what: str) -> tuple[Tensor, Tensor, int]:
        """(mask, values, k): mask[t..., j] says index element j along `dim` (other coordinates those of t) lands on
        target t; values[t..., j] is the src element it carries. Both have shape self.shape + (k,) where k is
        index.shape[dim]."""
        self._check_index(index, what)
        d = self._axis(dim) if self.ndim else 0
        if isinstance(src, (bool, int, float)):
            src = self._scalar(src)._broadcast_to(index.shape)
        if src.dtype != self.dtype:
            raise DTypeError(f"{what}: src has dtype {src.dtype.name}, self {self.dtype.name}; cast src with .cast()")
        if index.ndim != self.ndim or src.ndim != self.ndim:
            raise ShapeError(f"{what}: self {self.shape}, index {index.shape} and src {src.shape} need equal ranks")
        if self.ndim == 0:
            mask, vals, k = self._t().reshape(1)._scatter_masks(0, index.reshape(1), src.reshape(1), what)
            return mask.reshape(mask.shape[1:]), vals.reshape(vals.shape[1:]), k
        bad = any(i > s for i, s in zip(index.shape, src.shape)) or any(
            i > s for k, (i, s) in enumerate(zip(index.shape, self.shape)) if k != d
        )
        if bad:
            raise ShapeError(
                f"{what}: index {index.shape} must be no larger than src {src.shape} on every axis and no larger than "
                f"self {self.shape} on every axis but dim {d}"
            )
        grow = tuple((0, 0) if k == d else (0, s - i) for k, (i, s) in enumerate(zip(index.shape, self.shape)))
        mask = index._one_hot_mask(self.shape[d]).transpose(d, -1).pad(grow + ((0, 0),))
        vals = src.shrink(tuple((0, i) for i in index.shape)).unsqueeze(-1).transpose(d, -1).pad(grow + ((0, 0),))
        return mask, vals, index.shape[d]

    def scatter(self, dim: int, index: Tensor, src: Tensor | Scalar, reduce: str | None = None) -> Tensor:
        """Write `src` into a copy of self at `index` along `dim`: `out[index[i][j]][j] = src[i][j]` for dim 0.
        reduce 'add' / 'multiply' combine with the old value instead; with repeated indices and no reduce the last
        one wins.

        >>> Tensor([0, 0, 0]).scatter(0, Tensor([2, 0]), Tensor([5, 6])).tolist()
        [6, 0, 5]
        """
        if reduce not in (None, "add", "multiply"):
            raise ScatterReduceError(f"scatter reduce {reduce!r} is unknown; use None, 'add' or 'multiply'")
        mask, vals, k = self._scatter_masks(dim, index, src, "scatter")
        if k == 0:
            return self._t()
        if reduce == "add":
            return self._t() + vals._pick(mask, -1)
        if reduce == "multiply":
            return self._t() * mask.where(vals, vals._scalar(1))._reduce(Ops.MUL, -1, False)
        order = self._tensor_cls().arange(k, device=self.device)
        last = mask.where(order, -1).max(-1, keepdim=True)
        return (last >= 0).squeeze(-1).where(vals._pick(mask & (order == last), -1), self._t())

    def scatter_reduce(self, dim: int, index: Tensor, src: Tensor, reduce: str, include_self: bool = True) -> Tensor:
        """Combine the `src` values landing on each place of self (as `scatter`) with `reduce`: 'sum', 'prod',
        'mean', 'amax' or 'amin'; `include_self` counts self's old value as one of them.

        >>> Tensor([1, 1, 1]).scatter_reduce(0, Tensor([0, 0, 2]), Tensor([5, 6, 7]), "sum").tolist()
        [12, 1, 8]
        """
        if reduce not in SCATTER_REDUCES:
            raise ArgumentError(f"scatter_reduce reduce {reduce!r} is unknown; use one of {', '.join(SCATTER_REDUCES)}")
        mask, vals, k = self._scatter_masks(dim, index, src, "scatter_reduce")
        if k == 0:
            return self._t()
        hit = mask.cast(dtypes.int32).sum(-1)
        has = hit > 0
        x = self._t()
        if reduce == "sum" or reduce == "mean":
            total = vals._pick(mask, -1)
            if include_self:
                total = total + x
            if reduce == "sum":
                return has.where(total, x)
            count = (hit + 1 if include_self else hit.maximum(1)).cast(self.dtype)
            return has.where(total / count if dtypes.is_float(self.dtype) else total // count, x)
        if reduce == "prod":
            red = mask.where(vals, vals._scalar(1))._reduce(Ops.MUL, -1, False)
            return has.where(red * x if include_self else red, x)
        if reduce == "amax":
            red = mask.where(vals, vals._scalar(self.dtype.min)).max(-1)
            return has.where(red.maximum(x) if include_self else red, x)
        red = mask.where(vals, vals._scalar(self.dtype.max)).min(-1)
        return has.where(red.minimum(x) if include_self else red, x)

    # ---- masks ----
    def masked_fill(self, mask: Tensor, value: Tensor | Scalar) -> Tensor:
        """self where `mask` is false, `value` (cast to self's dtype) where it is true.

        >>> Tensor([1, 2, 3]).masked_fill(Tensor([True, False, True]), 0).tolist()
        [0, 2, 0]
        """
        fill = self._scalar(value) if isinstance(value, (bool, int, float)) else value.cast(self.dtype)
        return mask.where(fill, self._t())

    def nonzero(self, size: int | None = None, fill_value: int = 0) -> Tensor:
        """The indices of the nonzero elements, one row of coordinates each: shape (count, ndim). With `size` the
        result has exactly `size` rows (cut, or filled with `fill_value`) and nothing is read back from the device;
        without it the count is read from the device.

        >>> Tensor([[1, 0], [0, 2]]).nonzero().tolist()
        [[0, 0], [1, 1]]
        """
        flat = (self._t() != 0).flatten() if self.dtype != dtypes.bool else self._t().flatten()
        n, dt = flat.shape[0], dtypes.default_int
        if n == 0 or self.ndim == 0:
            table = self._scalar(0, dt).reshape(1, 1).expand(n, self.ndim)
        else:
            flat_pos = self._tensor_cls().arange(n, device=self.device, dtype=dt)
            coords = [(flat_pos // prod(self.shape[i + 1 :])) % s for i, s in enumerate(self.shape)]
            table = coords[0].stack(*coords[1:], dim=1)
        return flat._select_rows(table, size, fill_value)

    def _select_rows_by_match(self, table: Tensor, size: int | None, fill_value: Scalar) -> Tensor:
        """Rows of `table` (shape (n, k)) where the 1-d bool self is true, in order; `size` rows exactly. Each result
        row is matched against every row of `table` (n x rows work): what `_select_rows` uses for short inputs."""
        n = self.shape[0]
        count = self._t().cast(dtypes.int32)
        total = count.sum()
        rows = int(total.item()) if size is None else size
        if size is not None and size < 0:
            raise ShapeError(f"size must be non-negative, got {size}")
        rank = count._inclusive_count() - 1
        slot = self._tensor_cls().arange(rows, device=self.device, dtype=dtypes.int32)
        match = self._t().reshape(1, n) & (rank.reshape(1, n) == slot.reshape(rows, 1))
        picked = table.reshape(1, n, table.shape[1])._pick(match.unsqueeze(-1), 1)
        return (slot < total).reshape(rows, 1).where(picked, table._scalar(fill_value))

    def masked_select(self, mask: Tensor, size: int | None = None, fill_value: Scalar = 0) -> Tensor:
        """The elements where `mask` (broadcast with self) is true, as a 1-d tensor. With `size` the result has exactly
        `size` elements (cut, or filled with `fill_value`); without it the count is read from the device.

        >>> Tensor([1, 2, 3]).masked_select(Tensor([True, False, True])).tolist()
        [1, 3]
        """
        if mask.dtype != dtypes.bool:
            raise DTypeError(f"masked_select needs a bool mask, not {mask.dtype.name}")
        x, m = self._broadcasted_pair(mask)
        return m.flatten()._select_rows(x.flatten().unsqueeze(-1), size, fill_value).reshape(-1)

    def _broadcasted_pair(self, other: Tensor) -> tuple[Tensor, Tensor]:
        shape = broadcast_shape(self.shape, other.shape)
        return self._broadcast_to(shape), other._broadcast_to(shape)

    def one_hot(self, num_classes: int = -1) -> Tensor:
        """One-hot encoding of an int tensor: a new last axis of `num_classes` (-1: max + 1, read from the device).

        >>> Tensor([0, 2]).one_hot(3).tolist()
        [[1, 0, 0], [0, 0, 1]]
        """
        if not dtypes.is_int(self.dtype) or self.dtype == dtypes.bool:
            raise DTypeError(f"one_hot needs an integer tensor, not {self.dtype.name}")
        if num_classes == -1:
            num_classes = int(self._t().max().item()) + 1 if self.numel() else 0
        if num_classes < 0:
            raise ArgumentError(f"one_hot num_classes must be -1 or non-negative, got {num_classes}")
        return self._one_hot_mask(num_classes).cast(dtypes.default_int)
