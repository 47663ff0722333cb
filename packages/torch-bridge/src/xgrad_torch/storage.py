"""The xgrad buffer of a torch tensor on `xgrad`, and views of it.

In: torch tensors on `xgrad` (sizes, strides, storage offset, all kept by torch) and xgrad Tensors. Out: the xgrad
Tensor a torch tensor reads as (`read`), torch tensors wrapping new xgrad results (`wrap`), and in-place writes
through any view (`write`).

Each torch storage on `xgrad` carries a `Holder` as an attribute of its Python object: the storage's elements as one
lazy xgrad Tensor (kept in the shape it was made in; flat for views). Everything torch derives from a tensor
(`nn.Parameter`, `detach`, `.data`, views made by redispatching a view op to Meta) shares the storage, so it shares
the holder. A torch view reads as xgrad movement
ops on the flat tensor (shrink, reshape, permute, expand; a gather only for overlapping layouts such as `unfold`);
a write through a view replaces the flat tensor with one that takes the new values inside the view's footprint
(a `where` over the same movement ops run backwards), so the base and every live view see it. Nothing is realized
here: writes stay lazy until torch needs data (`flush` realizes every pending write with what torch asked for, and
the results made since the last flush that are still alive).
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import numpy as np
import torch

from xgrad import Tensor, dtypes
from xgrad.dtype import DType

from .registration import BridgeError, new_shell

_TO_XGRAD: dict[torch.dtype, DType] = {
    torch.bool: dtypes.bool,
    torch.int8: dtypes.int8,
    torch.uint8: dtypes.uint8,
    torch.int16: dtypes.int16,
    torch.uint16: dtypes.uint16,
    torch.int32: dtypes.int32,
    torch.uint32: dtypes.uint32,
    torch.int64: dtypes.int64,
    torch.uint64: dtypes.uint64,
    torch.float16: dtypes.float16,
    torch.bfloat16: dtypes.bfloat16,
    torch.float32: dtypes.float32,
    torch.float64: dtypes.float64,
}
_TO_TORCH = {v: k for k, v in _TO_XGRAD.items()}
FLUSH_AFTER_WRITES = 256  # pending in-place writes after which they are realized (bounds the graphs' depth)


def to_xgrad_dtype(dtype: torch.dtype) -> DType:
    """The xgrad dtype of a torch dtype; BridgeError for those xgrad lacks (complex, quantized)."""
    if dtype not in _TO_XGRAD:
        raise BridgeError(f"torch dtype {dtype} has no xgrad equivalent; use one of {sorted(map(str, _TO_XGRAD))}")
    return _TO_XGRAD[dtype]


def to_torch_dtype(dtype: DType) -> torch.dtype:
    """The torch dtype of an xgrad dtype."""
    if dtype not in _TO_TORCH:
        raise BridgeError(f"xgrad dtype {dtype.name} has no torch equivalent")
    return _TO_TORCH[dtype]


class Holder:
    """A storage's elements as one xgrad Tensor (`whole`, in the shape it was made or last written in whole),
    replaced by every write; `base` is the same elements flat (what views and partial writes index)."""

    __slots__ = ("whole", "numel", "_flat", "__weakref__")

    def __init__(self, whole: Tensor) -> None:
        self.set(whole)

    def set(self, whole: Tensor) -> None:
        shape = whole.shape
        self.whole = whole
        self.numel = math.prod(shape)
        self._flat: Tensor | None = whole if len(shape) == 1 else None

    @property
    def base(self) -> Tensor:
        if self._flat is None:
            self._flat = self.whole.reshape(self.numel)
        return self._flat


# holders with a write not yet realized, in the order of their first write: `flush` realizes them in that order, so a
# loop that writes the same tensors each step builds the same graph each step and hits the schedule cache (a WeakSet's
# order follows the holders' addresses, which change now and then: each change was a fresh schedule, ~1.4 steps' work)
_pending: weakref.WeakKeyDictionary[Holder, None] = weakref.WeakKeyDictionary()
_writes = 0
# storages made since the last flush (the results of functional ops), in the order they were made: a flush of pending
# writes realizes, in the same schedule, those still alive. At a training step's `loss.item()` these are the
# gradients, which the optimizer's writes read: left lazy, the realize walked each of their graphs on its own (xgrad
# checks every live lazy tensor for nodes it computed), 1072 nodes, a seventh of an eager digits step's Python
# bytecodes; realized, they are what native xgrad's optimizers realize with their update. A temporary that died
# before the flush is gone from here, so a fused chain stays fused.
_fresh: weakref.WeakKeyDictionary[Holder, None] = weakref.WeakKeyDictionary()


def holder_of(t: torch.Tensor) -> Holder:
    """The holder on `t`'s storage; BridgeError for a tensor the bridge did not make."""
    h = getattr(t.untyped_storage(), "_xgrad", None)
    if h is None:
        raise BridgeError(
            f"a tensor on {t.device} without an xgrad buffer (shape {tuple(t.shape)}); make tensors on xgrad with "
            "torch ops or .to('xgrad')"
        )
    assert isinstance(h, Holder)
    return h


