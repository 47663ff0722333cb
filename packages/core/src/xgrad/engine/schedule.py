"""The scheduler: tensor graph in, an ordered list of kernels and copies out.

IR in: the tensor graph (BUFFER, CONST, movement ops, ALU, REDUCE_AXIS, CONTIGUOUS, COPY, ASSIGN).
IR out: `ScheduleItem`s. A kernel item holds a kernel AST: SINK(STORE(INDEX(PARAM(0), index), value)) where
movement ops have become index expressions over RANGEs and reductions are REDUCE(value, *ranges).

Pipeline (`create_schedule`):
1. `find_realizes`: decide the kernel boundaries (outputs, contiguous, copies, assigns, reductions that would be
   recomputed behind an expand or that have several users, elementwise results over several buffers that an expand
   repeats RECOMPUTE_LIMIT times or more).
2. `lower_kernel`: for each boundary, push output indices down through movement ops (`pm_push_index` table) until
   they reach buffers: movement ops never copy.
3. order the items so that every kernel runs after the kernels whose outputs it reads.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from xgrad.buffer import Buffer
from xgrad.dtype import DType, dtypes
from xgrad.engine.kernel_buffers import realizes_for_buffer_limit
from xgrad.errors import XgradError
from xgrad.helpers import DEBUG, SPEC, SPLIT_REDUCEOP, prod
from xgrad.uop.ops import AxisType, GroupOp, KernelInfo, Ops, UOp, sint
from xgrad.uop.pattern import PatternMatcher, UPat, graph_rewrite
from xgrad.uop.symshape import is_symbolic, sint_max, sym_prod

_buffer_ids = itertools.count()


def new_buffer_uop(device: str, size: int, dtype: DType) -> UOp:
    """A BUFFER node with a fresh Buffer attached (allocated when first used)."""
    uop = UOp.buffer(device, size, dtype, next(_buffer_ids))
    uop.__dict__["buffer"] = Buffer(device, size, dtype)
    # its shape and device, known here: computing them on first use (cached_property misses) cost ~10 us of a cold
    # cached realize, and reading the result (`Tensor.numpy()`) asks for the device
    uop.__dict__["shape"] = (int(size),)
    uop.__dict__["device"] = device
    return uop


def buffer_of(u: UOp) -> Buffer:
    buf: Buffer = u.base.__dict__["buffer"]
    return buf


@dataclass
class ScheduleItem:
    """One step: a kernel (`ast` is its SINK) or a copy (`ast.op` is COPY). `bufs[0]` is the output."""

    ast: UOp
    bufs: tuple[Buffer, ...]
    device: str

    @property
    def is_copy(self) -> bool:
        return self.ast.op is Ops.COPY


# ---- 0. splitting big reductions ----
SPLIT_MIN = 1 << 15  # split only reductions of at least this many elements ...
SPLIT_MAX_OUTPUTS = 64  # ... into at most this many outputs (more outputs already give every core work)


def split_reduce(red: UOp) -> UOp | None:
    """A reduction of many elements into few outputs runs on one core; reduce k chunks first (in parallel, one kernel),
    then the k partial results (a second kernel)."""
    x = red.src[0]
    op, axes = red.arg
    if is_symbolic(_shape(x)):
        return None
    shape = _concrete(x)
    out_numel = prod(_concrete(red))
    reduced = prod(shape[a] for a in axes)
    if reduced < SPLIT_MIN or out_numel > SPLIT_MAX_OUTPUTS:
        return None
    if len(axes) == len(shape) and len(shape) > 1:  # everything: flatten first
        flat = UOp(Ops.REDUCE_AXIS, red.dtype, (x.reshape((reduced,)),), (op, (0,)))
        done = split_reduce(flat)
        return None if done is None else done.reshape(_shape(red))
    if len(axes) != 1:
        return None
    a = axes[0]
    lanes = 8  # a vector of neighbours per chunk: the partial kernel streams its chunk with vector loads
    k = next((k for k in (256, 128, 64, 32, 16) if shape[a] % (k * lanes) == 0), None)
    if k is None:
        return None
    # partial[i, l] reduces chunk i of the axis, lane l of every vector in it: each chunk is read contiguously
    split = x.reshape(shape[:a] + (k, shape[a] // (k * lanes), lanes) + shape[a + 1 :])
    partial = UOp(Ops.CONTIGUOUS, red.dtype, (UOp(Ops.REDUCE_AXIS, red.dtype, (split,), (op, (a + 1,))),))
    total = UOp(Ops.REDUCE_AXIS, red.dtype, (partial,), (op, (a, a + 1, a + 2)))
    return total.reshape(_shape(red))


pm_split_reduce = PatternMatcher(
    [
        (UPat(Ops.REDUCE_AXIS, name="red"), split_reduce),
    ]
)


# ---- 1. kernel boundaries ----
RECOMPUTE_LIMIT = 16  # an elementwise result repeated this many times by expands is computed once, into a buffer


def is_realized(u: UOp) -> bool:
    """A node that already has memory: a BUFFER, or movement ops on one."""
    return u.base.op is Ops.BUFFER


def find_realizes(roots: list[UOp], walk: dict[UOp, None]) -> set[UOp]:
    """The kernel boundaries of the graph under `roots`; `walk` is its SINK's topological order."""
    sink_order = list(walk)[:-1]
    users: dict[UOp, set[UOp]] = {u: set() for u in sink_order}
    for u in sink_order:
        for s in u.src:
            users[s].add(u)
    realizes: set[UOp] = {r for r in roots if not is_realized(r)}
    for u in sink_order:
        if u.op in (Ops.CONTIGUOUS, Ops.ASSIGN, Ops.COPY):
            realizes.add(u)
        if u.op is Ops.COPY and not (is_realized(u.src[0]) and contiguous_range(u.src[0]) is not None):
            realizes.add(u.src[0])
    # Walk users before sources, tracking how many times an expand between here and a boundary repeats each node.
    # Reductions: realize when repeated (they would be recomputed per broadcast element) or when several nodes use
    # them. Elementwise results that read several buffers: realize when repeated many times (a conv's input gradient
    # would recompute the activation's gradient for every window position that reads it). Each rule counts its own
    # repeats: what an elementwise boundary reads is not repeated for the elementwise rule, still is for reductions.
    repeats: dict[UOp, tuple[int, int]] = {}  # node -> (repeats for the reduction rule, for the elementwise rule)
    elementwise_cuts: set[UOp] = set()
    for u in reversed(sink_order):
        for_reduce = for_elementwise = 1
        for user in users[u]:
            if user in realizes and user not in elementwise_cuts:
                continue
            n_reduce, n_elementwise = repeats.get(user, (1, 1))
            if user in elementwise_cuts:
                n_elementwise = 1
            if user.op is Ops.EXPAND:
                factor = max(1, sint_max(sym_prod(user.shape or ())) // max(1, sint_max(sym_prod(u.shape or ()))))
                n_reduce, n_elementwise = n_reduce * factor, n_elementwise * factor
            for_reduce, for_elementwise = max(for_reduce, n_reduce), max(for_elementwise, n_elementwise)
        if u.op is Ops.REDUCE_AXIS and u not in realizes and (for_reduce > 1 or len(_consumers(u, users)) > 1):
            realizes.add(u)
            for_reduce = for_elementwise = 1
        elif (
            u.op in GroupOp.Elementwise
            and u not in realizes
            and for_elementwise >= RECOMPUTE_LIMIT
            and _reads_buffers(u, realizes, 2)
        ):
            realizes.add(u)
            elementwise_cuts.add(u)
        repeats[u] = (for_reduce, for_elementwise)
    realizes |= realizes_for_buffer_limit(sink_order, realizes)  # devices that bind few buffers per kernel
    return {r for r in realizes if not (is_realized(r) and _is_contiguous_view(r))}


def _reads_buffers(u: UOp, realizes: set[UOp], n: int) -> bool:
    """Whether computing `u` in a kernel loads at least `n` different buffers (kernel boundaries count as one)."""
    found: set[UOp] = set()
    seen: set[UOp] = set()
    stack = [u]
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        if x is not u and (x in realizes or x.op is Ops.BUFFER):
            found.add(x)
            if len(found) >= n:
                return True
        else:
            stack.extend(x.src)
    return False


def _consumers(u: UOp, users: dict[UOp, set[UOp]]) -> set[UOp]:
    """The nodes that use `u`, looking through movement ops."""
    out: set[UOp] = set()
    seen: set[UOp] = set()
    stack = list(users[u])
    while stack:  # no recursion: chains of movement ops can be long
        user = stack.pop()
        if user in seen:
            continue
        seen.add(user)
        if user.op in GroupOp.Movement:
            stack.extend(users[user])
        else:
            out.add(user)
    return out


# ---- 2. lowering one kernel ----
@dataclass
class KernelCtx:
    realizes: dict[UOp, UOp]  # tensor node -> its output BUFFER uop
    params: list[UOp]  # BUFFER uops in PARAM order; params[0] is the output
    axis: Any  # iterator of fresh axis ids
    memo: dict[tuple[UOp, tuple[UOp, ...], UOp | None], UOp]

    def param(self, buf: UOp) -> UOp:
        if buf not in self.params:
            self.params.append(buf)
        return UOp(Ops.PARAM, buf.dtype, (), self.params.index(buf))


def strides_for(shape: tuple[sint, ...]) -> tuple[sint, ...]:
    out: list[sint] = []
    acc: sint = 1
    for s in reversed(shape):
        out.append(acc if not (isinstance(s, int) and s == 1) else 0)
        acc = s if isinstance(acc, int) and acc == 1 else acc * s
    return tuple(reversed(out))


def flat_index(idxs: tuple[UOp, ...], shape: tuple[sint, ...]) -> UOp:
    ret = UOp.const(dtypes.index, 0)
    for i, st in zip(idxs, strides_for(shape)):
        if not (isinstance(st, int) and st == 0):
            ret = ret + i * st
    return ret


def and_gate(a: UOp | None, b: UOp | None) -> UOp | None:
    if a is None:
        return b
    if b is None:
        return a
    return a.logical_and(b)


def lower_buffer(ctx: KernelCtx, u: UOp, idxs: tuple[UOp, ...], gate: UOp | None) -> UOp:
    return UOp(Ops.LOAD, u.dtype, (ctx.param(u).index(idxs[0], gate),))


def lower_const(ctx: KernelCtx, u: UOp, idxs: tuple[UOp, ...], gate: UOp | None) -> UOp:
    return UOp.const(u.dtype, u.arg)


def lower_iota(ctx: KernelCtx, u: UOp, idxs: tuple[UOp, ...], gate: UOp | None) -> UOp:
    return idxs[0].cast(u.dtype)


def lower_reshape(ctx: KernelCtx, u: UOp, idxs: tuple[UOp, ...], gate: UOp | None) -> UOp:
    in_shape = _shape(u.src[0])
    flat = flat_index(idxs, _shape(u))
    new: list[UOp] = []
    acc: sint = 1
    for axis in reversed(range(len(in_shape))):
        dim = in_shape[axis]
        idx = flat if isinstance(acc, int) and acc == 1 else flat // acc
        new.append(UOp.const(dtypes.index, 0) if isinstance(dim, int) and dim == 1 else idx % dim if axis else idx)
        acc = dim if isinstance(acc, int) and acc == 1 else acc * dim
    return lower(ctx, u.src[0], tuple(reversed(new)), gate)


def lower_permute(ctx: KernelCtx, u: UOp, idxs: tuple[UOp, ...], gate: UOp | None) -> UOp:
    new = [idxs[0]] * len(idxs)
    for out_axis, in_axis in enumerate(u.arg):
        new[in_axis] = idxs[out_axis]
    return lower(ctx, u.src[0], tuple(new), gate)


def lower_expand(ctx: KernelCtx, u: UOp, idxs: tuple[UOp, ...], gate: UOp | None) -> UOp:
    in_shape = _shape(u.src[0])
    new = tuple(UOp.const(dtypes.index, 0) if s == 1 else i for i, s in zip(idxs, in_shape))
    return lower(ctx, u.src[0], new, gate)


def lower_pad(ctx: KernelCtx, u: UOp, idxs: tuple[UOp, ...], gate: UOp | None) -> UOp:
    in_shape = _shape(u.src[0])
    valid: UOp | None = None
    new = []
    for i, (before, after), dim in zip(idxs, u.arg, in_shape):
        new.append(i - before if before else i)
        if before:
            valid = and_gate(valid, i.ge(before))
        if after:
            valid = and_gate(valid, i.lt(before + dim))
    inner = lower(ctx, u.src[0], tuple(new), and_gate(gate, valid))
    return inner if valid is None else valid.where(inner, inner.const_like(0))


def lower_shrink(ctx: KernelCtx, u: UOp, idxs: tuple[UOp, ...], gate: UOp | None) -> UOp:
    return lower(ctx, u.src[0], tuple(i + s if s else i for i, (s, _) in zip(idxs, u.arg)), gate)


def lower_flip(ctx: KernelCtx, u: UOp, idxs: tuple[UOp, ...], gate: UOp | None) -> UOp:
    in_shape = _shape(u.src[0])
    return lower(ctx, u.src[0], tuple((s - 1) - i if f else i for i, f, s in zip(idxs, u.arg, in_shape)), gate)


def lower_reduce(ctx: KernelCtx, u: UOp, idxs: tuple[UOp, ...], gate: UOp | None) -> UOp:
    op, axes = u.arg
    in_shape = _shape(u.src[0])
    new = list(idxs)
    ranges = []
    for a in axes:
        rng = UOp.range(in_shape[a], next(ctx.axis), AxisType.REDUCE)
        new[a] = rng
        ranges.append(rng)
    value = lower(ctx, u.src[0], tuple(new), gate)
    return UOp(Ops.REDUCE, u.dtype, (value, *ranges), op)


def lower_elementwise(ctx: KernelCtx, u: UOp, idxs: tuple[UOp, ...], gate: UOp | None) -> UOp:
    """Elementwise nodes keep the index, so their whole connected DAG is lowered here without recursion: a chain of
    thousands of `x = x + 1` must not overflow Python's stack. Only other ops recurse (through `lower`)."""
    stack: list[tuple[UOp, bool]] = [(u, False)]
    while stack:
        node, ready = stack.pop()
        if (node, idxs, gate) in ctx.memo:
            continue
        if node.op not in GroupOp.Elementwise or node in ctx.realizes:
            lower(ctx, node, idxs, gate)
        elif ready:
            ctx.memo[(node, idxs, gate)] = node.replace(src=tuple(ctx.memo[(s, idxs, gate)] for s in node.src))
        else:
            stack.append((node, True))
            stack.extend((s, False) for s in node.src)
    return ctx.memo[(u, idxs, gate)]


def lower_identity(ctx: KernelCtx, u: UOp, idxs: tuple[UOp, ...], gate: UOp | None) -> UOp:
    return lower(ctx, u.src[0], idxs, gate)


LowerFn = Callable[[KernelCtx, UOp, tuple[UOp, ...], "UOp | None"], UOp]
# how each tensor-graph op turns an output index into kernel IR: the table of this pass
pm_push_index: dict[Ops, LowerFn] = {
    Ops.BUFFER: lower_buffer,
    Ops.CONST: lower_const,
    Ops.IOTA: lower_iota,
    Ops.RESHAPE: lower_reshape,
    Ops.PERMUTE: lower_permute,
    Ops.EXPAND: lower_expand,
    Ops.PAD: lower_pad,
    Ops.SHRINK: lower_shrink,
    Ops.FLIP: lower_flip,
    Ops.REDUCE_AXIS: lower_reduce,
    Ops.CONTIGUOUS_BACKWARD: lower_identity,
    Ops.DETACH: lower_identity,
    **{op: lower_elementwise for op in GroupOp.Elementwise},
}


def _shape(u: UOp) -> tuple[sint, ...]:
    assert u.shape is not None, f"{u.op} has no shape"
    return tuple(s if isinstance(s, UOp) else int(s) for s in u.shape)


def _concrete(u: UOp) -> tuple[int, ...]:
    shape = _shape(u)
    assert not is_symbolic(shape), f"{u.op} has a symbolic shape here"
    return tuple(s for s in shape if isinstance(s, int))


def buffer_view(buf: UOp, shape: tuple[sint, ...]) -> UOp:
    """A realized node: its BUFFER seen in `shape`. A symbolic shape's buffer is allocated at the maximum size, and the
    values fill its first numel elements."""
    numel = sym_prod(shape)
    return (buf.shrink(((0, numel),)) if isinstance(numel, UOp) else buf).reshape(shape)


def lower(ctx: KernelCtx, u: UOp, idxs: tuple[UOp, ...], gate: UOp | None) -> UOp:
    key = (u, idxs, gate)
    if (hit := ctx.memo.get(key)) is not None:
        return hit
    if (buf := ctx.realizes.get(u)) is not None:
        ret = lower_buffer(ctx, buf, (flat_index(idxs, _shape(u)),), gate)
    else:
        fn = pm_push_index.get(u.op)
        if fn is None:
            raise XgradError(f"the scheduler cannot lower {u.op} here; this is a bug in xgrad")
        ret = fn(ctx, u, idxs, gate)
    ctx.memo[key] = ret
    return ret


def lower_kernel(node: UOp, out: UOp, realizes: dict[UOp, UOp]) -> tuple[UOp, list[UOp]]:
    """The kernel AST that computes `node` into BUFFER `out`, and the BUFFERs it uses in PARAM order."""
    ctx = KernelCtx(realizes, [out], itertools.count(), {})
    shape = _shape(node)
    value_node = node.src[0] if node.op is Ops.CONTIGUOUS else node
    target: UOp | None = None
    if node.op is Ops.ASSIGN:
        target, value_node = node.src
    ranges = tuple(
        UOp.range(s, next(ctx.axis)) if not (isinstance(s, int) and s == 1) else UOp.const(dtypes.index, 0)
        for s in shape
    )
    # build the value with the output's own realization hidden, so it is computed, not loaded
    own = ctx.realizes.pop(node, None)
    value = lower(ctx, value_node, ranges, None)
    if own is not None:
        ctx.realizes[node] = own
    if target is not None:
        store_idx = _assign_index(ctx, target, ranges)
    else:
        store_idx = ctx.param(out).index(flat_index(ranges, shape))
    name = kernel_name(value, shape)
    ast = UOp(Ops.SINK, dtypes.void, (store_idx.store(value),), KernelInfo(name))
    if SPEC:
        from xgrad.uop.spec import check_kernel_ast

        check_kernel_ast(ast)
    return ast, ctx.params


def _assign_index(ctx: KernelCtx, target: UOp, ranges: tuple[UOp, ...]) -> UOp:
    """Where an ASSIGN writes: through the target's movement ops into its buffer."""
    fake_load = lower(ctx, target, ranges, None)
    assert fake_load.op is Ops.LOAD, "assign target must be a view of a buffer"
    return fake_load.src[0]


def kernel_name(value: UOp, shape: tuple[sint, ...]) -> str:
    """E_<output shape> for elementwise kernels, r_<output shape>_<reduced sizes> for reductions (a symbolic size
    shows as its variables' names)."""
    reduced = [_size_name(r.src[0]) for u in value.toposort if u.op is Ops.REDUCE for r in u.src[1:]]
    dims = [_size_name(s) for s in shape if not (isinstance(s, int) and s == 1)] or ["1"]
    return "_".join(["r" if reduced else "E", *dims, *map(str, reduced)])


def _size_name(s: sint) -> str:
    if isinstance(s, int) or s.op is Ops.CONST:
        return str(s if isinstance(s, int) else s.arg)
    return "".join(x.arg[0] for x in s.toposort if x.op is Ops.DEFINE_VAR) or "s"


# ---- 3. the whole schedule ----
class ScheduleStats:
    """How often the scheduler ran (tests count it: a TinyJit replay must not schedule)."""

    calls: int = 0


def create_schedule(roots: list[UOp]) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
    """Kernels and copies that realize `roots`, in order, and what each root becomes (a view of its new buffer)."""
    ScheduleStats.calls += 1
    if SPEC:
        from xgrad.uop.spec import check_tensor_graph

        check_tensor_graph(UOp(Ops.SINK, dtypes.void, tuple(roots)))
    original = roots
    if SPLIT_REDUCEOP:
        roots = list(graph_rewrite(UOp(Ops.SINK, dtypes.void, tuple(roots)), pm_split_reduce, name="split reduce").src)
    walk = UOp(Ops.SINK, dtypes.void, tuple(roots)).walk()  # once: not cached on a graph the caller may drop
    boundaries = find_realizes(roots, walk)
    order = assigns_after_readers([u for u in walk if u in boundaries])
    realizes: dict[UOp, UOp] = {}
    items: list[ScheduleItem] = []
    for node in order:
        shape = _shape(node)
        device = node.device
        assert device is not None, f"{node.op} has no device"
        if node.op is Ops.ASSIGN:
            target_buf = node.src[0].base
            realizes[node] = target_buf
            ast, params = lower_kernel(node, target_buf, realizes)
            items.append(ScheduleItem(ast, tuple(buffer_of(p) for p in params), device))
            continue
        out = new_buffer_uop(device, sint_max(sym_prod(shape)), node.dtype)
        if node.op is Ops.COPY:
            src = node.src[0]
            src_buf = buffer_of(realizes[src]) if src in realizes else _range_view(src)
            marker = UOp(Ops.COPY, node.dtype, (UOp(Ops.DEVICE, arg=src.device), UOp(Ops.DEVICE, arg=device)))
            items.append(ScheduleItem(marker, (buffer_of(out), src_buf), device))
        else:
            ast, params = lower_kernel(node, out, realizes)
            items.append(ScheduleItem(ast, tuple(buffer_of(p) for p in params), device))
        realizes[node] = out
    becomes = {}
    for orig, r in zip(original, roots):
        if r in realizes:
            buf = realizes[r]
            becomes[orig] = buffer_view(buf, _shape(r)) if r.op is not Ops.ASSIGN else r.src[0]
    if DEBUG >= 3:
        for i, it in enumerate(items):
            print(f"schedule {i}: {'copy' if it.is_copy else it.ast.arg.name} on {it.device} bufs={list(it.bufs)}")
    return items, becomes


def contiguous_range(u: UOp) -> int | None:
    """If the view `u` of a buffer reads one contiguous run of it in order, the element offset of that run."""
    if not is_realized(u):
        return None
    if _is_contiguous_view(u):
        return 0
    if is_symbolic(_shape(u)):
        return None
    from xgrad.uop.symbolic import simplify

    ctx = KernelCtx({}, [], itertools.count(), {})
    shape = _shape(u)
    ranges = tuple(UOp.range(s, i) for i, s in enumerate(shape))
    load = lower(ctx, u, ranges, None)
    if load.op is not Ops.LOAD or len(load.src[0].src) != 2:
        return None
    diff = simplify(load.src[0].src[1] - flat_index(ranges, shape))
    return int(diff.arg) if diff.op is Ops.CONST and diff.arg >= 0 else None


def _range_view(u: UOp) -> Buffer:
    """A Buffer sharing the memory of the contiguous run that the view `u` reads (DISK slices copy from it)."""
    offset = contiguous_range(u)
    assert offset is not None, "copy source must be one contiguous run of a buffer"
    base = buffer_of(u)
    if offset == 0 and prod(_concrete(u)) == base.size:
        return base
    return Buffer(base.device, prod(_concrete(u)), u.dtype, base=base, offset=offset * u.dtype.itemsize)


def assigns_after_readers(order: list[UOp]) -> list[UOp]:
    """Move each ASSIGN after the kernels that read the old value of its buffer (and what depends on the ASSIGN after
    it), keeping every other order: readers never depend on the assign, so this is still a valid order."""
    position = {u: float(i) for i, u in enumerate(order)}
    walks = {u: u.walk() for u in order}  # not cached on the nodes: the user may drop them (see `UOp.walk`)
    for u in order:
        if u.op is Ops.ASSIGN:
            target = u.src[0].base
            readers = [position[r] for r in order if r is not u and u not in walks[r] and target in walks[r]]
            position[u] = max([position[u], *(p + 0.5 for p in readers)])
        deps = [position[d] for d in order if d is not u and d in walks[u]]
        if deps and max(deps) >= position[u]:
            position[u] = max(deps) + 0.25
    return sorted(order, key=position.__getitem__)


def _is_contiguous_view(u: UOp) -> bool:
    x = u
    while x.op in GroupOp.Movement:
        if x.op is not Ops.RESHAPE:
            return False
        x = x.src[0]
    return True
