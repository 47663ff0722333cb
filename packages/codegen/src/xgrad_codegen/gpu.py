"""GPU lowering: group reductions through shared memory, then workgroup axes onto the renderer's launch dimensions.

IR in: a kernel AST after `expand_lanes` whose ranges may be GLOBAL (a workgroup dimension), LOCAL (threads over
outputs) or GROUP (threads sharing one reduction). IR out: the same AST with
- each REDUCE over GROUP ranges split in two: every thread reduces its part, STOREs it into a DEFINE_LOCAL (shared
  memory, one slot per thread), a BARRIER waits for the group, then the group's slots are combined: in log2(n) halving
  steps (thread t < s combines slots t and t+s, a BARRIER after each) when the group has a power of two threads, the
  result read from slot 0 by every thread, else every thread adds up all n slots; the output STOREs are gated to the
  group's thread 0 (inside another reduction's loop, a BARRIER before the part's STORE keeps
  the next iteration's write from racing the reads of the previous one);
- GLOBAL ranges replaced by workgroup ids and LOCAL/GROUP ranges by thread ids (SPECIAL `gidx<d>` / `lidx<d>`, d = 0
  for x). More ranges than the renderer has dimensions are merged into one; a range over a dimension's limit (or a
  merged one) is spread over the dimensions as one linear id, and when no exact factorization fits, the extra ids are
  masked off (stores gated, loads clamped). Thread limits (`local_max`, `max_threads`, `shared_max`) raise OptError.
A renderer without `has_local` gets its AST back unchanged (and OptError if LOCAL or GROUP ranges are in it).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from xgrad.dtype import dtypes
from xgrad.helpers import prod
from xgrad.uop.ops import AxisType, Ops, UOp
from xgrad.uop.pattern import PatternMatcher, UPat, graph_rewrite, substitute
from xgrad.uop.symbolic import simplify
from xgrad_codegen.opt import OptError, pm_gate_padded, range_size
from xgrad_codegen.renderer import Renderer

THREAD_KINDS = (AxisType.LOCAL, AxisType.GROUP)


def _ranges(ast: UOp, kinds: tuple[AxisType, ...]) -> list[UOp]:
    return sorted((u for u in ast.toposort if u.op is Ops.RANGE and u.arg[1] in kinds), key=lambda r: r.arg[0])


@dataclass
class GroupCtx:
    """State of the group-reduction pass: the workgroup's thread ranges, the next shared slot and axis id."""

    threads: list[UOp]
    slots: itertools.count[int] = field(default_factory=itertools.count)
    next_axis: int = 0
    gated: dict[UOp, UOp] = field(default_factory=dict)  # lowered REDUCE result -> the condition "group thread 0"
    outermost: frozenset[UOp] = frozenset()  # REDUCEs inside no other REDUCE's value: they run once per thread


def _linear(rngs: list[UOp]) -> UOp:
    """The row-major linear index of `rngs` (the last varies fastest)."""
    out = UOp.const(dtypes.index, 0)
    for r in rngs:
        out = out * int(range_size(r) or 1) + r
    return out


def lower_group_reduce(ctx: GroupCtx, red: UOp) -> UOp | None:
    """A REDUCE over GROUP ranges -> the group's combined result (see the module docstring); None for any other."""
    groups = [r for r in red.src[1:] if r.arg[1] is AxisType.GROUP]
    if not groups:
        return None
    if red.dtype.count > 1:  # a tensor core's fragments: shared slots hold scalars
        raise OptError(f"GROUP does not apply to a reduction of {red.dtype!r} vectors (a tensor core's sum)")
    rest = tuple(r for r in red.src[1:] if r.arg[1] is not AxisType.GROUP)
    part = UOp(Ops.REDUCE, red.dtype, (red.src[0], *rest), red.arg) if rest else red.src[0]
    others = [r for r in ctx.threads if r not in groups]
    slots = int(prod(range_size(r) or 1 for r in ctx.threads))
    smem = UOp(Ops.DEFINE_LOCAL, red.dtype, (), (next(ctx.slots), slots))
    # inside another reduction's loop the slots are written again each iteration: first every thread must be done
    # reading the previous iteration's parts
    slot = smem if red in ctx.outermost else UOp(Ops.NOOP, red.dtype, (smem, UOp(Ops.BARRIER, dtypes.void, (part,))))
    base, lane = _linear(others), _linear(groups)
    width = int(prod(range_size(g) or 1 for g in groups))
    after = UOp(Ops.BARRIER, dtypes.void, (slot.index(base * width + lane).store(part),))  # every part is written
    if width & (width - 1) == 0:  # a power of two: halve the live slots each step, the result in slot 0
        step = width // 2
        while step:
            live = lane.lt(step)
            mem = UOp(Ops.NOOP, red.dtype, (smem, after))
            a, b = mem.index(base * width + lane, live).load(), mem.index(base * width + lane + step, live).load()
            combined = UOp(red.arg, red.dtype, (a, b))
            after = UOp(Ops.BARRIER, dtypes.void, (mem.index(base * width + lane, live).store(combined),))
            step //= 2
        final = UOp(Ops.NOOP, red.dtype, (smem, after)).index(base * width).load()
    else:  # every thread adds up the group's slots
        across = UOp.range(width, ctx.next_axis, AxisType.REDUCE)
        ctx.next_axis += 1
        value = UOp(Ops.NOOP, red.dtype, (smem, after)).index(base * width + across).load()
        final = UOp(Ops.REDUCE, red.dtype, (value, across), red.arg)
    ctx.gated[final] = lane.eq(0)
    return final


