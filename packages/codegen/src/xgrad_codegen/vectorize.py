"""Vectorization: the scalar lanes that `expand_lanes` produced become vector loads, stores and ALU ops.

IR in: a kernel graph whose STOREs write neighbouring elements lane by lane (after UPCAST expansion). IR out: the
same graph where each group of up to `width` neighbouring STOREs is one STORE of a vector, and the VECTORIZE of the
lanes' values is pushed down: same-op lanes become one vector op, neighbouring LOADs one vector LOAD, per-lane
REDUCEs one REDUCE with a vector accumulator. Lanes that do not line up stay a VECTORIZE of scalars (a gather).
"""

from __future__ import annotations

from xgrad.dtype import dtypes
from xgrad.uop.ops import GroupOp, Ops, UOp
from xgrad.uop.pattern import PatternMatcher, UPat, graph_rewrite
from xgrad.uop.symbolic import simplify


def _offset(base: UOp, idx: UOp) -> int | None:
    """idx - base as a constant, when it is one."""
    diff = simplify(idx - base)
    return int(diff.arg) if diff.op is Ops.CONST else None


def _consecutive(indexes: list[UOp]) -> bool:
    """INDEXes into the same buffer, same gate, at positions p, p+1, p+2, ..."""
    first = indexes[0]
    if any(i.src[0] is not first.src[0] or i.src[2:] != first.src[2:] or i.dtype.count != 1 for i in indexes):
        return False
    return all(_offset(first.src[1], i.src[1]) == k for k, i in enumerate(indexes))


def group_stores(ctx: tuple[int, bool], sink: UOp) -> UOp | None:
    """Runs of neighbouring scalar STOREs (up to `width` lanes, a power of two) become one vector STORE. Lanes can
    come in any order: a store at p is grouped with the stores at p+1, p+2, ... wherever they stand. Their gates must
    be the same, unless the renderer stores under a per-lane mask (`masked`): then a run whose gates differ (a padded
    row's last vector) gets a bool vector of them as its gate."""
    width_limit, masked = ctx

    def key(idx: UOp, pos: UOp) -> tuple[UOp, ...]:
        return (idx.src[0], pos) if masked else (idx.src[0], *idx.src[2:], pos)

    scalar = [s for s in sink.src if s.op is Ops.STORE and s.src[0].dtype.count == 1]
    at = {key(s.src[0], s.src[0].src[1]): s for s in scalar}
    used: set[UOp] = set()
    out: list[UOp] = []
    for st in sink.src:
        if st in used:
            continue
        idx = st.src[0]
        run = [st]
        if st.op is Ops.STORE and idx.dtype.count == 1:
            for k in range(1, width_limit):
                nxt = at.get(key(idx, simplify(idx.src[1] + k)))
                if nxt is None or nxt in used:
                    break
                run.append(nxt)
        width = 1 << (len(run).bit_length() - 1)  # the largest power of two that fits
        run = run[:width]
        used.update(run)
        if width == 1:
            out.append(st)
            continue
        values = tuple(s.src[1] for s in run)
        value = UOp(Ops.VECTORIZE, values[0].dtype.vec(width), values)
        gates = [s.src[0].src[2:] for s in run]
        vidx = idx.replace(dtype=idx.dtype.vec(width))
        if any(g != gates[0] for g in gates):
            true = UOp.const(dtypes.bool, True)
            mask = UOp(Ops.VECTORIZE, dtypes.bool.vec(width), tuple(g[0] if g else true for g in gates))
            vidx = UOp(Ops.INDEX, idx.dtype.vec(width), (idx.src[0], idx.src[1], mask))
        out.append(UOp(Ops.STORE, dtypes.void, (vidx, value)))
    return sink.replace(src=tuple(out)) if len(out) != len(sink.src) else None


def push_vectorize(vec: UOp) -> UOp | None:
    lanes = vec.src
    first = lanes[0]
    if all(x is first for x in lanes) or len(lanes) < 2:
        return None
    same_shape = all(
        x.op is first.op and x.dtype == first.dtype and x.arg == first.arg and len(x.src) == len(first.src)
        for x in lanes
    )
    if not same_shape:
        return None
    n = len(lanes)
    if first.op in GroupOp.ALU or first.op in (Ops.CAST, Ops.BITCAST):
        srcs = tuple(_lane_vector([x.src[k] for x in lanes]) for k in range(len(first.src)))
        out_dtype = first.dtype.vec(n)
        return UOp(first.op, out_dtype, srcs, first.arg)
    if first.op is Ops.LOAD and _consecutive([x.src[0] for x in lanes]):
        idx = first.src[0]
        return UOp(Ops.LOAD, first.dtype.vec(n), (idx.replace(dtype=idx.dtype.vec(n)),))
    if first.op is Ops.REDUCE and all(x.src[1:] == first.src[1:] for x in lanes):
        value = _lane_vector([x.src[0] for x in lanes])
        return UOp(Ops.REDUCE, first.dtype.vec(n), (value, *first.src[1:]), first.arg)
    return None


def _lane_vector(xs: list[UOp]) -> UOp:
    if all(x is xs[0] for x in xs) and xs[0].op is Ops.CONST:
        return UOp(Ops.CONST, xs[0].dtype.vec(len(xs)), (), xs[0].arg)
    return UOp(Ops.VECTORIZE, xs[0].dtype.vec(len(xs)), tuple(xs))


pm_vectorize = PatternMatcher(
    [
        (UPat(Ops.SINK, name="sink"), group_stores),
        (UPat(Ops.VECTORIZE, name="vec"), push_vectorize),
    ]
)


def vectorize(ast: UOp, width: int, masked_stores: bool = False) -> UOp:
    """`masked_stores`: the renderer can store a vector under a bool vector gate (see `group_stores`)."""
    if width < 2:
        return ast
    return graph_rewrite(ast, pm_vectorize, ctx=(width, masked_stores), name="vectorize")
