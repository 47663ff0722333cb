"""The PACK optimizer action: copy the panel of an input that a reduction reads with a large stride into a small
contiguous scratch buffer, once per iteration of the outer loops it depends on, and read the copy in the reduction.

IR in: a kernel AST (after the splits of `opt.apply_opt`). IR out: the same AST where one LOAD inside a REDUCE reads a
scratch PARAM instead, plus a STORE (first in the SINK) that fills the scratch in loops of its own.

Why: in a matmul the right operand is read as a panel of K rows x (a few vectors) with a row stride of N floats. With
N a power of two every row of the panel falls in the same few cache sets, so the panel never stays in cache and each
row tile reads it again from L3 or memory. The packed panel is contiguous: it stays in L1/L2 for all the row tiles.

A scratch PARAM has a negative arg (-1 - slot) and one source, the CONST number of elements; renderers that declare
`supports_scratch` print it as a local array (see the CPU renderer). The linearizer orders every read of a scratch
after the loops that fill it (`linearize.order_scratch_reads`).
"""

from __future__ import annotations

from xgrad.dtype import dtypes
from xgrad.helpers import prod
from xgrad.uop.ops import AxisType, Ops, UOp
from xgrad.uop.pattern import substitute
from xgrad.uop.symbolic import simplify

MAX_SCRATCH_BYTES = 512 * 1024  # a panel larger than half of L2 would not stay in cache anyway (and lives on a stack)
_OUTPUT_KINDS = (AxisType.GLOBAL, AxisType.LOOP)
_REDUCE_KINDS = (AxisType.REDUCE, AxisType.UNROLL)
_ORDER = {AxisType.GLOBAL: 0, AxisType.LOCAL: 1, AxisType.LOOP: 2}


class PackError(ValueError):
    """PACK does not apply to this load (the message says why); BEAM skips such a candidate."""


def is_scratch(u: UOp) -> bool:
    return u.op is Ops.PARAM and isinstance(u.arg, int) and u.arg < 0


def scratch_size(u: UOp) -> int:
    """Elements of a scratch PARAM."""
    return int(u.src[0].arg)


def packable_loads(ast: UOp) -> list[UOp]:
    """The LOADs of input buffers inside REDUCE values, in a stable order; PACK's axis indexes this list."""
    seen: dict[UOp, None] = {}
    for red in ast.toposort:
        if red.op is not Ops.REDUCE:
            continue
        for u in red.src[0].toposort:
            if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.PARAM and not is_scratch(u.src[0].src[0]):
                seen.setdefault(u, None)
    return list(seen)


def index_step(idx: UOp, rng: UOp) -> int | None:
    """How far apart `idx` points for consecutive values of `rng` (None: not a constant)."""
    zero = simplify(substitute(idx, {rng: UOp.const(dtypes.index, 0)}))
    one = simplify(substitute(idx, {rng: UOp.const(dtypes.index, 1)}))
    diff = simplify(one - zero)
    return int(diff.arg) if diff.op is Ops.CONST else None


def _ranges(u: UOp) -> list[UOp]:
    return sorted((x for x in u.toposort if x.op is Ops.RANGE), key=lambda r: r.arg[0])


def _size(r: UOp) -> int | None:
    return int(r.src[0].arg) if r.src[0].op is Ops.CONST else None


def _linear(rngs: list[UOp]) -> UOp:
    """Row-major position of `rngs` (the last one contiguous)."""
    out = UOp.const(dtypes.index, 0)
    for r in rngs:
        out = out * (_size(r) or 1) + r
    return out


def _loop_key(r: UOp) -> tuple[int, int]:
    return (_ORDER.get(r.arg[1], 9), r.arg[0])