pm_group_reduce = PatternMatcher(
    [
        (UPat(Ops.REDUCE, name="red"), lower_group_reduce),
    ]
)


def _gate_group_stores(sink: UOp, gated: dict[UOp, UOp]) -> UOp:
    """Output STOREs whose value uses a group reduction's result: only the group's thread 0 writes."""
    stores = []
    for st in sink.src:
        conds = [c for final, c in gated.items() if final in st.src[1].toposort]
        if conds and st.op is Ops.STORE:
            idx = st.src[0]
            gate = conds[0]
            for c in conds[1:]:
                gate = gate.logical_and(c)
            gate = gate if len(idx.src) == 2 else idx.src[2].logical_and(gate)
            st = st.replace(src=(idx.replace(src=(idx.src[0], idx.src[1], gate)), *st.src[1:]))
        stores.append(st)
    return sink.replace(src=tuple(stores))


def lower_group_reduces(ast: UOp, renderer: Renderer) -> UOp:
    """REDUCEs over GROUP ranges combine their threads' parts through shared memory (see the module docstring)."""
    groups = _ranges(ast, (AxisType.GROUP,))
    if not groups:
        return ast
    if not renderer.supports_group_reduce:
        raise OptError(f"{type(renderer).__name__} has no workgroup shared memory: GROUP does not apply")
    threads = _ranges(ast, (AxisType.LOCAL,)) + groups
    all_ids = [u.arg[0] for u in ast.toposort if u.op is Ops.RANGE]
    reduces = [u for u in ast.toposort if u.op is Ops.REDUCE]
    nested = {x for r in reduces for x in r.src[0].toposort if x.op is Ops.REDUCE}
    ctx = GroupCtx(threads, next_axis=max(all_ids) + 1, outermost=frozenset(reduces) - nested)
    out = graph_rewrite(ast, pm_group_reduce, ctx=ctx, name="lower group reduces")
    shared = sum(int(u.arg[1]) * u.dtype.itemsize for u in out.toposort if u.op is Ops.DEFINE_LOCAL)
    if shared > renderer.shared_max:
        raise OptError(
            f"the group reductions need {shared} bytes of shared memory; the renderer has {renderer.shared_max}"
        )
    return _gate_group_stores(out, ctx.gated)


# ---- workgroup axes -> launch dimensions ----
def _special(name: str, size: UOp) -> UOp:
    if size.op is Ops.CONST:
        return UOp(Ops.SPECIAL, dtypes.index, (), (name, int(size.arg)))
    return UOp(Ops.SPECIAL, dtypes.index, (size,), (name, int(size.vmax)))


