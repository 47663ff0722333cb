"""Sorting with a bitonic network: sort, argsort, topk.

The sorted axis is padded to a power of two 2**m and sorted by m * (m + 1) / 2 compare-and-swap steps; each step pairs
every element with a partner found by a flip view (no gather), keeps the smaller or larger of the two by position,
and is made contiguous so every step is one kernel. Values travel with their original indices, and ties are broken
by index, so the order is stable (torch.sort(stable=True)); NaN sorts above everything, as in torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xgrad.dtype import DType, dtypes
from xgrad.errors import IndexingError
from xgrad.mixin.base import TensorBase


class TopkRangeError(IndexingError, ValueError):
    """`topk` asked for more elements than the dimension has: an `IndexError`, and a `ValueError` as tinygrad's."""


if TYPE_CHECKING:
    from xgrad.tensor import Tensor


def _precedes(a: Tensor, ai: Tensor, b: Tensor, bi: Tensor, descending: bool) -> Tensor:
    """True where (a, ai) comes before (b, bi): by value (NaN largest), then by index. NaN is found from the bits
    (isnan), not from comparisons, which some shader compilers assume never see a NaN."""
    first = a > b if descending else a < b
    same = a == b
    if dtypes.is_float(a.dtype):
        a_nan, b_nan = a.isnan(), b.isnan()
        numbers = (a_nan | b_nan).logical_not()
        nan_first = (a_nan & b_nan.logical_not()) if descending else (b_nan & a_nan.logical_not())
        first = (numbers & first) | nan_first
        same = (numbers & same) | (a_nan & b_nan)
    return first | (same & (ai < bi))


class SortMixin(TensorBase):
    __slots__ = ()

    def sort(self, dim: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
        """Sort along `dim`; returns (values, indices) with indices in the default int dtype. Stable: equal values
        keep their order.

        >>> values, indices = Tensor([3, 1, 2, 1]).sort()
        >>> values.tolist(), indices.tolist()
        ([1, 1, 2, 3], [1, 3, 2, 0])
        """
        index_dtype = dtypes.default_int
        if self.ndim == 0:
            return self._t(), self._tensor_cls().zeros((), device=self.device, dtype=index_dtype)
        axis = self._axis(dim)
        x = self._t().transpose(axis, -1) if axis != self.ndim - 1 else self._t()
        n = x.shape[-1]
        arange = self._tensor_cls().arange
        if n <= 1 or x.numel() == 0:
            idx = arange(n, device=self.device, dtype=index_dtype)._broadcast_to(x.shape)
            return self._t(), idx.transpose(axis, -1) if axis != self.ndim - 1 else idx
        work = _work_dtype(x.dtype, n)
        values = x.cast(work)
        size = 1 << (n - 1).bit_length()
        if size != n:
            if dtypes.is_float(work):
                filler = -float("inf") if descending else float("nan")
            else:
                filler = dtypes.min(work) if descending else dtypes.max(work)
            values = values.pad(((0, 0),) * (x.ndim - 1) + ((0, size - n),), value=filler)
        lead = values.shape[:-1]
        # values and original indices travel as one tensor (..., 2, size), so a step is one kernel, not two
        idx = arange(size, device=self.device).cast(work)._broadcast_to(values.shape)
        is_value_row = (arange(2, device=self.device) == 0).reshape(2, 1)
        pairs = is_value_row.where(values.unsqueeze(-2), idx.unsqueeze(-2))  # where keeps -0.0, unlike pad + add
        steps = []  # (block, mirror): a merge step compares with the mirror position in the block, then
        block = 2  # half-cleaners of shrinking blocks compare with the element half a block away
        while block <= size:
            steps += [(block, True)] + [
                (b, False) for b in (block >> k for k in range(1, block.bit_length())) if b >= 2
            ]
            block *= 2
        for b, mirror in steps:
            pairs = _compare_swap(pairs, b, mirror, descending).contiguous().contiguous_backward()
        values = pairs.shrink(tuple((0, s) for s in lead) + ((0, 1), (0, n))).reshape(lead + (n,)).cast(self.dtype)
        idx = pairs.shrink(tuple((0, s) for s in lead) + ((1, 2), (0, n))).reshape(lead + (n,)).cast(index_dtype)
        if axis != self.ndim - 1:
            values, idx = values.transpose(axis, -1), idx.transpose(axis, -1)
        return values, idx

    def argsort(self, dim: int = -1, descending: bool = False) -> Tensor:
        """The indices that sort along `dim` (stable).

        >>> Tensor([3.0, 1.0, 2.0]).argsort().tolist()
        [1, 2, 0]
        """
        return self.sort(dim, descending)[1]

    def topk(self, k: int, dim: int = -1, largest: bool = True, sorted_: bool = True) -> tuple[Tensor, Tensor]:
        """The `k` largest (or smallest) values along `dim` and their indices, always in sorted order.

        >>> values, indices = Tensor([1.0, 4.0, 2.0, 3.0]).topk(2)
        >>> values.tolist(), indices.tolist()
        ([4.0, 3.0], [1, 3])
        """
        axis = self._axis(dim)
        size = self.shape[axis] if self.ndim else 1
        if not 0 <= k <= size:
            raise TopkRangeError(f"topk k={k} is out of range for dimension {dim} of size {size} in shape {self.shape}")
        values, idx = self.sort(axis, descending=largest)
        if self.ndim == 0:
            return values, idx
        keep = tuple((0, k) if a == axis else (0, s) for a, s in enumerate(self.shape))
        return values.shrink(keep), idx.shrink(keep)


def _work_dtype(dtype: DType, n: int) -> DType:
    """A dtype that holds every value of `dtype` and every index below the padded size exactly."""
    if dtype == dtypes.bool or (dtypes.is_int(dtype) and dtype.itemsize < 4):
        return dtypes.int32
    if dtypes.is_float(dtype) and dtype.itemsize < 4:
        return dtypes.float32
    if dtype == dtypes.float32 and n > 1 << 24:
        return dtypes.float64
    return dtype


def _compare_swap(pairs: Tensor, block: int, mirror: bool, descending: bool) -> Tensor:
    """One bitonic step on the last axis of (..., 2, size) (values, indices), in blocks of `block`: each element meets
    its partner (the mirror position in the block when `mirror`, else the element half a block away); the first half
    of the block keeps the one that comes first."""
    size = pairs.shape[-1]
    lead = pairs.shape[:-2]
    split = pairs.shape[:-1] + ((size // block, block) if mirror else (size // block, 2, block // 2))
    partner = pairs.reshape(split).flip(-1 if mirror else -2).reshape(pairs.shape)

    def row(t: Tensor, r: int) -> Tensor:
        return t.shrink(tuple((0, s) for s in lead) + ((r, r + 1), (0, size)))

    position = pairs._tensor_cls().arange(size, device=pairs.device)
    first_half = (position % block) < block // 2
    keep = _precedes(row(pairs, 0), row(pairs, 1), row(partner, 0), row(partner, 1), descending) == first_half
    return keep.where(pairs, partner)
