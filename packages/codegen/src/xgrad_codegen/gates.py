"""Gate hoisting: a sum that is exactly zero unless a condition holds loops zero times when it does not.

IR in: a kernel AST whose lanes are expanded. IR out: the same AST where REDUCE(ADD, v, r) whose every term is an exact
zero unless some conditions hold that do not depend on `r` (every term's loads are gated by them) runs its loop
WHERE(conditions, n, 0) times; the loads whose gate is only those conditions lose the gate (inside the loop it holds).
A conv's input gradient reads a window of the output gradient through gated loads: most window positions fall
outside it, and their loops no longer add zeros.
"""

from __future__ import annotations

from xgrad.dtype import dtypes
from xgrad.uop.ops import Ops, UOp
from xgrad.uop.pattern import PatternMatcher, UPat, graph_rewrite, substitute


def _conjuncts(x: UOp) -> tuple[UOp, ...]:
    """The conditions ANDed in `x`, in order."""
    if x.op is Ops.AND and x.dtype == dtypes.bool:
        return _conjuncts(x.src[0]) + _conjuncts(x.src[1])
    return (x,)


def _zero_unless(v: UOp) -> tuple[UOp, ...]:
    """Conditions such that `v` is exactly 0 (never NaN) whenever one of them is false, in a fixed order."""
    if v.op is Ops.LOAD and len(v.src[0].src) == 3:
        return _conjuncts(v.src[0].src[2])
    if v.op is Ops.CAST:
        return _zero_unless(v.src[0])
    if v.op in (Ops.MUL, Ops.ADD):  # both operands zero: a gated load times an ungated one could be 0 * inf
        right = _zero_unless(v.src[1])
        return tuple(c for c in _zero_unless(v.src[0]) if c in right)
    if v.op is Ops.WHERE and v.src[2].op is Ops.CONST and v.src[2].arg == 0:
        return tuple(dict.fromkeys(_conjuncts(v.src[0]) + _zero_unless(v.src[1])))
    return ()


def hoist_gate(red: UOp) -> UOp | None:
    if red.arg is not Ops.ADD or len(red.src) != 2 or red.dtype.count != 1:
        return None
    value, rng = red.src
    if rng.op is not Ops.RANGE or rng.src[0].op is Ops.WHERE:  # not a loop, or one already hoisted into
        return None
    hoisted = [c for c in _zero_unless(value) if c.dtype.count == 1 and rng not in c.toposort]
    if not hoisted:
        return None
    cond = hoisted[0]
    for c in hoisted[1:]:
        cond = UOp(Ops.AND, dtypes.bool, (cond, c))
    end = UOp(Ops.WHERE, rng.dtype, (cond, rng.src[0], UOp.const(rng.dtype, 0)))
    short = UOp(Ops.RANGE, rng.dtype, (end,), rng.arg)
    body = substitute(value, {rng: short}, name="hoist gate")
    ungated = {
        x: x.replace(src=x.src[:2])
        for x in body.toposort
        if x.op is Ops.INDEX and len(x.src) == 3 and set(_conjuncts(x.src[2])) <= set(hoisted)
    }
    return UOp(Ops.REDUCE, red.dtype, (substitute(body, ungated, name="hoist gate"), short), red.arg)


pm_hoist_gates = PatternMatcher(
    [
        (UPat(Ops.REDUCE, name="red"), hoist_gate),
    ]
)


def hoist_gates(ast: UOp) -> UOp:
    return graph_rewrite(ast, pm_hoist_gates, name="hoist gates")


__all__ = ["hoist_gates", "pm_hoist_gates"]
