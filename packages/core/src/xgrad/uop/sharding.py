"""What the IR knows about multi-device nodes, read off the tensor graph without lowering it.

IR in: a tensor graph whose nodes may live on a device tuple (their DEVICE carries the tuple, or its one-string form
from `xgrad.device.multi_name`). Out: facts, no rewrite: the devices of a node (`devices_of`), the per-device shards
behind a realized multi-device buffer (`leaf_of`), and the axis a node is split on (`split_axis`, tinygrad's
`UOp.axis`). `xgrad.engine.multi` lowers the graph to one graph per device by the same rules (it imports the ones
below) and, under SPEC, checks that every node it lowers agrees with `split_axes`.
"""

from __future__ import annotations

from dataclasses import dataclass

from xgrad.device import multi_devices
from xgrad.dtype import dtypes
from xgrad.errors import XgradError
from xgrad.helpers import prod
from xgrad.uop.ops import GroupOp, Ops, UOp


@dataclass(frozen=True)
class MultiLeaf:
    """What a realized multi-device tensor holds: its logical shape, the split axis (None: replicated) and one
    realized view per device, each of the shard's shape."""

    shape: tuple[int, ...]
    axis: int | None
    shards: tuple[UOp, ...]


@dataclass(frozen=True)
class Split:
    """How a node on a device tuple is lowered: split on `axis` (None: replicas), and whether every shard is a view
    of a buffer (movement ops over a BUFFER: an assign can write through it)."""

    axis: int | None
    view: bool


_REPLICAS = Split(None, False)


def devices_of(u: UOp) -> tuple[str, ...] | None:
    """The device tuple of a logical node, None for a single-device (or device-less) node."""
    if u.op is Ops.DEVICE and isinstance(u.arg, tuple):
        return tuple(str(d) for d in u.arg)
    return multi_devices(u.device)


def leaf_of(u: UOp) -> MultiLeaf | None:
    """The shards behind a realized multi-device BUFFER (or a reshape of one to its logical shape)."""
    if u.op is Ops.RESHAPE and u.src[0].op is Ops.BUFFER:
        leaf = u.src[0].__dict__.get("multi")
        return leaf if isinstance(leaf, MultiLeaf) and leaf.shape == u.arg else None
    found = u.__dict__.get("multi") if u.op is Ops.BUFFER else None
    return found if isinstance(found, MultiLeaf) else None


def int_shape(u: UOp) -> tuple[int, ...]:
    """The shape of a node on several devices: every size concrete."""
    assert u.shape is not None, f"{u.op} has no shape"
    out = []
    for s in u.shape:
        if not isinstance(s, int):
            raise XgradError("symbolic shapes are not supported on several devices yet; bind the variable first")
        out.append(s)
    return tuple(out)


def reshape_split_axis(old: tuple[int, ...], new: tuple[int, ...], axis: int, n: int) -> int | None:
    """The axis of `new` that keeps every shard boundary of `old` split on `axis` over `n` devices: the one whose
    leading dims cover the same elements and whose size splits evenly. None: the reshape must gather first."""
    before = prod(old[:axis])
    return next((b for b in range(len(new)) if prod(new[:b]) == before and new[b] % n == 0 and new[b] > 1), None)


def _views(shards: tuple[UOp, ...]) -> bool:
    return all(s.base.op is Ops.BUFFER for s in shards)


def _gathered(x: Split, n: int) -> Split:
    """Replicas of the whole tensor: a gather keeps a view only on one device (nothing is copied or concatenated)."""
    return Split(None, x.view and n == 1)