def wrap(x: Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A new torch tensor on `xgrad:0` whose storage holds `x` (cast to `dtype` when given)."""
    if dtype is None:
        dtype = to_torch_dtype(x.dtype)
    elif _TO_XGRAD.get(dtype) != x.dtype:
        x = x.cast(to_xgrad_dtype(dtype))
    t = new_shell(x.shape, dtype)
    h = Holder(x)
    t.untyped_storage()._xgrad = h  # type: ignore[attr-defined]
    _fresh[h] = None
    return t


# ---- layouts: a torch (size, stride, offset) as movement ops on the flat tensor ----
def _simple_layout(size: tuple[int, ...], stride: tuple[int, ...]) -> list[int] | None:
    """The non-broadcast dims of size > 1 by decreasing stride, when they tile a block of the flat tensor without
    overlap (each stride a multiple of the next, and at least its extent); else None."""
    dims = sorted((i for i, (n, s) in enumerate(zip(size, stride)) if n != 1 and s != 0), key=lambda i: -stride[i])
    for a, b in zip(dims, dims[1:]):
        if stride[a] % stride[b] or stride[a] < size[b] * stride[b]:
            return None
    return dims


def _indices(size: tuple[int, ...], stride: tuple[int, ...], offset: int) -> np.ndarray:
    idx = np.full(size, offset, dtype=np.int64)
    for axis, (n, s) in enumerate(zip(size, stride)):
        idx = idx + (np.arange(n, dtype=np.int64) * s).reshape((1,) * axis + (n,) + (1,) * (len(size) - axis - 1))
    return idx


def view_of(base: Tensor, size: tuple[int, ...], stride: tuple[int, ...], offset: int) -> Tensor:
    """The elements of the flat `base` at torch's (size, stride, offset)."""
    n = base.shape[0]
    numel = math.prod(size)
    if numel == 0:
        return Tensor.zeros(size, dtype=base.dtype, device=base.device)
    if stride == _contiguous(size):
        if offset == 0 and numel == n:
            return base.reshape(size)
        return base.shrink(((offset, offset + numel),)).reshape(size)
    dims = _simple_layout(size, stride)
    if dims is None:
        idx = Tensor(_indices(size, stride, offset).reshape(-1), device=base.device)
        return base.gather(0, idx).reshape(size)
    if not dims:  # one element broadcast
        return base.shrink(((offset, offset + 1),)).reshape((1,) * len(size)).expand(size)
    block = stride[dims[0]] * size[dims[0]]
    region = base
    if offset + block > n:
        region = region.pad(((0, offset + block - n),))
    region = region.shrink(((offset, offset + block),))
    split = [size[dims[0]], *(stride[a] // stride[b] for a, b in zip(dims, dims[1:])), stride[dims[-1]]]
    x = region.reshape(tuple(split)).shrink(((0, size[dims[0]]), *((0, size[d]) for d in dims[1:]), (0, 1)))
    x = x.reshape(tuple(size[d] for d in dims))
    order = sorted(range(len(dims)), key=lambda k: dims[k])  # back to the tensor's own dim order
    x = x.permute(tuple(order)) if order != list(range(len(dims))) else x
    kept = set(dims)
    x = x.reshape(tuple(n_ if i in kept else 1 for i, n_ in enumerate(size)))
    return x.expand(size) if x.shape != size else x


def _contiguous(size: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(size):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def _scatter_into(base: Tensor, value: Tensor, size: tuple[int, ...], stride: tuple[int, ...], offset: int) -> Tensor:
    """`base` with the elements at (size, stride, offset) replaced by `value` (shape `size`)."""
    n = base.shape[0]
    dims = _simple_layout(size, stride)
    if dims is None or any(s == 0 and k != 1 for k, s in zip(size, stride)):
        flat_idx = _indices(size, stride, offset).reshape(-1)
        if len(np.unique(flat_idx)) != len(flat_idx):
            raise BridgeError(
                f"in-place write to a view whose elements overlap (size {size}, stride {stride}); write to a "
                ".clone() of it instead"
            )
        return base.scatter(0, Tensor(flat_idx, device=base.device), value.reshape(-1))
    if not dims:
        placed = value.reshape(1).pad(((offset, n - offset - 1),))
        mask = Tensor.ones(1, dtype=dtypes.bool, device=base.device).pad(((offset, n - offset - 1),), value=False)
        return mask.where(placed, base)
    sorted_shape = tuple(size[d] for d in dims)
    x = value.reshape(tuple(size[d] for d in sorted(dims)))
    order = sorted(range(len(dims)), key=lambda k: dims[k])
    inverse = [order.index(k) for k in range(len(dims))]
    x = x.permute(tuple(inverse)) if inverse != list(range(len(dims))) else x
    x = x.reshape(sorted_shape)
    mask = Tensor.ones(sorted_shape, dtype=dtypes.bool, device=base.device)
    block = stride[dims[0]] * size[dims[0]]
    split = [size[dims[0]], *(stride[a] // stride[b] for a, b in zip(dims, dims[1:])), stride[dims[-1]]]
    pads = ((0, 0), *((0, split[k] - size[d]) for k, d in enumerate(dims[1:], 1)), (0, split[-1] - 1))
    end = min(offset + block, n)
    outer = ((offset, n - end),)

    def place(t: Tensor, fill: Any) -> Tensor:
        t = t.reshape((*sorted_shape, 1)).pad(pads, value=fill).reshape(block)
        return t.shrink(((0, end - offset),)).pad(outer, value=fill)

    return place(mask, False).where(place(x, 0), base)


def _permutation(size: tuple[int, ...], stride: tuple[int, ...]) -> list[int] | None:
    """The dims by decreasing stride when (size, stride) is a contiguous layout with its dims permuted (and none of
    size 1, whose stride is arbitrary); else None."""
    if 1 in size or 0 in size:
        return None
    order = sorted(range(len(size)), key=stride.__getitem__, reverse=True)
    step = 1
    for d in reversed(order):
        if stride[d] != step:
            return None
        step *= size[d]
    return order


def read(t: torch.Tensor) -> Tensor:
    """The xgrad Tensor that the torch tensor `t` on `xgrad` reads as (lazy)."""
    h = holder_of(t)
    shape = tuple(t.shape)
    if t.storage_offset() == 0:
        if t.is_contiguous():
            if h.whole.shape == shape:  # the common case: the storage's tensor itself
                return h.whole
            if t.numel() == h.numel:
                return h.whole.reshape(shape)
        elif t.numel() == h.numel and (order := _permutation(shape, tuple(t.stride()))) is not None:
            # all of the storage with its dims permuted (a transposed weight, or gradient): one permute
            laid = tuple(shape[d] for d in order)
            x = h.whole if h.whole.shape == laid else h.whole.reshape(laid)
            return x.permute(tuple(order.index(d) for d in range(len(order))))
    return view_of(h.base, shape, tuple(t.stride()), int(t.storage_offset()))


def write(t: torch.Tensor, value: Tensor | bool | int | float) -> None:
    """Write `value` (broadcast to `t`'s shape, cast to its dtype) into `t`, through its storage: the base and every
    view of it see the new values. Stays lazy."""
    global _writes
    h = holder_of(t)
    want = to_xgrad_dtype(t.dtype)
    size = tuple(t.shape)
    if not isinstance(value, Tensor):
        value = Tensor(value, dtype=want)
    value = value if value.dtype == want else value.cast(want)
    if value.shape != size:
        value = value.reshape((1,) * (len(size) - value.ndim) + value.shape).expand(size) if size else value.reshape(())
    if h.whole.dtype != want:
        raise BridgeError(
            f"a write of {t.dtype} into a storage of xgrad {h.whole.dtype.name} (a dtype view); clone first"
        )
    if t.storage_offset() == 0 and t.numel() == h.numel and t.is_contiguous():
        h.set(value)
    elif t.numel():
        h.set(_scatter_into(h.base, value, size, tuple(t.stride()), int(t.storage_offset())))
    _pending[h] = None
    _writes += 1
    if _writes >= FLUSH_AFTER_WRITES:
        flush()


def flush(*also: Tensor) -> None:
    """Realize every pending write, together with `also` and, when there was a pending write, the live results made
    since the last flush (one schedule)."""
    global _writes
    if not _pending and not also:
        return
    holders = list(_pending)
    if holders:
        holders += [h for h in _fresh if h not in _pending]
        _fresh.clear()
    _pending.clear()
    _writes = 0
    if holders or also:
        Tensor.realize(*(h.whole for h in holders), *also)
    for h in holders:
        h.set(h.whole)  # a flat view taken before the realize would keep the graph alive


def discard_pending(h: Holder) -> None:
    """Forget a pending write to `h` (its holder now holds a realized buffer)."""
    _pending.pop(h, None)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """The values of `t` (on `xgrad`) on the host, realizing what they need and every pending write."""
    x = read(t)
    if x.dtype == dtypes.bfloat16:
        x = x.cast(dtypes.float32)
    if _pending:
        flush(x)  # one schedule for the pending writes and x
    return x.numpy()  # a whole realized buffer is read as it is: no copy kernel


def from_cpu(src: torch.Tensor) -> Tensor:
    """An xgrad Tensor (on xgrad's default device) with the values of the CPU tensor `src`."""
    src = src.detach().resolve_conj().resolve_neg()
    if src.dtype == torch.bfloat16:
        return Tensor(src.float().numpy().copy()).cast(dtypes.bfloat16)
    arr = src.numpy()
    if arr.shape == ():  # a buffer, not a constant: a value that changes (a step count, a learning rate) keeps kernels
        return Tensor(arr.reshape(1).copy(), dtype=to_xgrad_dtype(src.dtype)).reshape(())
    return Tensor(arr.copy(), dtype=to_xgrad_dtype(src.dtype))


def to_cpu_tensor(t: torch.Tensor) -> torch.Tensor:
    """A new CPU torch tensor with `t`'s values."""
    arr = to_numpy(t)
    if not (arr.flags.c_contiguous and arr.flags.writeable):
        arr = np.array(arr, order="C")  # (not ascontiguousarray: it makes a 0-d array 1-d)
    out = torch.from_numpy(arr)
    return out.to(torch.bfloat16) if t.dtype == torch.bfloat16 else out
