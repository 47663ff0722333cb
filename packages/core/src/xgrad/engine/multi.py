"""Multi-device graphs: lower a logical graph on a tuple of devices into one graph per device, before scheduling.

IR in: the tensor graph, where some nodes live on a device tuple (their DEVICE carries the tuple, or its one-string
form from `xgrad.device.multi_name`). The leaves of those are CONST and IOTA on the tuple, realized multi buffers (a
BUFFER on the tuple whose `multi` entry holds a `MultiLeaf`: the per-device shards), and COPY to the tuple (arg: the
axis to split evenly, None to replicate).
IR out: the same tensor graph on single devices only. Each logical node becomes one node per device (`Sharded`):
elementwise ops run per shard (inputs with another sharding are resharded), movement ops that keep shard boundaries
run per shard (others gather first), a reduction over the sharded axis becomes a per-shard reduction plus an
allreduce, and every transfer is a COPY node, so it is a real COPY item of the schedule.

Allreduce: naive (every device adds all partials, in device order, so replicas agree bit for bit) or ring (the
flattened partials are cut into one chunk per device; a reduce-scatter of n-1 steps passes each chunk around the ring
adding as it goes, an all-gather of n-1 steps passes the finished chunks on). `RING=2` always uses the ring, `RING=1`
above `RING_ALLREDUCE_THRESHOLD` elements with more than two devices, `RING=0` never.

The table of this pass is `pm_shard` (op -> rule, applied by `graph_rewrite` with a `ShardCtx`); `schedule_multi`
runs it as the pass "multi-device lowering" and is the hook the realize engine calls.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from xgrad.buffer import Buffer, buffer_of, new_buffer_uop
from xgrad.device import multi_name
from xgrad.dtype import dtypes
from xgrad.engine.schedule import ScheduleItem
from xgrad.errors import DeviceError, ShardingError, XgradError
from xgrad.helpers import RING, RING_ALLREDUCE_THRESHOLD, SPEC, dedup, prod
from xgrad.uop.ops import GroupOp, Ops, UOp
from xgrad.uop.passes import run_pass
from xgrad.uop.pattern import PatternMatcher, UPat, graph_rewrite
from xgrad.uop.sharding import MultiLeaf, devices_of, int_shape, leaf_of, reshape_split_axis, split_axes, split_axis

_leaf_ids = itertools.count()


@dataclass(frozen=True)
class Sharded:
    """A logical node lowered: one single-device node per device of `devices`, split on `axis` (None: replicas)."""

    devices: tuple[str, ...]
    axis: int | None
    shards: tuple[UOp, ...]
    root_only: bool = False  # shards of different shapes (an assign across shards): only realized, never read

    @property
    def shape(self) -> tuple[int, ...]:
        """The logical (whole) shape."""
        sh = int_shape(self.shards[0])
        if self.axis is None:
            return sh
        return sh[: self.axis] + (sh[self.axis] * len(self.devices),) + sh[self.axis + 1 :]


Lowered = UOp | Sharded


# ---- reading multi-device facts off the logical graph (the IR's own: xgrad.uop.sharding) ----
def is_multi_graph(roots: list[UOp]) -> bool:
    """Whether any node under `roots` lives on a device tuple."""
    return any(u.op is Ops.DEVICE and devices_of(u) is not None for u in _sink(roots).walk())


def _sink(roots: list[UOp]) -> UOp:
    return UOp(Ops.SINK, dtypes.void, tuple(roots))


def multi_leaf(devices: tuple[str, ...], axis: int | None, shape: tuple[int, ...], shards: tuple[UOp, ...]) -> UOp:
    """A realized multi-device tensor node (a view of shape `shape`) over the per-device `shards`."""
    dtype = shards[0].dtype
    buf = UOp.buffer(multi_name(devices), prod(shape), dtype, next(_leaf_ids))
    buf.__dict__["multi"] = MultiLeaf(shape, axis, shards)
    return buf.reshape(shape)


def input_buffers(u: UOp) -> list[Buffer]:
    """The buffers of a realized tensor node: one, or one per device for a multi-device tensor (TinyJit inputs)."""
    if (leaf := leaf_of(u.base)) is not None or (leaf := leaf_of(u)) is not None:
        return [buffer_of(s) for s in leaf.shards]
    return [buffer_of(u)]


# ---- small builders ----
def _device(name: str) -> UOp:
    return UOp(Ops.DEVICE, arg=name)


def _copy(u: UOp, device: str) -> UOp:
    return UOp(Ops.COPY, u.dtype, (u, _device(device)))


def _chunk(shape: tuple[int, ...], axis: int, n: int, k: int) -> tuple[tuple[int, int], ...]:
    size = shape[axis] // n
    return tuple((k * size, (k + 1) * size) if i == axis else (0, s) for i, s in enumerate(shape))


def _check_even(shape: tuple[int, ...], axis: int, n: int) -> None:
    if shape[axis] % n:
        raise ShardingError(
            f"cannot split axis {axis} of shape {shape} evenly over {n} devices ({shape[axis]} % {n} != 0); "
            f"pick an axis whose size is a multiple of {n}, pad the tensor, or replicate it (axis=None)"
        )


def _concat(parts: list[UOp], axis: int) -> UOp:
    """Concatenate same-device parts along `axis`: zero-pad each to the whole and add (OR for bool)."""
    sizes = [int_shape(p)[axis] for p in parts]
    total = sum(sizes)
    out: UOp | None = None
    start = 0
    for p, sz in zip(parts, sizes):
        pads = tuple((start, total - start - sz) if i == axis else (0, 0) for i in range(len(int_shape(p))))
        padded = p.pad(pads)
        out = padded if out is None else out.alu(Ops.OR if p.dtype == dtypes.bool else Ops.ADD, padded)
        start += sz
    assert out is not None
    return out


# ---- transfers ----
def gather(x: Sharded, device: str) -> UOp:
    """The whole logical tensor on `device` (always a fresh copy: it never aliases a shard's memory)."""
    if x.axis is None:
        src = x.shards[x.devices.index(device)] if device in x.devices else x.shards[0]
        return _copy(src, device)
    parts = [s if d == device else _copy(s, device) for s, d in zip(x.shards, x.devices)]
    return _concat(parts, x.axis)


def reshard(x: Sharded, axis: int | None) -> Sharded:
    """`x` split on `axis` over the same devices (shrinking replicas costs nothing; others gather first)."""
    if x.axis == axis:
        return x
    n = len(x.devices)
    if x.axis is None:
        assert axis is not None
        _check_even(x.shape, axis, n)
        return Sharded(x.devices, axis, tuple(s.shrink(_chunk(x.shape, axis, n, k)) for k, s in enumerate(x.shards)))
    whole = Sharded(x.devices, None, tuple(gather(x, d) for d in x.devices))
    return reshard(whole, axis)


def use_ring(numel: int, n: int) -> bool:
    mode = int(RING.value)
    return n > 1 and (mode >= 2 or (mode == 1 and n > 2 and numel >= int(RING_ALLREDUCE_THRESHOLD.value)))


def allreduce(op: Ops, x: Sharded) -> Sharded:
    """Combine the per-device partials of `x` with `op`; every device gets the result (replicated)."""
    if len(x.devices) == 1:
        return Sharded(x.devices, None, x.shards)
    if use_ring(prod(int_shape(x.shards[0])), len(x.devices)):
        return _ring_allreduce(op, x)
    out = []
    for d in x.devices:  # the same order on every device: replicas agree bit for bit
        acc: UOp | None = None
        for s, sd in zip(x.shards, x.devices):
            part = s if sd == d else _copy(s, d)
            acc = part if acc is None else acc.alu(op, part)
        assert acc is not None
        out.append(acc)
    return Sharded(x.devices, None, tuple(out))


def _ring_allreduce(op: Ops, x: Sharded) -> Sharded:
    n = len(x.devices)
    shape = int_shape(x.shards[0])
    numel = prod(shape)
    bounds = [(numel * c // n, numel * (c + 1) // n) for c in range(n)]
    chunks = [c for c in range(n) if bounds[c][1] > bounds[c][0]]
    flat = [s.reshape((numel,)) for s in x.shards]
    part = [[f.shrink((bounds[c],)) for c in range(n)] for f in flat]  # part[device][chunk]
    for step in range(n - 1):  # reduce-scatter: chunk c travels c -> c+1 -> ..., each device adding its share
        for c in chunks:
            src, dst = (c + step) % n, (c + step + 1) % n
            part[dst][c] = part[dst][c].alu(op, _copy(part[src][c], x.devices[dst]))
    for step in range(n - 1):  # all-gather: the device that finished chunk c ((c-1) % n) passes it on
        for c in chunks:
            src, dst = (c - 1 + step) % n, (c + step) % n
            part[dst][c] = _copy(part[src][c], x.devices[dst])
    out = tuple(_concat([part[d][c] for c in chunks], 0).reshape(shape) for d in range(n))
    return Sharded(x.devices, None, out)


# ---- the rules: (node, lowered sources, devices) -> Sharded ----
ShardFn = Callable[[UOp, list[Lowered], tuple[str, ...]], Sharded]


def _per_shard(u: UOp, x: Sharded, arg_for: Callable[[int], object] | None = None) -> list[UOp]:
    return [u.replace(src=(s,), arg=u.arg if arg_for is None else arg_for(k)) for k, s in enumerate(x.shards)]


def shard_leaf(u: UOp, srcs: list[Lowered], devices: tuple[str, ...]) -> Sharded:
    """CONST and IOTA on a device tuple: the same leaf on every device."""
    return Sharded(devices, None, tuple(u.replace(src=(_device(d),)) for d in devices))


def shard_buffer(u: UOp, srcs: list[Lowered], devices: tuple[str, ...]) -> Sharded:
    leaf = leaf_of(u)
    if leaf is None:  # `empty` on the device tuple: one fresh buffer per device (replicated), kept with the node
        size = int(u.arg[1])
        leaf = MultiLeaf((size,), None, tuple(new_buffer_uop(d, size, u.dtype) for d in devices))
        u.__dict__["multi"] = leaf
    whole = Sharded(devices, leaf.axis, leaf.shards)
    if leaf.axis not in (None, 0):  # the flat buffer of a tensor split on a later axis is not split in runs
        whole = reshard(whole, None)
    return Sharded(devices, whole.axis, tuple(s.reshape((prod(int_shape(s)),)) for s in whole.shards))


def _sharded_srcs(u: UOp, srcs: list[Lowered], devices: tuple[str, ...]) -> list[Sharded]:
    out = []
    for lowered in srcs:
        if isinstance(lowered, Sharded):
            if lowered.root_only:
                raise XgradError("an assign across shards must be realized before its result is used; call .realize()")
            if lowered.devices != devices:
                raise DeviceError(f"{u.op.name} of tensors on {devices} and {lowered.devices}; move one with .to()")
            out.append(lowered)
        elif lowered.device is not None and lowered.op is not Ops.DEVICE:
            raise DeviceError(
                f"{u.op.name} of tensors on {devices} and {lowered.device}; "
                "shard or copy the single-device tensor first: .to(devices) or .shard(devices, axis)"
            )
        else:  # no device: a bare constant or a variable, the same on every device
            out.append(Sharded(devices, None, (lowered,) * len(devices)))
    return out


def shard_elementwise(u: UOp, srcs: list[Lowered], devices: tuple[str, ...]) -> Sharded:
    """ALU ops, casts, CONTIGUOUS, DETACH, ASSIGN: per shard, every input split like the first split input."""
    xs = _sharded_srcs(u, srcs, devices)
    real = [x for x, s in zip(xs, u.src) if s.shape is not None]
    axis = xs[0].axis if u.op is Ops.ASSIGN else next((x.axis for x in real if x.axis is not None), None)
    xs = [reshard(x, axis) if s.shape is not None else x for x, s in zip(xs, u.src)]
    shards = tuple(u.replace(src=tuple(x.shards[k] for x in xs)) for k in range(len(devices)))
    return Sharded(devices, axis, shards)


def shard_assign(u: UOp, srcs: list[Lowered], devices: tuple[str, ...]) -> Sharded:
    """ASSIGN per shard, the value split like the target; the target must stay a view of each shard's buffer."""
    target = srcs[0]
    if isinstance(target, Sharded) and any(s.base.op is not Ops.BUFFER for s in target.shards):
        view = u.src[0]
        inner = lower_multi([view.src[0]])[view.src[0]] if view.op is Ops.SHRINK else None
        if (
            not isinstance(inner, Sharded)
            or inner.axis is None
            or any(s.base.op is not Ops.BUFFER for s in inner.shards)
        ):
            raise XgradError(
                f"cannot assign into this view of a tensor on {devices} split on axis {split_axis(view.base)}: it "
                "moves the split axis; assign through a slice (shrink) or the whole tensor, or replicate it first"
            )
        return _assign_across(u, view.arg, inner, _sharded_srcs(u, srcs[1:2], devices)[0])
    return shard_elementwise(u, srcs, devices)


def _assign_across(u: UOp, ranges: tuple[tuple[int, int], ...], inner: Sharded, value: Sharded) -> Sharded:
    """Assign into a slice that cuts the split axis: each device writes its rows of the slice (from a replica of the
    value); a device whose shard the slice misses writes nothing."""
    assert inner.axis is not None
    axis, size = inner.axis, int_shape(inner.shards[0])[inner.axis]
    lo, hi = ranges[axis]
    whole = reshard(value, None)
    shards = []
    for k, target in enumerate(inner.shards):
        start, end = max(lo, k * size), min(hi, (k + 1) * size)
        if start >= end:
            shards.append(target)  # a realized view: nothing to schedule
            continue
        rows = tuple(
            (start - lo, end - lo) if i == axis else (0, int(n)) for i, n in enumerate(int_shape(whole.shards[k]))
        )
        local = tuple((start - k * size, end - k * size) if i == axis else r for i, r in enumerate(ranges))
        shards.append(u.replace(src=(target.shrink(local), whole.shards[k].shrink(rows))))
    return Sharded(inner.devices, None, tuple(shards), root_only=True)


def _gathered(u: UOp, x: Sharded) -> Sharded:
    whole = reshard(x, None)
    return Sharded(whole.devices, None, tuple(_per_shard(u, whole)))


def shard_reshape(u: UOp, srcs: list[Lowered], devices: tuple[str, ...]) -> Sharded:
    if (leaf := leaf_of(u)) is not None:
        return Sharded(devices, leaf.axis, leaf.shards)
    x = _sharded_srcs(u, srcs, devices)[0]
    if x.axis is None:
        return Sharded(devices, None, tuple(_per_shard(u, x)))
    n, new = len(devices), tuple(int(s) for s in u.arg)
    axis = reshape_split_axis(x.shape, new, x.axis, n)
    if axis is None:
        return _gathered(u, x)
    arg = tuple(s // n if i == axis else s for i, s in enumerate(new))
    return Sharded(devices, axis, tuple(_per_shard(u, x, lambda k: arg)))


def shard_permute(u: UOp, srcs: list[Lowered], devices: tuple[str, ...]) -> Sharded:
    x = _sharded_srcs(u, srcs, devices)[0]
    axis = None if x.axis is None else tuple(u.arg).index(x.axis)
    return Sharded(devices, axis, tuple(_per_shard(u, x)))


def shard_expand(u: UOp, srcs: list[Lowered], devices: tuple[str, ...]) -> Sharded:
    x = _sharded_srcs(u, srcs, devices)[0]
    if x.axis is None:
        return Sharded(devices, None, tuple(_per_shard(u, x)))
    size = int_shape(x.shards[0])[x.axis]
    arg = tuple(size if i == x.axis else s for i, s in enumerate(u.arg))
    return Sharded(devices, x.axis, tuple(_per_shard(u, x, lambda k: arg)))


def shard_pad_flip(u: UOp, srcs: list[Lowered], devices: tuple[str, ...]) -> Sharded:
    """PAD and FLIP run per shard unless they touch the split axis (then the tensor is gathered first)."""
    x = _sharded_srcs(u, srcs, devices)[0]
    if x.axis is not None and u.arg[x.axis] not in ((0, 0), False):
        return _gathered(u, x)
    return Sharded(devices, x.axis, tuple(_per_shard(u, x)))


def shard_shrink(u: UOp, srcs: list[Lowered], devices: tuple[str, ...]) -> Sharded:
    x = _sharded_srcs(u, srcs, devices)[0]
    if x.axis is None:
        return Sharded(devices, None, tuple(_per_shard(u, x)))
    size = int_shape(x.shards[0])[x.axis]
    if tuple(u.arg[x.axis]) != (0, x.shape[x.axis]):
        return _shrink_across(u, x, size)
    arg = tuple((0, size) if i == x.axis else r for i, r in enumerate(u.arg))
    return Sharded(devices, x.axis, tuple(_per_shard(u, x, lambda k: arg)))


def _shrink_across(u: UOp, x: Sharded, size: int) -> Sharded:
    """A slice of the split axis, replicated: each shard slices its part first, only those parts are copied."""
    assert x.axis is not None
    lo, hi = u.arg[x.axis]
    parts: list[tuple[str, UOp]] = []
    for k, (d, s) in enumerate(zip(x.devices, x.shards)):
        start, end = max(lo, k * size), min(hi, (k + 1) * size)
        if start < end:
            arg = tuple((start - k * size, end - k * size) if i == x.axis else r for i, r in enumerate(u.arg))
            parts.append((d, s.shrink(arg)))
    shards = []
    for d in x.devices:
        local = [p if pd == d and len(parts) > 1 else _copy(p, d) for pd, p in parts]  # one part: copy, never alias
        shards.append(_concat(local, x.axis))
    return Sharded(x.devices, None, tuple(shards))


def shard_reduce(u: UOp, srcs: list[Lowered], devices: tuple[str, ...]) -> Sharded:
    x = _sharded_srcs(u, srcs, devices)[0]
    partial = Sharded(devices, x.axis, tuple(_per_shard(u, x)))
    if x.axis is None or x.axis not in u.arg[1]:
        return partial
    return allreduce(u.arg[0], Sharded(devices, None, partial.shards))


def shard_copy(u: UOp, srcs: list[Lowered], devices: tuple[str, ...]) -> Sharded:
    """COPY to a device tuple: split (arg: axis) or replicate (arg None) a single-device tensor; reshard a multi one."""
    src = srcs[0]
    axis = u.arg
    n = len(devices)
    if isinstance(src, UOp):
        shape = int_shape(src)
        if axis is not None:
            _check_even(shape, axis, n)
        parts = [src if axis is None else src.shrink(_chunk(shape, axis, n, k)) for k in range(n)]
        return Sharded(devices, axis, tuple(_copy(p, d) for p, d in zip(parts, devices)))
    if src.devices == devices:
        return reshard(src, axis)
    whole = Sharded(devices, None, tuple(gather(src, d) for d in devices))
    return reshard(whole, axis)


# ---- the pass: pm_shard visits every node after its sources and records what it lowers to in ShardCtx ----
@dataclass
class ShardCtx:
    """What `pm_shard` has lowered so far: each visited node to itself (one device) or to its shards."""

    lowered: dict[UOp, Lowered] = field(default_factory=dict)


def shard_with(ctx: ShardCtx, u: UOp, rule: ShardFn | None) -> None:
    """Lower `u` (its sources are lowered already): by `rule` when it lives on a device tuple, else as one node."""
    srcs = [ctx.lowered[s] for s in u.src]
    devices = devices_of(u)
    if devices is None:
        ctx.lowered[u] = _lower_single(u, srcs)
    elif rule is None:
        raise XgradError(f"{u.op.name} is not supported on several devices ({devices}); gather with .to() first")
    else:
        ctx.lowered[u] = rule(u, srcs, devices)


def keep(ctx: ShardCtx, u: UOp) -> None:
    ctx.lowered[u] = u


def _rule(rule: ShardFn | None) -> Callable[..., None]:
    return functools.partial(shard_with, rule=rule)


SHARD_RULES: dict[Ops | frozenset[Ops], ShardFn] = {
    frozenset({Ops.CONST, Ops.IOTA}): shard_leaf,
    Ops.BUFFER: shard_buffer,
    Ops.RESHAPE: shard_reshape,
    Ops.PERMUTE: shard_permute,
    Ops.EXPAND: shard_expand,
    frozenset({Ops.PAD, Ops.FLIP}): shard_pad_flip,
    Ops.SHRINK: shard_shrink,
    Ops.REDUCE_AXIS: shard_reduce,
    Ops.COPY: shard_copy,
    Ops.ASSIGN: shard_assign,
    GroupOp.Elementwise | {Ops.CONTIGUOUS, Ops.CONTIGUOUS_BACKWARD, Ops.DETACH}: shard_elementwise,
}
_RULED = frozenset({Ops.SINK, Ops.DEVICE}).union(*(k if isinstance(k, frozenset) else {k} for k in SHARD_RULES))

# one rule per op (the rules record into ShardCtx and rewrite nothing, so the first that matches is the only one):
# a node on one device keeps its op with lowered sources; on a device tuple the op's rule splits it per device
pm_shard = PatternMatcher(
    [
        (UPat((Ops.SINK, Ops.DEVICE), name="u"), keep),
        *((UPat(ops, name="u"), _rule(rule)) for ops, rule in SHARD_RULES.items()),
        (UPat(frozenset(Ops) - _RULED, name="u"), _rule(None)),  # no rule: fine on one device only
    ]
)


def lower_multi(roots: list[UOp]) -> dict[UOp, Lowered]:
    """Every node under `roots` lowered: single-device nodes to themselves (with lowered sources), nodes on a device
    tuple to a `Sharded`."""
    ctx = ShardCtx()
    graph_rewrite(UOp(Ops.SINK, dtypes.void, tuple(roots)), pm_shard, ctx, name="shard")
    if SPEC:  # the IR's reading of each node's split (UOp.axis, Tensor.shard_axis) is what the lowering did
        _check_splits(roots, ctx.lowered)
    return ctx.lowered


def _check_splits(roots: list[UOp], lowered: dict[UOp, Lowered]) -> None:
    for u, split in split_axes(roots).items():
        if isinstance(got := lowered[u], Sharded):
            view = all(s.base.op is Ops.BUFFER for s in got.shards)
            assert (got.axis, view) == (split.axis, split.view), (
                f"{u.op.name} lowered split on {got.axis} (views of buffers: {view}), xgrad.uop.sharding says "
                f"{split.axis} ({split.view})"
            )


def shard_graph(sink: UOp, lowered: dict[UOp, Lowered]) -> UOp:
    """The pass: the graph under `sink` on single devices (a SINK of every root's shards); `lowered` gets each node's
    lowering."""
    lowered.update(lower_multi(list(sink.src)))
    return UOp(Ops.SINK, dtypes.void, tuple(dedup(s for r in sink.src for s in _shards_of(lowered[r]))))


def _lower_single(u: UOp, srcs: list[Lowered]) -> UOp:
    if u.op is Ops.COPY and isinstance(srcs[0], Sharded):
        dst = u.src[1].device
        assert dst is not None
        return gather(srcs[0], dst)
    if any(isinstance(s, Sharded) for s in srcs):
        multi = next(s for s in srcs if isinstance(s, Sharded))
        raise DeviceError(
            f"{u.op.name} of tensors on {u.device} and {multi.devices}; move one with .to() or .shard() first"
        )
    plain = [s for s in srcs if isinstance(s, UOp)]
    return u if all(a is b for a, b in zip(plain, u.src)) else u.replace(src=tuple(plain))


# ---- the realize hook ----
def _shards_of(v: Lowered) -> tuple[UOp, ...]:
    return v.shards if isinstance(v, Sharded) else (v,)


ScheduleFn = Callable[[list[UOp]], tuple[list[ScheduleItem], dict[UOp, UOp]]]


def schedule_multi(roots: list[UOp], schedule: ScheduleFn) -> tuple[list[ScheduleItem], dict[UOp, UOp], list[UOp]]:
    """Schedule `roots`, lowering multi-device nodes first. Returns the items, what each root becomes (a realized
    node: a buffer view, or a multi-device leaf over per-device views) and the per-device outputs to keep."""
    if not is_multi_graph(roots):
        items, single = schedule(roots)
        return items, single, [single[r] for r in roots if r in single]
    memo: dict[UOp, Lowered] = {}
    # every node on a device tuple becomes one node per device (pm_shard), before the schedule cache keys the graph
    lowered = run_pass("multi-device lowering", functools.partial(shard_graph, lowered=memo), _sink(roots))
    flat = list(lowered.src)
    items, done = schedule(flat)
    becomes: dict[UOp, UOp] = {}
    for r in roots:
        v = memo[r]
        if r.op is Ops.ASSIGN:
            becomes[r] = r.src[0]
        elif isinstance(v, Sharded):
            becomes[r] = multi_leaf(v.devices, v.axis, v.shape, tuple(done.get(s, s) for s in v.shards))
        elif v in done:
            becomes[r] = done[v]
    return items, becomes, [done[s] for s in flat if s in done]


__all__ = [
    "MultiLeaf",
    "Sharded",
    "allreduce",
    "devices_of",
    "gather",
    "input_buffers",
    "lower_multi",
    "multi_leaf",
    "ShardCtx",
    "pm_shard",
    "reshard",
    "schedule_multi",
]
