"""Index folding before the optimizer: a remainder whose dividend steps by multiples of the divisor.

IR in: a kernel AST after `simplify`. IR out: the same AST where `(k*b + rest) % d` with `k >= d` reads
`((k % d)*b + rest) % d` when both dividends are non-negative (so C's remainder agrees), and `simplify` then drops
the remainders whose new dividend stays below `d`. The sliding windows of conv and pooling index the padded input as
`(kh*59 + h) % 58`; folded, that is `kh + h`, and the gates on it become plain comparisons. Also
`WHERE(c, LOAD(gated by g), 0)` becomes the LOAD when every condition of `c` is one of `g`'s (the padding of a conv
masks a load that its gate already zeroes).
"""

from __future__ import annotations

from xgrad.dtype import dtypes
from xgrad.uop.ops import Ops, UOp
from xgrad.uop.pattern import PatternMatcher, UPat, graph_rewrite
from xgrad.uop.symbolic import simplify


def _terms(x: UOp) -> tuple[list[tuple[UOp, int]], int]:
    """x as sum(k * b) + const, splitting ADDs and constant factors."""
    if x.op is Ops.CONST and isinstance(x.arg, int):
        return [], x.arg
    if x.op is Ops.ADD:
        (ta, ca), (tb, cb) = _terms(x.src[0]), _terms(x.src[1])
        return ta + tb, ca + cb
    if x.op is Ops.MUL and x.src[1].op is Ops.CONST and isinstance(x.src[1].arg, int):
        inner, const = _terms(x.src[0])
        k = x.src[1].arg
        return [(b, c * k) for b, c in inner], const * k
    return [(x, 1)], 0


def fold_mod_multiples(x: UOp, c: UOp) -> UOp | None:
    d = c.arg
    if not isinstance(d, int) or d <= 0 or x.dtype.count != 1 or not dtypes.is_int(x.dtype):
        return None
    terms, const = _terms(x)
    if all(0 <= k < d for _, k in terms) and 0 <= const < d:
        return None
    reduced = UOp.const(x.dtype, const % d)
    for b, k in terms:
        if k % d:
            reduced = reduced + (b if k % d == 1 else b * UOp.const(x.dtype, k % d))
    lo_x, lo_y = x.vmin, reduced.vmin
    if not (isinstance(lo_x, int) and isinstance(lo_y, int) and lo_x >= 0 and lo_y >= 0):
        return None
    return reduced % c


def _conjuncts(x: UOp) -> set[UOp]:
    if x.op is Ops.AND and x.dtype == dtypes.bool:
        return _conjuncts(x.src[0]) | _conjuncts(x.src[1])
    return {x}


def fold_masked_gated_load(cond: UOp, ld: UOp, zero: UOp) -> UOp | None:
    """WHERE(c, load gated by g, 0) -> the load, when c's conditions are among g's (a gated load already reads 0)."""
    idx = ld.src[0]
    if zero.arg != 0 or len(idx.src) != 3 or cond.dtype.count != 1:
        return None
    return ld if _conjuncts(cond) <= _conjuncts(idx.src[2]) else None


pm_fold_mod = PatternMatcher(
    [
        (UPat(Ops.MOD, src=(UPat.var("x"), UPat.cvar("c"))), fold_mod_multiples),
        (
            UPat(Ops.WHERE, src=(UPat.var("cond"), UPat(Ops.LOAD, name="ld"), UPat.cvar("zero"))),
            fold_masked_gated_load,
        ),
    ]
)


def fold_indexes(ast: UOp) -> UOp:
    folded = graph_rewrite(ast, pm_fold_mod, name="fold remainders")
    return folded if folded is ast else simplify(folded)


__all__ = ["fold_indexes", "pm_fold_mod"]