def _split_of(u: UOp, srcs: list[Split], devices: tuple[str, ...]) -> Split:
    """How `u` (on `devices`) is split, from how its sources are; the rules of `xgrad.engine.multi.pm_shard`."""
    n = len(devices)
    op = u.op
    if op is Ops.BUFFER:
        if (leaf := leaf_of(u)) is None:  # `empty` on the tuple: one fresh buffer per device
            return Split(None, True)
        whole = Split(leaf.axis, _views(leaf.shards))
        return whole if leaf.axis in (None, 0) else _gathered(whole, n)  # the flat buffer is split in runs only on 0
    if op is Ops.RESHAPE:
        if (leaf := leaf_of(u)) is not None:
            return Split(leaf.axis, _views(leaf.shards))
        x = srcs[0]
        if x.axis is None:
            return x
        axis = reshape_split_axis(int_shape(u.src[0]), tuple(int(s) for s in u.arg), x.axis, n)
        return _gathered(x, n) if axis is None else Split(axis, x.view)
    if op is Ops.PERMUTE:
        x = srcs[0]
        return x if x.axis is None else Split(tuple(u.arg).index(x.axis), x.view)
    if op is Ops.EXPAND:
        return srcs[0]
    if op in (Ops.PAD, Ops.FLIP):
        x = srcs[0]
        return _gathered(x, n) if x.axis is not None and u.arg[x.axis] not in ((0, 0), False) else x
    if op is Ops.SHRINK:
        x = srcs[0]
        if x.axis is not None and tuple(u.arg[x.axis]) != (0, int_shape(u.src[0])[x.axis]):
            return _REPLICAS  # a slice across shards: the parts are copied to every device
        return x
    if op is Ops.REDUCE_AXIS:
        x = srcs[0]
        return Split(None if x.axis is None or x.axis in u.arg[1] else x.axis, False)
    if op is Ops.COPY:
        x = srcs[0]
        if devices_of(u.src[0]) != devices:  # onto the tuple from one device or another tuple: real copies
            return Split(u.arg, False)
        if x.axis == u.arg or x.axis is None:  # the same split, or replicas shrunk to each device's part
            return Split(u.arg, x.view)
        return Split(u.arg, x.view and n == 1)
    if op is Ops.ASSIGN:
        # through a view of each shard's buffer: per shard, split like the target; else each device writes its rows
        return Split(srcs[0].axis, False) if srcs[0].view else _REPLICAS
    if op in GroupOp.Elementwise or op in (Ops.CONTIGUOUS, Ops.CONTIGUOUS_BACKWARD, Ops.DETACH):
        axis = next((x.axis for x, s in zip(srcs, u.src) if s.shape is not None and x.axis is not None), None)
        return Split(axis, False)
    return _REPLICAS  # CONST, IOTA, DEVICE (and ops the lowering refuses on several devices)


def split_axes(roots: list[UOp]) -> dict[UOp, Split]:
    """How every node on a device tuple under `roots` is lowered (single-device and device-less nodes are left out)."""
    out: dict[UOp, Split] = {}
    for u in UOp(Ops.SINK, dtypes.void, tuple(roots)).walk():
        if u.op is not Ops.SINK and (devices := devices_of(u)) is not None:
            out[u] = _split_of(u, [out.get(s, _REPLICAS) for s in u.src], devices)
    return out


def split_axis(u: UOp) -> int | None:
    """The axis a multi-device node is split on (None: replicated, or a single-device node).

    >>> from xgrad import Tensor
    >>> t = Tensor([[1, 2], [3, 4]]).shard(("CPU", "CPU:1"), axis=1)
    >>> split_axis(t.uop), split_axis(t.sum(0).uop), split_axis(t.sum(1).uop)
    (1, 0, None)
    """
    if devices_of(u) is None:
        return None
    if (leaf := leaf_of(u)) is not None:
        return leaf.axis
    return split_axes([u])[u].axis


def split_bounds(u: UOp) -> list[tuple[int, int]] | None:
    """Each device's (start, end) along the split axis of a multi-device node, in device order; None when it is not
    split over devices."""
    devices, axis = devices_of(u), split_axis(u)
    if devices is None or axis is None or u.shape is None:
        return None
    size = u.shape[axis] // len(devices)
    assert isinstance(size, int), "a sharded axis has a concrete size"
    return [(k * size, (k + 1) * size) for k in range(len(devices))]


__all__ = [
    "MultiLeaf",
    "Split",
    "devices_of",
    "int_shape",
    "leaf_of",
    "reshape_split_axis",
    "split_axes",
    "split_axis",
    "split_bounds",
]
