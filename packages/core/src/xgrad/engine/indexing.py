"""Index lowering: one kernel boundary of the tensor graph in, its kernel AST out (the scheduler's last pass).

IR in: a tensor-graph node to compute (its kernel's output), with the nodes already realized into buffers.
IR out: SINK(STORE(INDEX(PARAM(0), index), value)): movement ops have become index expressions over RANGEs, buffers
are PARAMs (in the order the value first reads them, the output first) and reductions are REDUCE(value, *ranges).

How: the output node is wrapped in a push (an INDEX whose arg is `PUSH`: the node seen at the output's ranges, under
a gate), and `pm_push_index` moves pushes down the graph, one op per rule, until they reach a buffer or a constant.
Pushes are rewritten depth first, before their sources, an elementwise op's sources last to first: the order in which
`KernelCtx` numbers PARAMs and reduce RANGEs, the order every kernel AST has always had.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xgrad.buffer import Buffer, buffer_of
from xgrad.dtype import dtypes
from xgrad.errors import XgradError
from xgrad.helpers import SPEC, prod
from xgrad.uop.ops import AxisType, GroupOp, KernelInfo, Ops, UOp, sint
from xgrad.uop.pattern import PatternMatcher, UPat, graph_rewrite
from xgrad.uop.spec import check_kernel_ast
from xgrad.uop.symbolic import simplify
from xgrad.uop.symshape import is_symbolic, sym_prod

PUSH = "push"  # the arg of an INDEX that is a tensor node seen at an index: INDEX(node, gate, *index per axis)
NO_GATE = UOp.const(dtypes.bool, True)  # the gate of a push that is always valid


@dataclass
class KernelCtx:
    """What the index-lowering rules of one kernel share: the nodes realized into buffers (each to its BUFFER), the
    BUFFERs read so far in PARAM order (the output first) and the number of RANGEs made so far."""

    realizes: dict[UOp, UOp]
    params: list[UOp]
    n_ranges: int = 0
    # graph_rewrite's memo: index expressions and gates given to a push, loads and constants are final (no push
    # inside), so the rewrite does not walk them
    done: dict[UOp, UOp] = field(default_factory=dict)

    def param(self, buf: UOp) -> UOp:
        """The PARAM of BUFFER `buf`, numbered on first use."""
        if buf not in self.params:
            self.params.append(buf)
        return UOp(Ops.PARAM, buf.dtype, (), self.params.index(buf))

    def new_range(self, size: sint, kind: AxisType) -> UOp:
        rng = UOp.range(size, self.n_ranges, kind)
        self.n_ranges += 1
        return rng


# ---- index arithmetic ----
def shape_of(u: UOp) -> tuple[sint, ...]:
    """The shape of a tensor-graph node, with its concrete sizes as plain ints."""
    assert u.shape is not None, f"{u.op} has no shape"
    return tuple(s if isinstance(s, UOp) else int(s) for s in u.shape)


def concrete_shape(u: UOp) -> tuple[int, ...]:
    """The shape of a node whose sizes are all concrete."""
    shape = shape_of(u)
    assert not is_symbolic(shape), f"{u.op} has a symbolic shape here"
    return tuple(s for s in shape if isinstance(s, int))


def strides_for(shape: tuple[sint, ...]) -> tuple[sint, ...]:
    """Row-major strides of `shape` (0 for a size-1 axis)."""
    out: list[sint] = []
    acc: sint = 1
    for s in reversed(shape):
        out.append(acc if not (isinstance(s, int) and s == 1) else 0)
        acc = s if isinstance(acc, int) and acc == 1 else acc * s
    return tuple(reversed(out))


def flat_index(idxs: tuple[UOp, ...], shape: tuple[sint, ...]) -> UOp:
    """The row-major offset of the element at `idxs` in `shape`."""
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


def push(ctx: KernelCtx, u: UOp, idxs: tuple[UOp, ...], gate: UOp | None) -> UOp:
    """`u` seen at `idxs` (one index per axis), valid where `gate` holds (None: everywhere)."""
    done = ctx.done
    for i in idxs:
        done[i] = i
    if gate is None:
        gate = NO_GATE
    done[gate] = gate
    return UOp(Ops.INDEX, u.dtype, (u, gate, *idxs), PUSH)


def _parts(p: UOp) -> tuple[UOp, tuple[UOp, ...], UOp | None]:
    gate = p.src[1]
    return p.src[0], p.src[2:], None if gate is NO_GATE else gate


# ---- the rules: a push of one op becomes kernel IR, or pushes of its sources ----
def load_realized(ctx: KernelCtx, p: UOp) -> UOp | None:
    """A node realized into a buffer (a kernel boundary) is loaded, never computed again."""
    u, idxs, gate = _parts(p)
    if (buf := ctx.realizes.get(u)) is None:
        return None
    return load(ctx, buf, flat_index(idxs, shape_of(u)), gate)


def load(ctx: KernelCtx, buf: UOp, idx: UOp, gate: UOp | None) -> UOp:
    """A load from BUFFER `buf` at the flat index `idx` (final: the rewrite does not walk it)."""
    loaded = UOp(Ops.LOAD, buf.dtype, (ctx.param(buf).index(idx, gate),))
    ctx.done[loaded] = loaded
    return loaded


def lower_buffer(ctx: KernelCtx, p: UOp) -> UOp:
    u, idxs, gate = _parts(p)
    return load(ctx, u, idxs[0], gate)


def lower_const(ctx: KernelCtx, p: UOp) -> UOp:
    const = UOp.const(p.dtype, p.src[0].arg)
    ctx.done[const] = const
    return const


def lower_iota(ctx: KernelCtx, p: UOp) -> UOp:
    return p.src[2].cast(p.dtype)


def lower_reshape(ctx: KernelCtx, p: UOp) -> UOp:
    u, idxs, gate = _parts(p)
    in_shape = shape_of(u.src[0])
    if (axes := _unit_axes_only(in_shape, shape_of(u))) is not None:  # unsqueeze/squeeze: indexes pass through
        zero = UOp.const(dtypes.index, 0)
        return push(ctx, u.src[0], tuple(zero if a is None else idxs[a] for a in axes), gate)
    flat = flat_index(idxs, shape_of(u))
    new: list[UOp] = []
    acc: sint = 1
    for axis in reversed(range(len(in_shape))):
        dim = in_shape[axis]
        idx = flat if isinstance(acc, int) and acc == 1 else flat // acc
        new.append(UOp.const(dtypes.index, 0) if isinstance(dim, int) and dim == 1 else idx % dim if axis else idx)
        acc = dim if isinstance(acc, int) and acc == 1 else acc * dim
    return push(ctx, u.src[0], tuple(reversed(new)), gate)


def _unit_axes_only(in_shape: tuple[sint, ...], out_shape: tuple[sint, ...]) -> list[int | None] | None:
    """For a reshape that only adds or drops axes of size 1: per input axis, the output axis whose index it takes (None
    for a size-1 axis); None for any other reshape. Such a reshape needs no flat index: split back by a symbolic size,
    that index would be a division the simplifier cannot undo (its interval grows with the size squared)."""
    ins = [a for a, s in enumerate(in_shape) if not (isinstance(s, int) and s == 1)]
    outs = [a for a, s in enumerate(out_shape) if not (isinstance(s, int) and s == 1)]
    if len(ins) != len(outs) or any(not _same_size(in_shape[a], out_shape[b]) for a, b in zip(ins, outs)):
        return None
    by_input: list[int | None] = [None] * len(in_shape)
    for a, b in zip(ins, outs):
        by_input[a] = b
    return by_input


def _same_size(a: sint, b: sint) -> bool:
    return a is b if isinstance(a, UOp) or isinstance(b, UOp) else a == b


def lower_permute(ctx: KernelCtx, p: UOp) -> UOp:
    u, idxs, gate = _parts(p)
    new = [idxs[0]] * len(idxs)
    for out_axis, in_axis in enumerate(u.arg):
        new[in_axis] = idxs[out_axis]
    return push(ctx, u.src[0], tuple(new), gate)


def lower_expand(ctx: KernelCtx, p: UOp) -> UOp:
    u, idxs, gate = _parts(p)
    in_shape = shape_of(u.src[0])
    return push(ctx, u.src[0], tuple(UOp.const(dtypes.index, 0) if s == 1 else i for i, s in zip(idxs, in_shape)), gate)


def lower_pad(ctx: KernelCtx, p: UOp) -> UOp:
    """Outside the source the value is 0: its loads are gated off there, and a WHERE picks 0."""
    u, idxs, gate = _parts(p)
    in_shape = shape_of(u.src[0])
    valid: UOp | None = None
    new = []
    for i, (before, after), dim in zip(idxs, u.arg, in_shape):
        new.append(i - before if before else i)
        if before:
            valid = and_gate(valid, i.ge(before))
        if after:
            valid = and_gate(valid, i.lt(before + dim))
    inner = push(ctx, u.src[0], tuple(new), and_gate(gate, valid))
    return inner if valid is None else valid.where(inner, UOp.const(u.dtype, 0))


def lower_shrink(ctx: KernelCtx, p: UOp) -> UOp:
    u, idxs, gate = _parts(p)
    return push(ctx, u.src[0], tuple(i + s if s else i for i, (s, _) in zip(idxs, u.arg)), gate)


def lower_flip(ctx: KernelCtx, p: UOp) -> UOp:
    u, idxs, gate = _parts(p)
    in_shape = shape_of(u.src[0])
    return push(ctx, u.src[0], tuple((s - 1) - i if f else i for i, f, s in zip(idxs, u.arg, in_shape)), gate)


def lower_reduce(ctx: KernelCtx, p: UOp) -> UOp:
    """A new RANGE per reduced axis, summed over by a REDUCE."""
    u, idxs, gate = _parts(p)
    op, axes = u.arg
    in_shape = shape_of(u.src[0])
    new = list(idxs)
    ranges = []
    for a in axes:
        rng = ctx.new_range(in_shape[a], AxisType.REDUCE)
        new[a] = rng
        ranges.append(rng)
    return UOp(Ops.REDUCE, u.dtype, (push(ctx, u.src[0], tuple(new), gate), *ranges), op)


def lower_elementwise(ctx: KernelCtx, p: UOp) -> UOp:
    """Elementwise ops keep the index: the whole connected elementwise graph under `p` is rebuilt here at once (one
    push per node that is not elementwise or is realized), without recursion: a chain of thousands of `x = x + 1`."""
    u, idxs, gate = _parts(p)
    built: dict[UOp, UOp] = {}
    elementwise, realizes = GroupOp.Elementwise, ctx.realizes
    stack: list[tuple[UOp, bool]] = [(u, False)]
    while stack:
        node, ready = stack.pop()
        if node in built:
            continue
        if ready:
            built[node] = UOp(node.op, node.dtype, tuple([built[s] for s in node.src]), node.arg)
        elif node is not u and (node.op not in elementwise or node in realizes):
            built[node] = push(ctx, node, idxs, gate)
        else:
            stack.append((node, True))
            stack.extend([(s, False) for s in node.src if s not in built])
    return built[u]


def lower_identity(ctx: KernelCtx, p: UOp) -> UOp:
    u, idxs, gate = _parts(p)
    return push(ctx, u.src[0], idxs, gate)


def refuse(p: UOp) -> UOp:
    raise XgradError(f"the scheduler cannot lower {p.src[0].op} here; this is a bug in xgrad")


def _pushed(ops: Ops | frozenset[Ops]) -> UPat:
    """A push of a node whose op is among `ops`."""
    return UPat(Ops.INDEX, src=(UPat(ops),), arg=PUSH, name="p", allow_any_len=True)


# how each tensor-graph op turns an output index into kernel IR; the realized check comes first: a boundary is loaded
pm_push_index = PatternMatcher(
    [
        (UPat(Ops.INDEX, arg=PUSH, name="p"), load_realized),
        (_pushed(Ops.BUFFER), lower_buffer),
        (_pushed(Ops.CONST), lower_const),
        (_pushed(Ops.IOTA), lower_iota),
        (_pushed(Ops.RESHAPE), lower_reshape),
        (_pushed(Ops.PERMUTE), lower_permute),
        (_pushed(Ops.EXPAND), lower_expand),
        (_pushed(Ops.PAD), lower_pad),
        (_pushed(Ops.SHRINK), lower_shrink),
        (_pushed(Ops.FLIP), lower_flip),
        (_pushed(Ops.REDUCE_AXIS), lower_reduce),
        (_pushed(GroupOp.Identity), lower_identity),
        (_pushed(GroupOp.Elementwise), lower_elementwise),
        (UPat(Ops.INDEX, arg=PUSH, name="p"), refuse),  # no rule above took it
    ]
)


def push_index(u: UOp, idxs: tuple[UOp, ...], ctx: KernelCtx) -> UOp:
    """`u` at `idxs` as kernel IR."""
    ctx.done = {}
    pushed = push(ctx, u, idxs, None)
    return graph_rewrite(
        pushed, pm_push_index, ctx, name="push index", bottom_up=True, memo=ctx.done, last_source_first=True
    )


# ---- one kernel ----
def lower_kernel(node: UOp, out: UOp, realizes: dict[UOp, UOp]) -> tuple[UOp, list[UOp]]:
    """The kernel AST that computes `node` into BUFFER `out`, and the BUFFERs it uses in PARAM order."""
    ctx = KernelCtx(realizes, [out])
    shape = shape_of(node)
    value_node = node.src[0] if node.op is Ops.CONTIGUOUS else node
    target: UOp | None = None
    if node.op is Ops.ASSIGN:
        target, value_node = node.src
    # a size-1 axis is index 0, not a range: the output's ranges are numbered 0, 1, ... without it
    ranges = tuple(
        UOp.const(dtypes.index, 0) if isinstance(s, int) and s == 1 else ctx.new_range(s, AxisType.LOOP) for s in shape
    )
    # build the value with the output's own realization hidden, so it is computed, not loaded
    own = realizes.pop(node, None)
    value = push_index(value_node, ranges, ctx)
    if own is not None:
        realizes[node] = own
    if target is not None:  # an ASSIGN writes through the target's movement ops into its buffer
        fake_load = push_index(target, ranges, ctx)
        assert fake_load.op is Ops.LOAD, "assign target must be a view of a buffer"
        store_idx = fake_load.src[0]
    else:
        store_idx = ctx.param(out).index(flat_index(ranges, shape))
    ast = UOp(Ops.SINK, dtypes.void, (store_idx.store(value),), KernelInfo(kernel_name(value, shape)))
    if SPEC:
        check_kernel_ast(ast)
    return ast, ctx.params


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


# ---- views of realized nodes ----
def is_realized(u: UOp) -> bool:
    """A node that already has memory: a BUFFER, or movement ops on one."""
    return u.base.op is Ops.BUFFER


def is_contiguous_view(u: UOp) -> bool:
    """Only reshapes between `u` and its base: it reads its base's elements in order."""
    x = u
    while x.op in GroupOp.Movement:
        if x.op is not Ops.RESHAPE:
            return False
        x = x.src[0]
    return True