def check_pack(ast: UOp, load: UOp, whole: bool = False) -> tuple[list[UOp], list[UOp], list[UOp], list[UOp]]:
    """(panel ranges, upcast ranges, outer loops, inner loops) of `load`, or PackError when PACK does not apply. The
    panel ranges are the reductions, led by the output loops the load reads that run inside all the loops it does not
    read (the inner part of a SPLIT: the panel then holds several register tiles, one after the other). `whole`: the
    parallel loop does not read the load (a conv's weights with the batch parallel), and the panel holds it for every
    iteration of every loop it reads, filled once per call before the parallel loop (PACK's amount 1)."""
    rngs = _ranges(simplify(load.src[0]))  # unsimplified index math may name ranges it does not depend on
    reds = [r for r in rngs if r.arg[1] in _REDUCE_KINDS]
    ups = [r for r in rngs if r.arg[1] is AxisType.UPCAST]
    outer = [r for r in rngs if r.arg[1] in _OUTPUT_KINDS]
    loops = [r for r in ast.toposort if r.op is Ops.RANGE and r.arg[1] in _OUTPUT_KINDS]
    inner = [r for r in loops if r not in outer]
    if not reds:
        raise PackError("the load does not depend on a reduction: nothing to reuse")
    if any(_size(r) is None for r in reds + ups):
        raise PackError("PACK needs reduction and upcast ranges of constant size")
    if any(r.arg[1] is AxisType.GLOBAL for r in outer) == whole:
        raise PackError(
            "whole PACK (amount 1) needs a load the parallel (GLOBAL) loop does not read"
            if whole
            else "PACK needs the parallel (GLOBAL) loop among the loops the load depends on"
        )
    if not inner:
        raise PackError("the load depends on every output loop: the packed panel would never be reused")
    first_inner = min(_loop_key(r) for r in inner)
    # loops the load depends on that run inside every loop it does not (the inner part of a SPLIT) join the panel;
    # a whole panel takes every loop the load depends on, and they move inside the ones it does not
    wide = outer if whole else [r for r in outer if _loop_key(r) > first_inner]
    outer = [r for r in outer if r not in wide]
    if any(
        r.arg[1] is not AxisType.LOOP or _size(r) is None or (not whole and _loop_key(r) < max(map(_loop_key, inner)))
        for r in wide
    ):
        raise PackError("a loop the load does not depend on runs outside one it does: the panel would be repacked")
    reds = wide + reds  # the panel is laid out one block (of the wide loops) after the other
    if prod(_size(r) or 1 for r in reds + ups) * load.dtype.itemsize > MAX_SCRATCH_BYTES:
        raise PackError(f"the packed panel would exceed {MAX_SCRATCH_BYTES} bytes")
    return reds, ups, outer, inner


def apply_pack(ast: UOp, which: int, whole: bool = False) -> UOp:
    """PACK the `which`-th of `packable_loads(ast)` (`whole`: see `check_pack`)."""
    loads = packable_loads(ast)
    if not 0 <= which < len(loads):
        raise PackError(f"PACK axis {which} is out of range: the kernel has {len(loads)} packable loads")
    load = loads[which]
    reds, ups, _, inner = check_pack(ast, load, whole)
    slots = [u for u in ast.toposort if is_scratch(u)]
    size = int(prod(_size(r) or 1 for r in reds + ups))
    scratch = UOp(Ops.PARAM, load.dtype, (UOp.const(dtypes.index, size),), -1 - len(slots))
    all_ids = [r.arg[0] for r in ast.toposort if r.op is Ops.RANGE]
    next_id = max(all_ids) + 1
    # the fill loops: fresh copies of the reduce ranges (plain loops) and of the upcast ranges (lanes). They nest by
    # the stride they read the input with, largest outermost, whatever the panel's layout: a matmul's panel of S
    # sub-panels is filled row by row of B (S * lanes contiguous floats), not sub-panel by sub-panel (one cache line
    # per row of B, each in another page, where hardware prefetchers do not follow): 0.82 -> 0.59 ms for the 1024^2
    # matmul's packing
    idx = load.src[0].src[1]
    nesting = sorted(reds, key=lambda r: -abs(step) if (step := index_step(idx, r)) is not None else -(1 << 62))
    fill_reds = [UOp.range(r.src[0], next_id + nesting.index(r), AxisType.LOOP) for r in reds]
    next_id += len(fill_reds)
    # the loops the load does not depend on get later ids, so the fill loops open before them; the wide loops (the
    # reduce-like ones that are output loops) stay inside them
    later = sorted(inner, key=_loop_key) + [r for r in reds if r.arg[1] is AxisType.LOOP]
    renumber = {r: UOp.range(r.src[0], next_id + i, r.arg[1]) for i, r in enumerate(later)}
    next_id += len(renumber)
    fill_ups = [UOp.range(r.src[0], next_id + i, AxisType.UPCAST) for i, r in enumerate(ups)]
    lanes = int(prod(_size(r) or 1 for r in ups))
    fill_map = dict(zip(reds + ups, fill_reds + fill_ups))
    fill_value = UOp(Ops.LOAD, load.dtype, (substitute(load.src[0], fill_map),))
    fill_pos = _linear(fill_reds) * lanes + _linear(fill_ups)
    fill = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, load.dtype, (scratch, fill_pos)), fill_value))
    read_pos = _linear(reds) * lanes + _linear(ups)
    packed = UOp(Ops.LOAD, load.dtype, (UOp(Ops.INDEX, load.dtype, (scratch, read_pos)),))
    ast = substitute(ast, {load: packed})
    ast = ast.replace(src=(fill, *ast.src))
    return substitute(ast, renumber)


__all__ = [
    "MAX_SCRATCH_BYTES",
    "PackError",
    "apply_pack",
    "check_pack",
    "index_step",
    "is_scratch",
    "packable_loads",
    "scratch_size",
]
