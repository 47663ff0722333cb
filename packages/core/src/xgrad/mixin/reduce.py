"""Reductions (sum, prod, max, min, any, all), the statistics and softmax family built on them, arg-reductions,
the cumulative scans, and matmul.

Scans work on windows: output i reduces the inputs j <= i, an (n, n) masked reduction that fuses into one kernel
(O(n^2) work). Axes longer than `_SCAN_BLOCK` are scanned in blocks of that size, then the block totals are scanned
(recursively) and folded back in, which keeps the work at O(n * _SCAN_BLOCK).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from xgrad.dtype import DType, dtypes, sum_acc_dtype, to_dtype
from xgrad.errors import ShapeError
from xgrad.helpers import DISALLOW_BROADCAST, prod
from xgrad.mixin.base import TensorBase
from xgrad.mixin.common import broadcast_shape
from xgrad.mixin.unary import _logaddexp
from xgrad.uop.ops import Ops, UOp

if TYPE_CHECKING:
    from xgrad.tensor import Tensor

Axis = int | Sequence[int] | None
ScanKind = Literal["sum", "prod", "max", "logsumexp"]
_SCAN_BLOCK = 256
_SELECT_MAX_N = 2048  # cummax/cummin route the gradient to the returned index (O(n^2)) up to this length


def _acc_dtype(dt: DType) -> DType:
    """The accumulator of sums and products: bool and ints in at least int32 (unsigned: uint32), floats in at
    least float32."""
    return dtypes.int32 if dt == dtypes.bool else sum_acc_dtype(dt)


def _matmul_uop(x: UOp, w: UOp, x_shape: tuple[int, ...], w_shape: tuple[int, ...], k: int) -> UOp:
    """The graph `(x.reshape(x_shape) * w.reshape(w_shape).transpose(-1, k)).sum(-1)` builds through Tensors, node
    for node (hash-consing makes it the same object), without the Tensors: for same-dtype, same-device operands of
    a dtype that accumulates in itself, with nonzero static sizes (the Tensor route's checks and casts are no-ops)."""
    order = list(range(len(w_shape)))
    order[-1], order[k] = order[k], order[-1]
    wt_shape = tuple(w_shape[i] for i in order)
    shape = broadcast_shape(x_shape, wt_shape)
    xu, wu = (
        u.reshape((1,) * (len(shape) - len(s)) + s).expand(shape)
        for u, s in ((x.reshape(x_shape), x_shape), (w.reshape(w_shape).permute(tuple(order)), wt_shape))
    )
    return xu.alu(Ops.MUL, wu).reduce_axis(Ops.ADD, (len(shape) - 1,)).reshape(shape[:-1])


def _scan_identity(x: Tensor, kind: ScanKind) -> float | int | bool:
    if kind == "sum":
        return 0
    if kind == "prod":
        return 1
    if dtypes.is_float(x.dtype):
        return -math.inf
    return False if x.dtype == dtypes.bool else dtypes.min(x.dtype)


def _scan_window(x: Tensor, kind: ScanKind) -> Tensor:
    """The inclusive scan of x along its last axis: out[..., i] reduces x[..., j] for j <= i."""
    n = x.shape[-1]
    xw = x.unsqueeze(-2).expand(*x.shape[:-1], n, n)  # xw[..., i, j] = x[..., j]
    pos = x._tensor_cls().arange(n, device=x.device, dtype=dtypes.int32)
    masked = (pos.reshape(n, 1) >= pos.reshape(1, n)).where(xw, _scan_identity(x, kind))
    if kind == "sum":
        return masked.sum(-1, dtype=x.dtype)
    if kind == "prod":
        return masked.prod(-1, dtype=x.dtype)
    if kind == "max":
        return masked.max(-1)
    return masked.logsumexp(-1)


def _combine(a: Tensor, b: Tensor, kind: ScanKind) -> Tensor:
    if kind == "sum":
        return a + b
    if kind == "prod":
        return a * b
    if kind == "max":
        return a.maximum(b)
    return _logaddexp(a, b)


def _scan_last(x: Tensor, kind: ScanKind) -> Tensor:
    """The inclusive scan along the last axis, in blocks when the axis is long."""
    n = x.shape[-1]
    if n <= _SCAN_BLOCK:
        return _scan_window(x, kind)
    nb = -(-n // _SCAN_BLOCK)
    padded = x.pad(((0, 0),) * (x.ndim - 1) + ((0, nb * _SCAN_BLOCK - n),), value=_scan_identity(x, kind))
    inner = _scan_window(padded.reshape(*x.shape[:-1], nb, _SCAN_BLOCK), kind)
    totals = inner.shrink((*((0, s) for s in inner.shape[:-1]), (_SCAN_BLOCK - 1, _SCAN_BLOCK)))
    totals = totals.reshape(*x.shape[:-1], nb)
    # what the earlier blocks add to each block: the exclusive scan of the block totals
    before = _scan_last(totals, kind).pad(((0, 0),) * (x.ndim - 1) + ((1, -1),), value=_scan_identity(x, kind))
    out = _combine(inner, before.unsqueeze(-1), kind).reshape(*x.shape[:-1], nb * _SCAN_BLOCK)
    return out.shrink((*((0, s) for s in x.shape[:-1]), (0, n)))


class ReduceMixin(TensorBase):
    __slots__ = ()

    # ---- reductions ----
    def _reduce_axes(self, axis: Axis) -> tuple[int, ...]:
        if axis is None:
            return tuple(range(self.ndim))
        return tuple(self._axis(a) for a in ((axis,) if isinstance(axis, int) else axis))

    def _reduced_shape(self, axes: tuple[int, ...], keepdim: bool) -> tuple[int, ...]:
        return tuple(1 if i in axes else s for i, s in enumerate(self.shape) if keepdim or i not in axes)

    def _reduce(self, op: Ops, axis: Axis, keepdim: bool) -> Tensor:
        axes = self._reduce_axes(axis)
        if self.ndim == 0:
            return self._t()
        if op is Ops.MAX and any(self.shape[a] == 0 for a in axes):
            raise ShapeError(f"max over an empty axis of shape {self.shape} has no identity")
        if self.numel() == 0:
            out_shape = self._reduced_shape(axes, True)
            ident = 0 if op is Ops.ADD else 1
            ret = self._tensor_cls().full(out_shape, ident, device=self.device, dtype=self.dtype)
            return ret if keepdim else ret.reshape(self._reduced_shape(axes, False))
        reduced = self.uop.reduce_axis(op, axes)
        return self._new(reduced if keepdim else reduced.reshape(self._reduced_shape(axes, False)))

    def sum(self, axis: Axis = None, keepdim: bool = False, dtype: DType | str | None = None) -> Tensor:
        """The sum over `axis` (all axes if None). Bool and ints accumulate in at least int32 (unsigned: uint32) and
        return that; half/bfloat16 accumulate in float32 and return their own dtype.

        >>> Tensor([[1, 2], [3, 4]]).sum(1).tolist()
        [3, 7]"""
        acc = to_dtype(dtype) if dtype is not None else _acc_dtype(self.dtype)
        ret = self._t().cast(acc)._reduce(Ops.ADD, axis, keepdim)
        keep_low_float = dtype is None and dtypes.is_float(self.dtype)
        return ret.cast(self.dtype) if keep_low_float else ret

    def prod(self, axis: Axis = None, keepdim: bool = False, dtype: DType | str | None = None) -> Tensor:
        """The product over `axis`, accumulated like `sum`. The gradient is right with zeros in the input too.

        >>> Tensor([[1, 2], [3, 4]]).prod(1).tolist()
        [2, 12]"""
        acc = to_dtype(dtype) if dtype is not None else _acc_dtype(self.dtype)
        x = self._t().cast(acc)
        ret = x._reduce(Ops.MUL, axis, keepdim)
        return ret.cast(self.dtype) if dtype is None and dtypes.is_float(self.dtype) else ret

    def max(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """The largest element over `axis` (all axes if None); NaN if the axis holds one (as numpy and torch).

        >>> Tensor([[1, 5], [3, 4]]).max(0).tolist()
        [3, 5]"""
        return self._reduce(Ops.MAX, axis, keepdim)

    def min(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """The smallest element over `axis` (all axes if None); NaN if the axis holds one.

        >>> Tensor([[1, 5], [3, 4]]).min(0).tolist()
        [1, 4]"""
        # max of the order reversed: negation for floats, bitwise not for ints (negating the minimum would wrap)
        return self._order_reversed().max(axis, keepdim)._order_reversed()

    def any(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """Whether any element is nonzero (False over an empty axis).

        >>> Tensor([[0, 1], [0, 0]]).any(1).tolist()
        [True, False]"""
        axes = self._reduce_axes(axis)
        if any(self.shape[a] == 0 for a in axes):
            shape = self._reduced_shape(axes, keepdim)
            return self._tensor_cls().full(shape, False, device=self.device, dtype=dtypes.bool)
        return self._nonzero()._reduce(Ops.MAX, axis, keepdim)

    def _nonzero(self) -> Tensor:
        """self != 0 as bool; nan counts as nonzero (tested on its bits: not every backend compares nan by IEEE)."""
        if dtypes.is_float(self.dtype):
            return (self._t() != 0) | self._t().isnan()
        return self._t().cast(dtypes.bool)

    def all(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """Whether every element is nonzero (True over an empty axis).

        >>> Tensor([[1, 1], [0, 1]]).all(1).tolist()
        [True, False]"""
        return self._nonzero().logical_not().any(axis, keepdim).logical_not()

    def mean(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """The mean over `axis` (all axes if None), in a float dtype; nan over an empty axis. 16-bit floats are summed
        and divided in float32 (as torch), so a mean that fits the dtype never overflows on the way.

        >>> Tensor([[1, 2], [3, 5]]).mean(1).tolist()
        [1.5, 4.0]"""
        x = self._t()._float()
        out = x.sum(axis, keepdim, dtype=_acc_dtype(x.dtype))
        n = prod(self.shape) // max(1, prod(out.shape)) if out.numel() else 0
        return (out / n if n else out * math.nan).cast(x.dtype)

    def _var_acc(self, axis: Axis, keepdim: bool, correction: int | float) -> Tensor:
        """The variance in the accumulation dtype (float32 for 16-bit floats): the deviations, their squares and sum
        stay there, so small 16-bit data neither underflows nor loses its digits."""
        x = self._t()._float()
        x = x.cast(_acc_dtype(x.dtype))
        ss = (x - x.mean(axis, keepdim=True)).square().sum(axis, keepdim)
        n = prod(self.shape) // max(1, prod(ss.shape)) if ss.numel() else 0
        if n - correction <= 0:  # as torch: inf, or nan where ss is 0 (spelled out: some backends differ on x/0)
            return (ss > 0).where(math.inf, math.nan)
        return ss / (n - correction)

    def var(self, axis: Axis = None, keepdim: bool = False, correction: int | float = 1) -> Tensor:
        """The variance: the sum of squared deviations from the mean over (N - correction). N - correction <= 0
        gives inf or nan, as torch. 16-bit floats are computed in float32 and rounded once at the end.

        >>> Tensor([1.0, 2.0, 3.0, 4.0]).var().item()
        1.6666666269302368"""
        return self._var_acc(axis, keepdim, correction).cast(self._t()._float().dtype)

    def std(self, axis: Axis = None, keepdim: bool = False, correction: int | float = 1) -> Tensor:
        """The square root of `var` (computed like it).

        >>> Tensor([1.0, 3.0]).std().item()
        1.4142135381698608"""
        return self._var_acc(axis, keepdim, correction).sqrt().cast(self._t()._float().dtype)

    def var_mean(self, axis: Axis = None, keepdim: bool = False, correction: int | float = 1) -> tuple[Tensor, Tensor]:
        """(var, mean).

        >>> [t.item() for t in Tensor([1.0, 3.0]).var_mean()]
        [2.0, 2.0]"""
        return self.var(axis, keepdim, correction), self.mean(axis, keepdim)

    def std_mean(self, axis: Axis = None, keepdim: bool = False, correction: int | float = 1) -> tuple[Tensor, Tensor]:
        """(std, mean).

        >>> [round(t.item(), 4) for t in Tensor([1.0, 3.0]).std_mean()]
        [1.4142, 2.0]"""
        return self.std(axis, keepdim, correction), self.mean(axis, keepdim)

    def _safe_max(self, axis: Axis) -> Tensor:
        """The max (keepdim, no gradient), with infinities replaced by 0: what to subtract before exp."""
        m = self.max(axis, keepdim=True)._t().detach()
        return m.isinf().where(0.0, m)

    def logsumexp(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """log(sum(exp(x))) without overflow; -inf over an empty axis. 16-bit floats are computed in float32.

        >>> round(Tensor([1000.0, 1000.0]).logsumexp().item(), 3)
        1000.693"""
        x = self._t()._float()
        axes = self._reduce_axes(axis)
        if any(self.shape[a] == 0 for a in axes):
            shape = self._reduced_shape(axes, keepdim)
            return self._tensor_cls().full(shape, -math.inf, device=self.device, dtype=x.dtype)
        xa = x.cast(_acc_dtype(x.dtype))
        m = xa._safe_max(axis)
        out = ((xa - m).exp().sum(axis, keepdim=True).log() + m).cast(x.dtype)
        return out if keepdim else out.reshape(self._reduced_shape(axes, False))

    # ---- arg-reductions ----
    def argmax(self, axis: int | None = None, keepdim: bool = False) -> Tensor:
        """The index (int32) of the largest element along `axis` (of the flattened tensor if None); the first one on
        ties, the first NaN where there is one (as numpy and torch).

        >>> Tensor([[1, 3, 3], [4, 0, 4]]).argmax(1).tolist(), Tensor([[1, 3], [4, 0]]).argmax().item()
        ([1, 0], 2)"""
        if axis is None:
            flat = self._t().flatten().argmax(0)
            return flat.reshape((1,) * self.ndim) if keepdim else flat
        ax = self._axis(axis)
        if self.ndim == 0:
            return self._const(0, dtypes.int32)
        n = self.shape[ax]
        if n == 0:
            raise ShapeError(f"argmax over axis {axis} of size 0 (shape {self.shape}): there is no index to return")
        if isinstance(n, int) and n > dtypes.int32.max:  # as tinygrad, the index is int32 (torch: int64)
            raise ShapeError(
                f"argmax over an axis of {n:,} elements (shape {self.shape}): the int32 index it returns holds at "
                f"most {dtypes.int32.max:,} (2**31 - 1); take the argmax of parts of at most that many elements"
            )
        count_down = self._tensor_cls().arange(n, 0, -1, device=self.device, dtype=dtypes.int32)
        count_down = count_down.reshape(tuple(n if i == ax else 1 for i in range(self.ndim)))
        hit = self._t() == self.max(ax, keepdim=True)
        if dtypes.is_float(self.dtype):
            hit = hit | self._t().isnan()  # the max is NaN then, equal to nothing
        return n - hit.where(count_down, 0).max(ax, keepdim)

    def argmin(self, axis: int | None = None, keepdim: bool = False) -> Tensor:
        """The index (int32) of the smallest element; the first one on ties, the first NaN where there is one.

        >>> Tensor([[1, 0, 0], [4, 5, 4]]).argmin(1).tolist()
        [1, 0]"""
        return self._order_reversed().argmax(axis, keepdim)

    def _order_reversed(self) -> Tensor:
        """A tensor whose order is the reverse of self's (bitwise not for ints: no overflow at the minimum)."""
        if self.dtype == dtypes.bool:
            return self._t().logical_not()
        return -self._t() if dtypes.is_float(self.dtype) else self._t().bitwise_not()

    # ---- softmax family ----
    def softmax(self, axis: int = -1, dtype: DType | str | None = None) -> Tensor:
        """exp(x) / sum(exp(x)) along `axis`, in `dtype` if given; 16-bit floats are computed in float32 (as torch)
        and rounded once at the end.

        >>> Tensor([0.0, 0.0]).softmax().tolist()
        [0.5, 0.5]"""
        x = self._t().cast(dtype) if dtype is not None else self._t()._float()
        xa = x.cast(_acc_dtype(x.dtype))
        e = (xa - xa._safe_max(axis)).exp()
        return (e / e.sum(axis, keepdim=True)).cast(x.dtype)

    def log_softmax(self, axis: int = -1, dtype: DType | str | None = None) -> Tensor:
        """x - logsumexp(x) along `axis`, without overflow; computed like `softmax`.

        >>> [round(v, 6) for v in Tensor([1000.0, 1000.0]).log_softmax().tolist()]
        [-0.693147, -0.693147]"""
        x = self._t().cast(dtype) if dtype is not None else self._t()._float()
        xa = x.cast(_acc_dtype(x.dtype))
        shifted = xa - xa._safe_max(axis)
        return (shifted - shifted.exp().sum(axis, keepdim=True).log()).cast(x.dtype)

    def softmin(self, axis: int = -1, dtype: DType | str | None = None) -> Tensor:
        """softmax(-x).

        >>> Tensor([0.0, 0.0]).softmin().tolist()
        [0.5, 0.5]"""
        x = self._t().cast(dtype) if dtype is not None else self._t()._float()
        return (-x).softmax(axis)

    # ---- scans ----
    def _scan(self, kind: ScanKind, axis: int) -> Tensor:
        if self.ndim == 0:
            return _scan_last(self._t().reshape(1), kind).reshape(())
        ax = self._axis(axis)
        if self.shape[ax] == 0:
            return self._t()
        return _scan_last(self._t().transpose(ax, -1), kind).transpose(ax, -1)

    def cumsum(self, axis: int = 0) -> Tensor:
        """Running sums along `axis`, with the dtype of `sum`.

        >>> Tensor([1, 2, 3]).cumsum().tolist()
        [1, 3, 6]"""
        acc = _acc_dtype(self.dtype)
        out = self._t().cast(acc)._scan("sum", axis)
        return out.cast(self.dtype) if dtypes.is_float(self.dtype) else out

    def cumprod(self, axis: int = 0) -> Tensor:
        """Running products along `axis`, with the dtype of `prod`.

        >>> Tensor([1, 2, 3]).cumprod().tolist()
        [1, 2, 6]"""
        acc = _acc_dtype(self.dtype)
        out = self._t().cast(acc)._scan("prod", axis)
        return out.cast(self.dtype) if dtypes.is_float(self.dtype) else out

    def cummax(self, axis: int = 0) -> tuple[Tensor, Tensor]:
        """(values, indices): the running maximum along `axis` and where it was found (int32; the latest index on
        ties, as torch). The gradient goes to that index.

        >>> [t.tolist() for t in Tensor([1, 3, 2, 3]).cummax()]
        [[1, 3, 3, 3], [0, 1, 1, 3]]"""
        if self.ndim == 0:
            values, indices = self._t().reshape(1).cummax(0)
            return values.reshape(()), indices.reshape(())
        ax = self._axis(axis)
        x = self._t().transpose(ax, -1)
        n = x.shape[-1]
        if n == 0:
            return self._t(), self._t().cast(dtypes.int32)
        running = _scan_last(x, "max")
        pos = self._tensor_cls().arange(n, device=self.device, dtype=dtypes.int32)
        hit = (x == running) | x.isnan() if dtypes.is_float(x.dtype) else x == running  # a NaN: torch's index
        indices = _scan_last(hit.where(pos, -1), "max")
        if dtypes.is_float(x.dtype) and n <= _SELECT_MAX_N:
            # the same values, picked out by index so that the gradient goes where torch's does
            picked = indices.unsqueeze(-1) == pos
            running = picked.where(x.unsqueeze(-2).expand(*x.shape[:-1], n, n), 0.0).sum(-1)
        return running.transpose(ax, -1), indices.transpose(ax, -1)

    def cummin(self, axis: int = 0) -> tuple[Tensor, Tensor]:
        """(values, indices): the running minimum along `axis` and where it was found (latest index on ties).

        >>> [t.tolist() for t in Tensor([3, 1, 2, 1]).cummin()]
        [[3, 1, 1, 1], [0, 1, 1, 3]]"""
        values, indices = self._order_reversed().cummax(axis)
        return values._order_reversed(), indices

    def logcumsumexp(self, axis: int = 0) -> Tensor:
        """log(cumsum(exp(x))) along `axis`, without overflow or underflow.

        >>> [round(v, 4) for v in Tensor([0.0, 0.0, 1000.0]).logcumsumexp().tolist()]
        [0.0, 0.6931, 1000.0]"""
        return self._t()._float()._scan("logsumexp", axis)

    # ---- matmul ----
    def _sum_of_products(self, w: Tensor) -> Tensor:
        """`self @ w` as one sum of products in the operands' dtype (ints accumulate as `sum` does), with numpy's rules
        for 1-d and batched operands; `matmul`/`dot` (LinalgMixin) add dtype promotion on top."""
        xs, ws = self.shape, w.shape
        if not xs or not ws:
            raise ShapeError(f"matmul needs at least 1-d tensors, got {xs} and {ws}")
        k = -min(len(ws), 2)  # w's contracted axis
        if xs[-1] != ws[k]:
            raise ShapeError(f"matmul shapes {xs} and {ws} do not fit: {xs[-1]} != {ws[k]}")
        x_shape = xs[:-1] + (1,) * min(len(ws) - 1, 1) + xs[-1:]
        w_shape = ws[:-2] + (1,) * min(len(xs) - 1, 1) + ws[k:]
        dt, static = self.dtype, all(type(s) is int and s > 0 for s in xs + ws)
        if static and dt is w.dtype and _acc_dtype(dt) is dt and self.device == w.device and not DISALLOW_BROADCAST:
            return self._new(_matmul_uop(self.uop, w.uop, x_shape, w_shape, k))
        return (self._t().reshape(x_shape) * w.reshape(w_shape).transpose(-1, k)).sum(-1)