def contiguous_range(u: UOp) -> int | None:
    """If the view `u` of a buffer reads one contiguous run of it in order, the element offset of that run."""
    if not is_realized(u):
        return None
    if is_contiguous_view(u):
        return 0
    if is_symbolic(shape_of(u)):
        return None
    shape = shape_of(u)
    ranges = tuple(UOp.range(s, i) for i, s in enumerate(shape))
    loaded = push_index(u, ranges, KernelCtx({}, []))
    if loaded.op is not Ops.LOAD or len(loaded.src[0].src) != 2:
        return None
    diff = simplify(loaded.src[0].src[1] - flat_index(ranges, shape))
    return int(diff.arg) if diff.op is Ops.CONST and diff.arg >= 0 else None


def buffer_view(buf: UOp, shape: tuple[sint, ...]) -> UOp:
    """A realized node: its BUFFER seen in `shape`. A symbolic shape's buffer is allocated at the maximum size, and the
    values fill its first numel elements."""
    numel = sym_prod(shape)
    return (buf.shrink(((0, numel),)) if isinstance(numel, UOp) else buf).reshape(shape)


def range_view(u: UOp) -> Buffer:
    """A Buffer sharing the memory of the contiguous run that the view `u` reads (DISK slices copy from it)."""
    offset = contiguous_range(u)
    assert offset is not None, "copy source must be one contiguous run of a buffer"
    base = buffer_of(u)
    if offset == 0 and prod(concrete_shape(u)) == base.size:
        return base
    return Buffer(base.device, prod(concrete_shape(u)), u.dtype, base=base, offset=offset * u.dtype.itemsize)
