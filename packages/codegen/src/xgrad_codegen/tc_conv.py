"""A conv for the tensor cores: a sum of products over several ranges reshaped into one matmul, padded to the shape.

IR in: a kernel AST as `optimize` takes it whose one REDUCE(ADD) sums the product of two loads (each, or the
product, cast to the accumulator dtype). IR out: the same kernel with the output ranges that only the first load
reads merged into one range m, those only the second reads into one range n, and the reduce ranges into one range k
(each old range recovered from the merged one by division and modulo: im2col's indexing, without a copy), then m, n
and k each grown to a multiple of the instruction's shape: padded m and n iterations store nothing and their loads
are clamped or gated (PADTO's `opt.pad_range`), padded k steps load zeros (every load that reads k is gated by
k < its size). `tc.apply_tensor_core` then sees a plain matmul.

A conv's forward pass: m = (batch, output rows, output columns), n = output channels, k = (input channels, kernel
rows, kernel columns). Its weight gradient: m = output channels, n = (input channels, kernel rows, kernel columns),
k = (batch, output rows, output columns). A plain matmul (one range each) is left as it is: padding a matmul is
`tc.py`'s choice, not this module's.
"""

from __future__ import annotations

from xgrad.dtype import dtypes
from xgrad.helpers import prod
from xgrad.uop.ops import AxisType, Ops, UOp
from xgrad.uop.pattern import PatternMatcher, UPat, graph_rewrite, substitute
from xgrad.uop.symbolic import simplify
from xgrad_codegen.opt import OptError, gate_load, kernel_ranges, pad_range, pm_reduce_ranges, range_size
from xgrad_codegen.renderer import TensorCore

pm_gate_k = PatternMatcher(
    [
        (UPat(Ops.LOAD, name="ld"), gate_load),
    ]
)


def _exact_round_trip(u: UOp) -> bool:
    """`u` casts a value to a wider float and back (float16 -> float32 -> float16: the same value)."""
    if u.op is not Ops.CAST or u.src[0].op is not Ops.CAST:
        return False
    mid, inner = u.src[0], u.src[0].src[0]
    floats = all(dtypes.is_float(d) for d in (u.dtype, mid.dtype, inner.dtype))
    return floats and inner.dtype == u.dtype and mid.dtype.itemsize > u.dtype.itemsize


def _without_round_trips(ast: UOp) -> UOp:
    """`ast` with every exact cast round trip (`_exact_round_trip`, which autograd's graphs have) dropped."""
    trips = {u: u.src[0].src[0] for u in ast.toposort if _exact_round_trip(u)}
    return substitute(ast, trips) if trips else ast


def _loads(red: UOp) -> tuple[UOp, UOp] | None:
    """The two loads whose product `red` sums (through casts), or None."""
    value = red.src[0].src[0] if red.src[0].op is Ops.CAST else red.src[0]
    if value.op is not Ops.MUL:
        return None
    x, y = (s.src[0] if s.op is Ops.CAST else s for s in value.src)
    return (x, y) if x.op is Ops.LOAD and y.op is Ops.LOAD else None


def _reads(load: UOp) -> set[UOp]:
    return {u for u in simplify(load.src[0]).toposort if u.op is Ops.RANGE}


def merge_ranges(ast: UOp, rngs: list[UOp]) -> UOp:
    """`ast` with `rngs` (constant sizes, one kind) replaced by one range over all their combinations, the first's id
    and kind; the first of `rngs` varies slowest."""
    sizes = [range_size(r) or 0 for r in rngs]
    flat = UOp.range(int(prod(sizes)), rngs[0].arg[0], rngs[0].arg[1])
    replace: dict[UOp, UOp] = {}
    stride = int(prod(sizes))
    for r, size in zip(rngs, sizes):
        stride //= size
        replace[r] = (flat // stride) % size
    return graph_rewrite(substitute(ast, replace), pm_reduce_ranges, name="merge tc ranges")


def pad_reduce(ast: UOp, k: UOp, multiple: int) -> UOp:
    """`ast` with reduce range `k` grown to a multiple of `multiple`; the loads that read it are gated by k < its
    old size, so the added steps add zeros."""
    size = range_size(k) or 0
    if size % multiple == 0:
        return ast
    padded = UOp.range(-(-size // multiple) * multiple, k.arg[0], k.arg[1])
    out = substitute(ast, {k: padded})
    return graph_rewrite(out, pm_gate_k, ctx=(padded, padded.lt(size), None), name="gate padded tc reduce")


def as_matmul(ast: UOp, tc: TensorCore) -> UOp:
    """`ast` reshaped and padded into a matmul for `tc` (see the module docstring); `ast` itself when it is not a sum
    of products over several ranges (a plain matmul, or no sum of products at all: `tc.py` says why it refuses
    that); OptError when the sum of products is not a conv- or matmul-shaped one."""
    ast = _without_round_trips(ast)
    reds = [u for u in ast.toposort if u.op is Ops.REDUCE]
    if len(reds) != 1 or reds[0].arg is not Ops.ADD or reds[0].dtype != tc.acc or (loads := _loads(reds[0])) is None:
        return ast
    first, second = loads
    if first.dtype != tc.dtype or second.dtype != tc.dtype:
        return ast
    ks = list(reds[0].src[1:])
    a_reads, b_reads = _reads(first), _reads(second)
    loops = [r for r in kernel_ranges(ast) if r.arg[1] is AxisType.LOOP]
    ms = [r for r in loops if r in a_reads and r not in b_reads]
    ns = [r for r in loops if r in b_reads and r not in a_reads]
    if not ms or not ns or len(ms) + len(ns) + len(ks) == 3:
        return ast
    if any(k not in a_reads or k not in b_reads for k in ks):
        raise OptError(f"{tc.name}: every reduce range must be read by both operands (a conv's channels and window)")
    if any(range_size(r) is None for r in (*ms, *ns, *ks)):
        raise OptError(f"{tc.name} needs ranges of constant size to reshape a conv into a matmul")
    tm, tn, tk = tc.dims
    for group in (ms, ns, ks):
        ast = merge_ranges(ast, [next(r for r in kernel_ranges(ast) if r.arg[0] == g.arg[0]) for g in group])
    by_id = {r.arg[0]: r for r in kernel_ranges(ast)}
    ast = pad_reduce(ast, by_id[ks[0].arg[0]], tk)
    for rid, multiple in ((ms[0].arg[0], tm), (ns[0].arg[0], tn)):
        rng = next(r for r in kernel_ranges(ast) if r.arg[0] == rid)
        if (range_size(rng) or 0) % multiple:
            ast = pad_range(ast, rng, multiple)
    return ast
