"""Value bounds of index and int expressions: `UOp.vmin_vmax` (the symbolic simplifier decides comparisons, divisions
and remainders with them). Bounds are computed from the sources' bounds (already cached: `UOp.vmin_vmax` fills them
without recursion). Int results that can leave their dtype's range may wrap, so they become the whole range."""

from __future__ import annotations

import math

from xgrad.dtype import DType, dtypes
from xgrad.uop.ops import GroupOp, Ops, UOp


def bounds(u: UOp) -> tuple[int | float, int | float]:
    dt = u.dtype
    if u.op is Ops.CONST:
        return (u.arg, u.arg)
    if u.op is Ops.RANGE:
        end = u.src[0]
        return (0, end.vmax - 1) if isinstance(end.vmax, int) else (0, math.inf)
    if u.op is Ops.DEFINE_VAR:
        return (u.arg[1], u.arg[2])
    if u.op is Ops.BIND:
        return u.src[0].vmin_vmax
    if u.op in (Ops.SPECIAL,):
        return (0, u.arg[1] - 1)
    if u.op is Ops.VECTORIZE and u.src:
        return (min(s.vmin for s in u.src), max(s.vmax for s in u.src))
    if u.op is Ops.GEP:
        return u.src[0].vmin_vmax
    if len(u.src) >= 2 and u.op in GroupOp.Binary:
        (a0, a1), (b0, b1) = u.src[0].vmin_vmax, u.src[1].vmin_vmax
        if u.op is Ops.ADD:
            return _in_range(dt, a0 + b0, a1 + b1)
        if u.op is Ops.SUB:
            return _in_range(dt, a0 - b1, a1 - b0)
        if u.op is Ops.MUL:
            for q, n in ((u.src[0], u.src[1]), (u.src[1], u.src[0])):  # (x // n) * n: x rounded down, x >= 0, n >= 1
                if q.op is Ops.IDIV and q.src[1] is n and n.vmin >= 1 and q.src[0].vmin >= 0:
                    x0, x1 = q.src[0].vmin_vmax
                    return (max(0, x0 - (n.vmax - 1)) if math.isfinite(n.vmax) else 0, x1)
            vals = [_mul_bound(x, y) for x in (a0, a1) for y in (b0, b1)]
            return _in_range(dt, min(vals), max(vals))
        if u.op is Ops.MAX:
            return (max(a0, b0), max(a1, b1))
        if u.op is Ops.IDIV and isinstance(b0, int) and b0 == b1 and b0 != 0:
            vals = [_trunc_div(x, b0) if math.isfinite(x) else x * (1 if b0 > 0 else -1) for x in (a0, a1)]
            return _in_range(dt, min(vals), max(vals))  # MIN // -1 wraps
        if u.op is Ops.MOD and isinstance(b0, int) and b0 == b1 and b0 > 0:
            if a0 >= 0:
                return (0, min(a1, b0 - 1)) if a1 < b0 else (0, b0 - 1)
            return (-(b0 - 1), b0 - 1) if a1 > 0 else (-(b0 - 1), 0)
        if u.op in (Ops.MOD, Ops.IDIV) and a0 >= 0 and b0 >= 1:  # a variable positive divisor (a symbolic size)
            if u.op is Ops.MOD:
                return (0, min(a1, b1 - 1))
            return (a0 // b1 if math.isfinite(b1) else 0, a1 // b0 if math.isfinite(a1) else a1)
        if u.op is Ops.CMPLT:
            return (int(a1 < b0), int(a0 < b1))
        if u.op is Ops.CMPNE:
            return (int(a1 < b0 or b1 < a0), int(not (a0 == a1 == b0 == b1)))
        if u.op is Ops.CMPEQ:
            return (int(a0 == a1 == b0 == b1), int(not (a1 < b0 or b1 < a0)))
        if u.op is Ops.AND and dtypes.is_bool(dt):
            return (int(a0 and b0), int(a1 and b1))
        if u.op is Ops.OR and dtypes.is_bool(dt):
            return (int(a0 or b0), int(a1 or b1))
    if u.op is Ops.WHERE:
        (_, _), (b0, b1), (c0, c1) = (s.vmin_vmax for s in u.src)
        return (min(b0, c0), max(b1, c1))
    if u.op is Ops.CAST and (dtypes.is_int(dt) or dtypes.is_bool(dt)):
        s0, s1 = u.src[0].vmin_vmax
        if dtypes.is_bool(dt):
            return (0, 1)
        lo, hi = dtypes.min(dt), dtypes.max(dt)
        if math.isfinite(s0) and math.isfinite(s1) and lo <= s0 and s1 <= hi:
            return (math.trunc(s0), math.trunc(s1))
    if dtypes.is_bool(dt):
        return (0, 1)
    if dtypes.is_int(dt) and dt not in (dtypes.index, dtypes.weakint):
        return (dtypes.min(dt), dtypes.max(dt))
    return (-math.inf, math.inf)


def _in_range(dt: DType, lo: int | float, hi: int | float) -> tuple[int | float, int | float]:
    """Int bounds that leave the dtype's range mean the value can wrap: then it may be anything the dtype holds.
    (This also keeps bounds small: squaring an int over and over would otherwise build ever larger Python ints.)"""
    if not dtypes.is_int(dt) or dt.count != 1:
        return (lo, hi)
    if dt in (dtypes.index, dtypes.weakint):
        big = 1 << 63
        return (lo, hi) if -big <= lo and hi < big else (-math.inf, math.inf)
    dmin, dmax = dtypes.min(dt), dtypes.max(dt)
    return (lo, hi) if dmin <= lo and hi <= dmax else (dmin, dmax)


def _trunc_div(x: int | float, d: int) -> int | float:
    """C division (toward zero) in exact integer arithmetic."""
    if not isinstance(x, int):
        return int(x / d)
    q = abs(x) // abs(d)
    return q if (x >= 0) == (d > 0) else -q


def _mul_bound(x: int | float, y: int | float) -> int | float:
    if (x == 0 and math.isinf(y)) or (y == 0 and math.isinf(x)):
        return 0
    return x * y
