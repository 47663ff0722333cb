"""`t[...]` and `t[...] = v`.

Basic indexes (ints, slices with any step, None, ...) become movement ops: a view, never a copy. Advanced indexes
(int tensors, lists, bool masks) pick with one-hot masks (`index == arange`) and a sum over the indexed axis, so they
are built of primitives and differentiable. Out-of-range advanced indices read 0 (ints and slices raise or clip as in
Python). A bool mask becomes int indices through `nonzero`, which reads the count from the device; a large mask
(COMPACT_MIN elements or more) over the leading axes selects its rows directly by log-step compaction.

Setitem writes into the tensor's buffer: basic indexes assign into the view, advanced ones rebuild the whole tensor
and assign it. Lazy tensors that read the old values are computed first, so they keep them (eager semantics).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from xgrad.dtype import dtypes, to_np_dtype
from xgrad.engine.realize import lazy_tensors, lazy_walk
from xgrad.errors import DTypeError, IndexingError, ShapeError, XgradError
from xgrad.mixin.base import TensorBase
from xgrad.mixin.common import broadcast_shape
from xgrad.uop.ops import Ops, UOp

if TYPE_CHECKING:
    from xgrad.tensor import Tensor

_FALSE_AXIS = object()  # a Python False index: a new axis of size 0
_WRITABLE_MOVES = (Ops.RESHAPE, Ops.PERMUTE, Ops.SHRINK, Ops.FLIP)
# From this many elements on, nonzero / masked_select / bool masks compact with log-step shifts (O(n log n) work in
# about 2*log2(n) small kernels, compiled once per n) instead of GatherMixin's one-kernel selection (O(n^2) work).
# Measured at n = 32768 with 30% kept (loaded 2-core machine): 0.1 s a call vs 1.35 s, first call 26 s vs 3.5 s.
COMPACT_MIN = 1 << 15


class IndexingMixin(TensorBase):
    __slots__ = ()

    # ---- compaction (nonzero, masked_select, bool masks) ----
    def _select_rows(self, table: Tensor, size: int | None, fill_value: Any) -> Tensor:
        """Rows of `table` (shape (n, k)) where the 1-d bool self is true, in order; `size` rows exactly (filled with
        `fill_value`), or as many as are true (read from the device).

        There is no data-dependent store, so the kept rows are moved to their places by shifts: each kept row i must
        move left by d(i) = i - (number of kept rows before i). Stage b moves the rows whose d has bit b set by 2**b;
        going from the lowest bit up, no two rows ever land on one place (d never decreases along the kept rows and
        grows by at most the distance between them). With the prefix count (also log-step), that is O(n log n) work."""
        n = self.shape[0]
        if n < COMPACT_MIN or n == 0:
            return self._t()._select_rows_by_match(table, size, fill_value)
        if size is not None and size < 0:
            raise ShapeError(f"size must be non-negative, got {size}")
        inclusive = _prefix_sum(self._t().cast(dtypes.int32))
        total = inclusive.shrink(((n - 1, n),)).reshape(())
        rows = int(total.item()) if size is None else size
        # distance to move left, or -1 for a row that is not kept
        dist = (
            self._t()
            .where(self._tensor_cls().arange(n, device=self.device, dtype=dtypes.int32) - inclusive + 1, -1)
            .contiguous()
        )
        vals = table
        step = 1
        while step < n:
            moving = (dist >= 0) & (dist.bitwise_and(step) != 0)
            arriving = _shift_left(moving, step)
            dist = arriving.where(_shift_left(dist, step), moving.where(-1, dist)).contiguous()
            vals = arriving.reshape(n, 1).where(_shift_left(vals, step), vals).contiguous()
            step *= 2
        out = vals.shrink(((0, min(rows, n)), None)).pad(((0, max(rows - n, 0)), (0, 0)))
        slot = self._tensor_cls().arange(rows, device=self.device, dtype=dtypes.int32)
        return (slot < total).reshape(rows, 1).where(out, table._scalar(fill_value))

    def __getitem__(self, indices: Any) -> Tensor:
        """Index like numpy/torch: ints, slices (any step), None, ..., int tensors or lists, bool masks.

        >>> t = Tensor([[1, 2, 3], [4, 5, 6]])
        >>> t[1].tolist(), t[:, ::-2].tolist(), t[None, 0, 1:].shape
        ([4, 5, 6], [[3, 1], [6, 4]], (1, 2))
        >>> t[[1, 0], [2, 2]].tolist(), t[t > 4].tolist()
        ([6, 3], [5, 6])
        """
        if type(indices) is list and any(i is None or i is Ellipsis or isinstance(i, slice) for i in indices):
            indices = tuple(indices)  # numpy's older rule, kept by tinygrad: a list holding a slice is a tuple
        if (view := self._t()._symbolic_index(indices)) is not None:  # a bound Variable in an index: t[:, :start_pos]
            return view
        if (mask := self._large_leading_mask(indices)) is not None:  # x[mask]: compact the rows directly
            n, rest = mask.numel(), self.shape[mask.ndim :]
            rows = mask.flatten()._select_rows(self._t().reshape(n, math.prod(rest)), None, 0)
            return rows.reshape(rows.shape[0], *rest)
        return self._index(self._normalize_indices(indices))

    def _large_leading_mask(self, indices: Any) -> Tensor | None:
        """The index when it is one bool mask (alone or followed by `...`) over self's leading axes with at least
        COMPACT_MIN elements: then `self[mask]` selects rows without turning the mask into int indices (a gather)."""
        items = indices if isinstance(indices, tuple) else (indices,)
        if len(items) == 2 and items[1] is Ellipsis:
            items = items[:1]
        if len(items) != 1 or not isinstance(items[0], self._tensor_cls()):
            return None
        mask = items[0]
        if mask.dtype != dtypes.bool or mask.ndim == 0 or mask.shape != self.shape[: mask.ndim]:
            return None
        return mask if mask.numel() >= COMPACT_MIN and mask.device == self.device else None

    def __setitem__(self, indices: Any, v: Any) -> None:
        """Write `v` (broadcast to the indexed shape; a tensor must have self's dtype) into self's memory.

        >>> t = Tensor([1, 2, 3, 4])
        >>> t[1:3] = 0
        >>> t[[0]] = Tensor([9])
        >>> t.tolist()
        [9, 0, 0, 4]
        """
        if isinstance(self.device, str) and self.device.startswith("DISK"):
            self._setitem_disk(indices, v)
            return
        value = self._setitem_value(v)
        if (view := self._t()._symbolic_index(indices)) is not None:  # cache[:, start_pos : start_pos + 1] = x
            self._writable_buffer()
            view = self._t()._symbolic_index(indices)  # again: _writable_buffer may have moved self onto a new buffer
            assert view is not None
            self._write(view, _fit_value(value, view.shape))
            return
        if isinstance(indices, self._tensor_cls()) and indices.dtype == dtypes.bool and indices.shape == self.shape:
            if value.numel() == 1:  # x[mask] = scalar: no count to read back
                self._writable_buffer()
                self._write(self._t(), indices.where(value.reshape(()), self._t()))
                return
        items = self._normalize_indices(indices)
        self._writable_buffer()
        if not any(isinstance(it, self._tensor_cls()) for it in items):
            view, _ = self._index_basic(items)
            self._write(view, _fit_value(value, view.shape))
            return
        if (rebuilt := self._rebuilt(items, value)) is not None:
            self._write(self._t(), rebuilt)

    def _setitem_disk(self, indices: Any, v: Any) -> None:
        """`disk_tensor[basic index] = v`: `v`'s bytes (from any device, or Python/numpy data) are written into the
        file now, as tinygrad does; the view must be one contiguous run of the file."""
        raw = list(indices) if isinstance(indices, tuple) else [indices]
        if any(isinstance(it, (list, np.ndarray, self._tensor_cls())) for it in raw):
            raise DiskSetitemError(
                "advanced setitem (a list or tensor index) is not supported for DISK tensors; index with ints and "
                "slices, or copy the tensor to a compute device with .to() first"
            )
        view, _ = self._index_basic(self._normalize_indices(indices))
        view.assign(v)

    def __delitem__(self, indices: Any) -> None:
        raise DeleteItemError("tensors cannot delete elements; build a smaller one with shrink, indexing or cat")

    # ---- parsing ----
    def _normalize_indices(self, indices: Any) -> list[Any]:
        """A list with one entry per result-building step: int, slice, None, _FALSE_AXIS or an int Tensor (bool masks
        are turned into one int Tensor per masked axis); '...' is expanded and missing trailing axes are filled."""
        tensor_cls = self._tensor_cls()
        raw = list(indices) if isinstance(indices, tuple) else [indices]
        items: list[Any] = []
        for it in raw:
            if isinstance(it, (bool, np.bool_)):
                items.append(None if it else _FALSE_AXIS)
            elif isinstance(it, (int, np.integer)):
                items.append(int(it))
            elif it is None or it is Ellipsis or isinstance(it, slice):
                items.append(it)
            elif isinstance(it, (list, tuple, np.ndarray)):
                try:
                    arr = np.asarray(it)
                except ValueError:
                    arr = np.asarray(None)
                if arr.dtype == object:
                    raise IndexingError(f"index list {it!r} is ragged or mixes kinds; use equal-length lists of ints")
                if arr.size and arr.dtype.kind not in "iub":  # floats, strings: numpy's and tinygrad's IndexError
                    raise IndexingError(f"index {it!r} holds {arr.dtype.name} values; index with ints or bools")
                if arr.size == 0 or (isinstance(it, (list, tuple)) and arr.dtype.kind in "iu"):
                    arr = arr.astype(to_np_dtype(dtypes.default_int))  # Python ints index in the default int
                items.append(tensor_cls(arr, device=self.device))
            elif isinstance(it, tensor_cls):
                if it.dtype != dtypes.bool and not dtypes.is_int(it.dtype):
                    raise IndexingError(f"tensor index has dtype {it.dtype.name}; index with an int or bool tensor")
                if it.device != self.device:
                    raise IndexingError(f"index is on {it.device}, the tensor on {self.device}; move it with .to()")
                items.append(it)
            else:
                raise IndexingError(f"cannot index with {type(it).__name__}; use int, slice, None, ..., list or Tensor")
        if sum(it is Ellipsis for it in items) > 1:
            raise IndexingError("an index can have only one '...'")
        consumed = sum(_dims_consumed(it, tensor_cls) for it in items)
        if consumed > self.ndim:
            raise IndexingError(f"too many indices ({consumed}) for a tensor of shape {self.shape}")
        fill = [slice(None)] * (self.ndim - consumed)
        dots = [i for i, it in enumerate(items) if it is Ellipsis]
        at = dots[0] if dots else len(items)
        items[at : at + len(dots)] = fill
        return self._masks_to_ints(items)

    def _masks_to_ints(self, items: list[Any]) -> list[Any]:
        out: list[Any] = []
        dim = 0
        for it in items:
            if isinstance(it, self._tensor_cls()) and it.dtype == dtypes.bool:
                want = self.shape[dim : dim + it.ndim]
                if it.shape != want:
                    raise IndexingError(f"bool mask of shape {it.shape} does not match the indexed axes {want}")
                if it.ndim == 0:
                    out.append(None if it.item() else _FALSE_AXIS)
                    continue
                where = it.nonzero()
                out.extend(where._shrink_axis(1, j, j + 1).reshape(-1) for j in range(it.ndim))
                dim += it.ndim
                continue
            out.append(it)
            dim += _dims_consumed(it, self._tensor_cls())
        return out

    # ---- getitem ----
    def _index(self, items: list[Any]) -> Tensor:
        x, adv = self._index_basic(items)
        return x._index_advanced(adv) if adv else x

    def _index_basic(self, items: list[Any]) -> tuple[Tensor, list[tuple[int, Tensor]]]:
        """Apply the basic indexes as one flip, one shrink, strides and one reshape. Returns the view and the
        tensor indexes with the axis of the view each applies to."""
        tensor_cls = self._tensor_cls()
        shrinks: list[tuple[int, int]] = []
        flips: list[int] = []
        strides: list[tuple[int, int, int]] = []
        out_shape: list[int] = []
        empty_axes: list[int] = []
        adv: list[tuple[int, Tensor]] = []
        dim = 0
        for it in items:
            if it is None or it is _FALSE_AXIS:
                if it is _FALSE_AXIS:
                    empty_axes.append(len(out_shape))
                out_shape.append(1)
                continue
            n = self.shape[dim]
            if isinstance(it, int):
                if not -n <= it < n:
                    raise IndexingError(f"index {it} is out of range for axis {dim} of size {n} (shape {self.shape})")
                i = it + n if it < 0 else it
                shrinks.append((i, i + 1))
            elif isinstance(it, slice):
                start, count, step = _slice_plan(it, n)
                if step < 0:
                    flips.append(dim)
                    start, step = n - 1 - start, -step
                span = min(n - start, count * step) if count > 1 else count  # whole rows of `step` when they fit
                shrinks.append((start, start + span) if count else (0, 0))
                if count > 1 and step > 1:
                    strides.append((dim, step, count))
                out_shape.append(count)
            else:
                assert isinstance(it, tensor_cls)
                shrinks.append((0, n))
                adv.append((len(out_shape), it))
                out_shape.append(n)
            dim += 1
        x = self._t().flip(flips) if flips else self._t()
        x = x.shrink(shrinks)
        for d, step, count in strides:
            x = x._every(d, step, count)
        x = x.reshape(tuple(out_shape))
        if empty_axes:
            x = x.shrink(tuple((0, 0) if i in empty_axes else None for i in range(x.ndim)))
        return x, adv

    def _index_advanced(self, adv: list[tuple[int, Tensor]]) -> Tensor:
        axes = [a for a, _ in adv]
        batch: tuple[int, ...] = ()
        for _, t in adv:
            try:
                batch = broadcast_shape(batch, t.shape)
            except ShapeError:
                shapes = ", ".join(str(t.shape) for _, t in adv)
                raise IndexingError(f"index tensors of shapes {shapes} cannot be broadcast together") from None
        nb = len(batch)
        rest = [i for i in range(self.ndim) if i not in axes]
        y = self._t().permute(axes + rest)
        y = y.reshape((1,) * nb + y.shape)
        for a, t in adv:
            n = self.shape[a]
            idx = t.cast(dtypes.int32) if t.dtype.itemsize < 4 else t
            if not dtypes.is_unsigned(idx.dtype):
                idx = (idx < 0).where(idx + n, idx)  # negative indices count from the end
            mask = idx._broadcast_to(batch)._one_hot_mask(n)
            y = y._pick(mask.reshape(batch + (n,) + (1,) * (y.ndim - nb - 1)), nb)
        if axes == list(range(axes[0], axes[0] + len(axes))):  # adjacent tensor indexes: result axes stay in place
            p = axes[0]
            y = y.permute(list(range(nb, nb + p)) + list(range(nb)) + list(range(nb + p, y.ndim)))
        return y

    # ---- setitem ----
    def _setitem_value(self, v: Any) -> Tensor:
        tensor_cls = self._tensor_cls()
        if isinstance(v, tensor_cls):
            if v.dtype != self.dtype:
                raise DTypeError(
                    f"setitem value has dtype {v.dtype.name}, the tensor {self.dtype.name}; cast it with "
                    f".cast({self.dtype!r})"
                )
            if v.device != self.device:
                raise XgradError(f"setitem value is on {v.device}, the tensor on {self.device}; move it with .to()")
            return v
        if isinstance(v, (bool, int, float)):
            return self._t()._scalar(v)
        if isinstance(v, (list, tuple, np.ndarray)):
            return tensor_cls(np.asarray(v), device=self.device, dtype=self.dtype)
        raise DTypeError(f"cannot assign {type(v).__name__} into a tensor; use a number, list or Tensor")

    def _writable_buffer(self) -> None:
        """Make self a writable view of a buffer that no other graph computes: realize pending work, and copy into a
        fresh buffer when self is lazy or a padded/expanded view."""
        if self.uop.op is Ops.ASSIGN:
            self._t().realize()
        if _is_writable_view(self.uop):
            return
        fresh = self._tensor_cls().empty(self.shape, dtype=self.dtype, device=self.device)
        fresh.assign(self._t()).realize()
        self._t().uop = fresh.uop

    def _write(self, target: Tensor, value: Tensor) -> None:
        buf = target.uop.base
        _realize_readers(buf)
        if buf in value.uop.walk():  # the value reads memory the write overwrites
            value = value.contiguous()
        target.assign(value).realize()

    def _rebuilt(self, items: list[Any], value: Tensor) -> Tensor | None:
        """self with the advanced-indexed places replaced by `value` (the last write wins for repeated places); None
        when no place is indexed."""
        n = self.numel()
        place = self._tensor_cls().arange(1, n + 1, device=self.device, dtype=dtypes.int32)
        chosen = place.reshape(self.shape)._index(items)  # 1 + flat position of each indexed place; 0: out of range
        vals = _fit_value(value, chosen.shape)
        m = chosen.numel()
        if m == 0 or n == 0:
            return None
        match = chosen.reshape(1, m) == place.reshape(n, 1)
        order = self._tensor_cls().arange(m, device=self.device, dtype=dtypes.int32)
        last = match.where(order, -1).max(1, keepdim=True)
        new = vals.reshape(1, m)._pick(match & (order == last), 1)
        return (last >= 0).reshape(n).where(new, self._t().flatten()).reshape(self.shape)


def _dims_consumed(it: Any, tensor_cls: type[Tensor]) -> int:
    if it is None or it is Ellipsis or it is _FALSE_AXIS:
        return 0
    if isinstance(it, tensor_cls) and it.dtype == dtypes.bool:
        return int(it.ndim)
    return 1


class DiskSetitemError(IndexingError, RuntimeError):
    """An index a DISK tensor cannot be written through (a RuntimeError too, as tinygrad's)."""


class DeleteItemError(IndexingError, TypeError):
    """`del t[i]`: tensors cannot delete elements. A `TypeError` as tinygrad's (and an `IndexingError`)."""


class SliceStepError(IndexingError, ValueError):
    """A slice with step 0 (a ValueError too, as Python's and tinygrad's)."""


def _slice_plan(s: slice, n: int) -> tuple[int, int, int]:
    """(start, count, step) of a Python slice over n elements."""
    for part in (s.start, s.stop, s.step):
        if part is not None and not isinstance(part, (int, np.integer)):
            raise IndexingError(f"slice {s} must hold ints or None")
    if s.step == 0:
        raise SliceStepError("slice step cannot be zero; use a positive or negative step")
    start, stop, step = s.indices(n)
    return start, len(range(start, stop, step)), step


def _fit_value(value: Tensor, shape: tuple[int, ...]) -> Tensor:
    """`value` broadcast to `shape`; leading size-1 axes beyond the target's rank are dropped (as torch does)."""
    v = value
    while v.ndim > len(shape) and v.shape[0] == 1:
        v = v.reshape(v.shape[1:])
    try:
        return v._broadcast_to(shape)
    except ShapeError:
        raise ShapeError(
            f"setitem value of shape {value.shape} cannot be broadcast to the indexed shape {shape}"
        ) from None


def _is_writable_view(u: UOp) -> bool:
    x = u
    while x.op in _WRITABLE_MOVES:
        x = x.src[0]
    return x.op is Ops.BUFFER


def _realize_readers(buf: UOp) -> None:
    """Compute every live lazy tensor that reads `buf`, so it keeps the values from before a write."""
    pending = [
        t
        for t in lazy_tensors.members()
        if (t.uop.base.op is not Ops.BUFFER or t.uop.op is Ops.ASSIGN) and buf in lazy_walk(t)
    ]
    if pending:
        pending[0].realize(*pending[1:])


def _shift_left(x: Tensor, k: int) -> Tensor:
    """x[j + k] along axis 0, zero (False) past the end."""
    n = x.shape[0]
    rest = ((0, 0),) * (x.ndim - 1)
    return x.shrink(((k, n), *((None,) * (x.ndim - 1)))).pad(((0, k), *rest))


def _prefix_sum(x: Tensor) -> Tensor:
    """Inclusive prefix sum of a 1-d tensor in log2(n) steps (each adds the values 2**b places to the left)."""
    n = x.shape[0]
    step = 1
    while step < n:
        x = (x + x.shrink(((0, n - step),)).pad(((step, 0),))).contiguous()
        step *= 2
    return x