def _largest_divisor(n: int, at_most: int) -> int:
    """The largest divisor of `n` that is at most `at_most`."""
    if n <= at_most:
        return n
    best = 1
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            for x in (d, n // d):
                if best < x <= at_most:
                    best = x
    return best


def _linear_dims(total: UOp, maxes: tuple[int, ...], prefix: str) -> tuple[UOp, UOp | None]:
    """One linear id over `total` items spread over the hardware dimensions: (the id, None when it covers exactly
    `total` ids, else the condition that it is one of them)."""
    if total.op is Ops.CONST:
        n = int(total.arg)
        sizes: list[int] = [] if n else [0]  # an empty kernel: no workgroups at all
        left = n if n else 1
        for m in maxes if n else ():
            d = _largest_divisor(left, m)
            sizes.append(d)
            left //= d
        if left != 1:  # no exact factorization within the limits: cover n with extra ids
            sizes, left = [], n
            for m in maxes:
                sizes.append(min(left, m))
                left = -(-left // sizes[-1])
            if left > 1:
                raise OptError(f"{n} workgroups exceed the launch limits {maxes}")
        dims = [UOp.const(dtypes.index, s) for s in sizes]
        exact = prod(sizes) == n
    else:  # a symbolic count: x as wide as allowed, y the rest (rounded up)
        if total.vmax > maxes[0] * (maxes[1] if len(maxes) > 1 else 1):
            raise OptError(f"up to {total.vmax} workgroups exceed the launch limits {maxes}")
        if total.vmax <= maxes[0]:
            dims, exact = [total], True
        else:
            dims, exact = [UOp.const(dtypes.index, maxes[0]), (total + (maxes[0] - 1)) // maxes[0]], False
    lin = UOp.const(dtypes.index, 0)
    stride: UOp = UOp.const(dtypes.index, 1)
    for d, size in enumerate(dims):
        lin = lin + _special(f"{prefix}{d}", size) * stride
        stride = stride * size
    return lin, None if exact else lin.lt(total)


def map_dims(rngs: list[UOp], maxes: tuple[int, ...], prefix: str) -> tuple[dict[UOp, UOp], UOp | None]:
    """Each range (outermost first) -> its expression in SPECIAL ids, and the validity condition (None: all valid)."""
    if not rngs:
        return {}, None
    ends = [r.src[0] for r in rngs]
    if len(rngs) <= len(maxes) and all(e.vmax <= maxes[len(rngs) - 1 - i] for i, e in enumerate(ends)):
        return {r: _special(f"{prefix}{len(rngs) - 1 - i}", e) for i, (r, e) in enumerate(zip(rngs, ends))}, None
    total = ends[0]
    for e in ends[1:]:
        total = total * e
    if all(e.op is Ops.CONST for e in ends):
        total = UOp.const(dtypes.index, int(prod(int(e.arg) for e in ends)))
    lin, valid = _linear_dims(total, maxes, prefix)
    mapping: dict[UOp, UOp] = {}
    inner: UOp = UOp.const(dtypes.index, 1)
    for r, e in reversed(list(zip(rngs, ends))):
        idx = lin // inner if not (inner.op is Ops.CONST and inner.arg == 1) else lin
        mapping[r] = idx if r is rngs[0] else idx % e
        inner = inner * e
    return mapping, valid


def lower_gpu_dims(ast: UOp, renderer: Renderer) -> UOp:
    """GLOBAL -> workgroup ids, LOCAL/GROUP -> thread ids within the renderer's limits (see the module docstring)."""
    threads = _ranges(ast, THREAD_KINDS)
    if not renderer.has_local:
        if threads:
            raise OptError(f"{type(renderer).__name__} has no workgroups: LOCAL and GROUP do not apply")
        return ast
    count = int(prod(range_size(r) or 0 for r in threads))
    if count > renderer.max_threads:
        raise OptError(f"{count} threads per workgroup exceed the renderer's {renderer.max_threads}")
    local, bad = map_dims(threads, renderer.local_max, "lidx")
    if bad is not None:
        raise OptError(f"workgroup ranges {[range_size(r) for r in threads]} do not fit local_max {renderer.local_max}")
    glob, valid = map_dims(_ranges(ast, (AxisType.GLOBAL,)), renderer.global_max, "gidx")
    ast = substitute(ast, {**local, **glob})
    if valid is None:
        return ast
    lin = valid.src[0]
    clamp = lin.minimum(valid.src[1] - 1)
    return graph_rewrite(ast, pm_gate_padded, ctx=(lin, valid, clamp), name="gate extra workgroups")


def lower_gpu(ast: UOp, renderer: Renderer) -> UOp:
    """Both GPU lowerings, then the index math over the new ids simplified (their bounds are known). A renderer
    without workgroups gets `ast` back unchanged."""
    if not renderer.has_local:
        return lower_gpu_dims(ast, renderer)  # raises if LOCAL/GROUP ranges reached a CPU renderer
    return simplify(lower_gpu_dims(lower_group_reduces(ast, renderer), renderer))
