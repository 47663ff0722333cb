"""Optimizer actions on a kernel AST, and the first heuristic that picks them.

IR in: a kernel AST (SINK of STOREs, RANGEs of kind LOOP/REDUCE). IR out: the same AST with ranges split and re-kinded:
the outermost output range becomes GLOBAL (parallel), some inner ranges become UPCAST (output lanes) or UNROLL
(reduction lanes), later expanded into straight-line code by `expand_lanes`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from xgrad.dtype import dtypes
from xgrad.helpers import NOOPT, prod
from xgrad.uop.ops import AxisType, KernelInfo, Ops, UOp
from xgrad.uop.pattern import PatternMatcher, UPat, graph_rewrite, substitute
from xgrad.uop.symbolic import simplify


@dataclass(frozen=True)
class Opt:
    """One optimizer action: `op` is "UPCAST", "UNROLL", "PADTO" or "GLOBAL"; `axis` indexes `kernel_ranges(ast)`;
    `amount` is the split factor (0 = the whole range), or for PADTO the multiple to pad the range to."""

    op: str
    axis: int
    amount: int = 0


def kernel_ranges(ast: UOp) -> list[UOp]:
    """The RANGEs of a kernel, output ranges first, each group in axis order."""
    rngs = [u for u in ast.toposort if u.op is Ops.RANGE]
    return sorted(rngs, key=lambda r: (r.arg[1] is AxisType.REDUCE or r.arg[1] is AxisType.UNROLL, r.arg[0]))


def range_size(r: UOp) -> int | None:
    end = r.src[0]
    return int(end.arg) if end.op is Ops.CONST else None


def apply_opt(ast: UOp, opt: Opt) -> UOp:
    rngs = kernel_ranges(ast)
    rng = rngs[opt.axis]
    axis_id, kind = rng.arg
    if opt.op == "GLOBAL":
        return substitute(ast, {rng: UOp.range(rng.src[0], axis_id, AxisType.GLOBAL)})
    if opt.op == "PADTO":
        return pad_range(ast, rng, opt.amount)
    size = range_size(rng)
    amount = opt.amount or size
    assert size is not None and amount and size % amount == 0, f"cannot split range of size {size} by {amount}"
    new_kind = AxisType.UPCAST if opt.op == "UPCAST" else AxisType.UNROLL
    next_id = max(r.arg[0] for r in rngs) + 1
    inner = UOp.range(amount, next_id, new_kind)
    if amount == size:
        return substitute(ast, {rng: inner})
    outer = UOp.range(size // amount, axis_id, kind)
    return graph_rewrite(substitute(ast, {rng: outer * amount + inner}), pm_reduce_ranges, name="reduce ranges")


def pad_range(ast: UOp, rng: UOp, multiple: int) -> UOp:
    """Grow an output range to a multiple of `multiple` (so it can be upcast); every memory access that depends on
    it is gated by `rng < original size`, so the extra iterations load nothing and store nothing."""
    size = range_size(rng)
    assert size is not None and rng.arg[1] is AxisType.LOOP, "PADTO applies to output loops of constant size"
    padded = UOp.range(-(-size // multiple) * multiple, rng.arg[0], rng.arg[1])
    return graph_rewrite(
        substitute(ast, {rng: padded}), pm_gate_padded, ctx=(padded, padded.lt(size)), name="gate padded range"
    )


def gate_index(ctx: tuple[UOp, UOp], idx: UOp) -> UOp | None:
    padded, valid = ctx
    if padded not in idx.src[1].toposort or (len(idx.src) == 3 and valid in idx.src[2].toposort):
        return None
    gate = valid if len(idx.src) == 2 else idx.src[2].logical_and(valid)
    return idx.replace(src=(idx.src[0], idx.src[1], gate))


pm_gate_padded = PatternMatcher(
    [
        (UPat(Ops.INDEX, name="idx"), gate_index),
    ]
)


def flatten_reduce_ranges(red: UOp) -> UOp | None:
    """After a split, a REDUCE lists an expression (outer*k + inner) where it listed a RANGE: list both ranges."""
    if all(r.op is Ops.RANGE for r in red.src[1:]):
        return None
    rngs = [x for r in red.src[1:] for x in r.toposort if x.op is Ops.RANGE]
    return red.replace(src=(red.src[0], *dict.fromkeys(rngs)))


pm_reduce_ranges = PatternMatcher(
    [
        (UPat(Ops.REDUCE, name="red"), flatten_reduce_ranges),
    ]
)


def _stores_contiguous_on(ast: UOp, rng: UOp) -> bool:
    """True when consecutive values of `rng` write consecutive elements (a vectorizable store)."""
    for store in ast.src:
        idx = store.src[0].src[1]
        zero = simplify(substitute(idx, {rng: UOp.const(dtypes.index, 0)}))
        one = simplify(substitute(idx, {rng: UOp.const(dtypes.index, 1)}))
        if simplify(one - zero).arg != 1:
            return False
    return True


def heuristic_opts(ast: UOp, vector_width: int = 4) -> list[Opt]:
    """The first heuristic. Each opt's axis indexes the ranges of the kernel after the opts before it.

    1. upcast the store-contiguous output axis by the vector width (vector loads, stores and ALU);
    2. in a reduction, also upcast another output axis by 4: a register tile of accumulators, so each loaded
       vector is reused 4 times (matmul, conv);
    3. unroll the innermost reduction by 4."""
    if NOOPT:
        return []
    opts: list[Opt] = []

    def add(opt: Opt) -> None:
        nonlocal ast
        opts.append(opt)
        ast = apply_opt(ast, opt)

    rngs = kernel_ranges(ast)
    outs = [r for r in rngs if r.arg[1] is AxisType.LOOP]
    has_reduce = any(r.arg[1] is AxisType.REDUCE for r in rngs)
    contiguous = next((r for r in reversed(outs) if _stores_contiguous_on(ast, r)), None)
    if contiguous is not None and (size := range_size(contiguous)) is not None:
        amount = next((w for w in (vector_width, 4) if w > 1 and size % w == 0 and (size > w or len(outs) > 1)), 0)
        if not amount and vector_width > 1 and size > 2 * vector_width:  # e.g. 1000: pad to 1008, then upcast
            add(Opt("PADTO", kernel_ranges(ast).index(contiguous), vector_width))
            contiguous = next(r for r in kernel_ranges(ast) if r.arg[0] == contiguous.arg[0])
            amount = vector_width
        if amount:
            add(Opt("UPCAST", kernel_ranges(ast).index(contiguous), amount))
    if has_reduce:
        split_axis = contiguous.arg[0] if contiguous is not None else -1  # its outer part keeps the axis id
        others = [r for r in kernel_ranges(ast) if r.arg[1] is AxisType.LOOP and r.arg[0] != split_axis]
        tile = next((r for r in reversed(others) if (n := range_size(r)) is not None and n % 4 == 0 and n > 4), None)
        if tile is not None and opts:
            add(Opt("UPCAST", kernel_ranges(ast).index(tile), 4))
    reds = [r for r in kernel_ranges(ast) if r.arg[1] is AxisType.REDUCE]
    if reds and (size := range_size(reds[-1])) is not None and size % 4 == 0 and size >= 8:
        add(Opt("UNROLL", kernel_ranges(ast).index(reds[-1]), 4))
    return opts


def optimize(ast: UOp, opts: list[Opt] | None = None, vector_width: int = 4) -> UOp:
    """Apply `opts` (default: the heuristic), then make the outermost output loop GLOBAL."""
    chosen = heuristic_opts(ast, vector_width) if opts is None else opts
    for opt in chosen:
        ast = apply_opt(ast, opt)
    loops = [r for r in kernel_ranges(ast) if r.arg[1] is AxisType.LOOP]
    if loops:
        ast = apply_opt(ast, Opt("GLOBAL", kernel_ranges(ast).index(loops[0])))
    info = ast.arg if isinstance(ast.arg, KernelInfo) else KernelInfo()
    return ast.replace(arg=KernelInfo(info.name, tuple(chosen), True))


# ---- expanding UPCAST/UNROLL ranges into lanes ----
def _lane_ranges(u: UOp, kinds: tuple[AxisType, ...]) -> list[UOp]:
    return sorted((x for x in u.toposort if x.op is Ops.RANGE and x.arg[1] in kinds), key=lambda r: r.arg[0])


def _lanes(u: UOp, rngs: list[UOp]) -> list[UOp]:
    sizes = [range_size(r) or 1 for r in rngs]
    out = []
    for combo in itertools.product(*(range(s) for s in sizes)):
        out.append(substitute(u, {r: UOp.const(dtypes.index, v) for r, v in zip(rngs, combo)}))
    return out


def _combine(op: Ops, vals: list[UOp]) -> UOp:
    ret = vals[0]
    for v in vals[1:]:
        ret = UOp(op, ret.dtype, (ret, v))
    return ret


def expand_unroll(red: UOp) -> UOp | None:
    """REDUCE over UNROLL ranges: combine the lanes in straight-line code, keep looping over the rest."""
    unrolls = [r for r in red.src[1:] if r.arg[1] is AxisType.UNROLL]
    if not unrolls:
        return None
    rest = tuple(r for r in red.src[1:] if r.arg[1] is not AxisType.UNROLL)
    value = _combine(red.arg, _lanes(red.src[0], unrolls))
    return UOp(Ops.REDUCE, red.dtype, (value, *rest), red.arg) if rest else value


def expand_upcast(sink: UOp) -> UOp | None:
    """A STORE that depends on UPCAST ranges becomes one STORE per lane."""
    stores: list[UOp] = []
    changed = False
    for st in sink.src:
        ups = _lane_ranges(st, (AxisType.UPCAST,))
        if ups:
            changed = True
            stores.extend(_lanes(st, ups))
        else:
            stores.append(st)
    return sink.replace(src=tuple(stores)) if changed else None


pm_expand_lanes = PatternMatcher(
    [
        (UPat(Ops.REDUCE, name="red"), expand_unroll),
    ]
)


def expand_lanes(ast: UOp) -> UOp:
    ast = graph_rewrite(ast, pm_expand_lanes, name="expand unroll")
    return expand_upcast(ast) or ast


def estimate_trips(ranges: list[UOp]) -> int:
    return int(prod(range_size(r) or 1 for r in ranges))
