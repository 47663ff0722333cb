"""Symbolic simplification of index arithmetic (used by the scheduler and codegen).

IR in: any UOp graph; the rules act on ALU nodes over ints (`dtypes.index` above all), bools and constants, with C
semantics (IDIV truncates toward zero, MOD takes the dividend's sign) made total: x IDIV 0 is 0, x MOD 0 is x, and
MIN IDIV -1 wraps to MIN (MOD gives 0), so `a == (a IDIV b) * b + a MOD b` always holds. Every backend gives these.
IR out: the same graph with constants folded and index expressions in canonical form: a sum is a left-nested chain of
`term * coeff` with its constant last, like terms combined, divisions and remainders split where the bounds
(`UOp.vmin/vmax`) make it valid, and comparisons, maxima and conditions that the bounds decide replaced by constants.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

from xgrad.dtype import DType, dtypes, truncate
from xgrad.errors import XgradError
from xgrad.uop.ops import GroupOp, Ops, UOp
from xgrad.uop.pattern import PatternMatcher, UPat, graph_rewrite, substitute

_INTS: tuple[DType, ...] = (dtypes.index, dtypes.weakint, *dtypes.ints)
_BOOL = dtypes.bool
_INF = math.inf

# ---- C semantics of constant evaluation ----


def _c_idiv(a: int, b: int) -> int:
    """C's truncating division, defined at 0 (x IDIV 0 is 0); the caller wraps MIN IDIV -1 to its dtype."""
    if not (isinstance(a, int) and isinstance(b, int)):
        raise TypeError("IDIV takes ints")
    if b == 0:
        return 0
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _c_mod(a: int, b: int) -> int:
    return a - b * _c_idiv(a, b)  # x MOD 0 is x


def _c_max(a: Any, b: Any) -> Any:
    return a if a > b or a != a else b  # NaN in either operand propagates


def _c_shl(a: int, b: int) -> int:
    if not 0 <= b < 128:
        raise ValueError("shift out of range")
    return a << b


def _c_shr(a: int, b: int) -> int:
    if not 0 <= b < 128:
        raise ValueError("shift out of range")
    return a >> b


def _c_pow(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        if not 0 <= b <= 128:
            raise ValueError("integer power out of range")
        return a**b
    return math.pow(a, b)


def _c_trunc(a: Any) -> Any:
    return a if isinstance(a, int) else math.copysign(float(math.trunc(a)), a)


_EXEC: dict[Ops, Callable[..., Any]] = {
    Ops.ADD: operator.add,
    Ops.SUB: operator.sub,
    Ops.MUL: operator.mul,
    Ops.FDIV: operator.truediv,
    Ops.IDIV: _c_idiv,
    Ops.MOD: _c_mod,
    Ops.MAX: _c_max,
    Ops.CMPLT: operator.lt,
    Ops.CMPNE: operator.ne,
    Ops.CMPEQ: operator.eq,
    Ops.AND: operator.and_,
    Ops.OR: operator.or_,
    Ops.XOR: operator.xor,
    Ops.SHL: _c_shl,
    Ops.SHR: _c_shr,
    Ops.POW: _c_pow,
    Ops.NEG: operator.neg,
    Ops.TRUNC: _c_trunc,
    Ops.EXP2: lambda a: math.pow(2.0, a),
    Ops.LOG2: math.log2,
    Ops.SIN: math.sin,
    Ops.SQRT: math.sqrt,
    Ops.RECIPROCAL: lambda a: 1.0 / a,
    Ops.WHERE: lambda c, a, b: a if c else b,
    Ops.MULACC: lambda a, b, c: a * b + c,
}


def _fold_value(op: Ops, dtype: DType, args: tuple[Any, ...]) -> Any | None:
    """The value of `op(*args)` in `dtype`, or None where folding is unsafe (domain errors)."""
    fn = _EXEC.get(op)
    if fn is None or dtype.count != 1:
        return None
    try:
        value = fn(*args)
        return None if isinstance(value, complex) else truncate(dtype)(value)
    except (ArithmeticError, ValueError, TypeError, XgradError):
        return None


def _iconst(dtype: DType, value: int) -> UOp:
    return UOp.const(dtype, truncate(dtype)(value))


def _zero(x: UOp) -> UOp:
    return UOp.const(x.dtype, 0)


def _scalar_int(x: UOp) -> bool:
    return x.dtype.count == 1 and dtypes.is_int(x.dtype)


def _int_arg(c: UOp) -> bool:
    return type(c.arg) is int


# ---- constant folding and identities ----


def fold_alu_consts(u: UOp) -> UOp | None:
    value = _fold_value(u.op, u.dtype, tuple(s.arg for s in u.src))
    if value is None:
        return None
    return UOp(Ops.CONST, u.dtype, next((s.src for s in u.src if s.src), ()), value)


def fold_cast_const(u: UOp, c: UOp) -> UOp | None:
    if u.dtype.count != 1 or u.dtype == dtypes.void:
        return None
    value = c.arg
    if isinstance(value, float) and dtypes.is_int(u.dtype):
        if not math.isfinite(value):
            return None
        value = math.trunc(value)
    try:
        return UOp(Ops.CONST, u.dtype, c.src, truncate(u.dtype)(value))
    except (ArithmeticError, ValueError, XgradError):
        return None


def fold_add_zero(x: UOp, c: UOp) -> UOp | None:
    """x + 0 is x, except that -0.0 + 0.0 is 0.0 in IEEE floats (x + -0.0 is always x)."""
    if dtypes.is_float(x.dtype) and math.copysign(1.0, c.arg) > 0:
        return None
    return x


def fold_int_zero(x: UOp) -> UOp | None:
    return _zero(x) if dtypes.is_int(x.dtype) else None


def fold_dividend(x: UOp) -> UOp | None:
    return x if dtypes.is_int(x.dtype) else None


def fold_self_compare(u: UOp, x: UOp) -> UOp | None:
    if dtypes.is_float(x.dtype):
        return None  # NaN != NaN
    return UOp.const(_BOOL, u.op is Ops.CMPEQ)


_TRUE = UPat.const(_BOOL, True)
_FALSE = UPat.const(_BOOL, False)

pm_constant_fold = PatternMatcher(
    [
        # every source a constant: evaluate (domain errors stay unfolded)
        (UPat(GroupOp.ALU, src=UPat(Ops.CONST), name="u"), fold_alu_consts),
        (UPat(Ops.CAST, src=(UPat(Ops.CONST, name="c"),), name="u"), fold_cast_const),
        (UPat(Ops.CAST, src=(UPat.var("x"),), name="u"), lambda u, x: x if x.dtype == u.dtype else None),
        # arithmetic identities
        (UPat.var("x") + UPat.const(None, 0).named("c"), fold_add_zero),
        (UPat(Ops.SUB, src=(UPat.var("x"), UPat.const(None, 0))), lambda x: x),
        (UPat.var("x") * 1, lambda x: x),
        (UPat.var("x") * 0, fold_int_zero),
        (UPat(Ops.FDIV, src=(UPat.var("x"), UPat.const(None, 1.0))), lambda x: x),
        (UPat.var("x") // 1, lambda x: x),
        (UPat.var("x") // -1, lambda x: x * -1),  # MIN // -1 wraps to MIN, as MIN * -1 does
        (UPat.var("x") // 0, fold_int_zero),  # the defined results of a zero divisor (see the module docstring)
        (UPat.var("x") % 0, fold_dividend),
        (UPat.var("x") % 1, fold_int_zero),
        (UPat.var("x") % -1, fold_int_zero),
        (UPat.var("x") + UPat.var("x") * -1, fold_int_zero),
        (UPat(Ops.SUB, src=(UPat.var("x"), UPat.var("x"))), fold_int_zero),
        (UPat.var("x").maximum(UPat.var("x")), lambda x: x),
        # where with a known condition or equal branches
        (
            UPat(Ops.WHERE, src=(UPat(Ops.CONST, name="c"), UPat.var("a"), UPat.var("b"))),
            lambda c, a, b: a if c.arg else b,
        ),
        (UPat(Ops.WHERE, src=(UPat.var(), UPat.var("a"), UPat.var("a"))), lambda a: a),
        (UPat.var("c", _BOOL).where(_TRUE, _FALSE), lambda c: c),
        (UPat.var("c", _BOOL).where(_FALSE, _TRUE), lambda c: c.logical_not()),
        # boolean and bitwise identities
        (UPat(Ops.AND, src=[UPat.var("x", _BOOL), _TRUE]), lambda x: x),
        (UPat(Ops.AND, src=[UPat.var("x"), UPat.const(None, 0)]), fold_int_zero),
        (UPat(Ops.AND, src=[UPat.var("x", _BOOL), _FALSE]), lambda x: UOp.const(_BOOL, False)),
        (UPat(Ops.OR, src=[UPat.var("x", _BOOL), _TRUE]), lambda x: UOp.const(_BOOL, True)),
        (UPat((Ops.OR, Ops.XOR), src=[UPat.var("x"), UPat.const(None, 0)]), lambda x: x),
        (UPat((Ops.AND, Ops.OR), src=[UPat.var("x"), UPat.var("x")]), lambda x: x),
        (UPat(Ops.XOR, src=[UPat.var("x"), UPat.var("x")]), lambda x: UOp.const(x.dtype, 0)),
        (UPat(Ops.CMPNE, src=[UPat.var("x", _BOOL), _FALSE]), lambda x: x),
        (UPat(Ops.CMPEQ, src=[UPat.var("x", _BOOL), _TRUE]), lambda x: x),
        (UPat(Ops.CMPEQ, src=[UPat.var("x", _BOOL), _FALSE]), lambda x: x.logical_not()),
        (UPat(Ops.CMPNE, src=(UPat(Ops.CMPNE, src=(UPat.var("x", _BOOL), _TRUE)), _TRUE)), lambda x: x),
        (UPat(Ops.CMPNE, src=(UPat(Ops.CMPNE, src=(UPat.var("a"), UPat.var("b"))), _TRUE)), lambda a, b: a.eq(b)),
        (UPat(Ops.CMPNE, src=(UPat(Ops.CMPEQ, src=(UPat.var("a"), UPat.var("b"))), _TRUE)), lambda a, b: a.ne(b)),
        (UPat((Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ), src=(UPat.var("x"), UPat.var("x")), name="u"), fold_self_compare),
    ]
)

# ---- sums as (term, coefficient) lists ----

Terms = list[tuple[UOp, int]]


def _terms(x: UOp) -> tuple[Terms, int]:
    """`x` as `sum(base * coeff) + const`, reading through ADD chains and constant multiplications."""
    terms: Terms = []
    const = 0
    stack = [x]
    while stack:
        t = stack.pop()
        if t.op is Ops.ADD:
            stack.extend(reversed(t.src))
        elif t.op is Ops.CONST and _int_arg(t):
            const += t.arg
        elif t.op is Ops.MUL and t.src[1].op is Ops.CONST and _int_arg(t.src[1]):
            terms.append((t.src[0], t.src[1].arg))
        elif t.op is Ops.MUL and t.src[0].op is Ops.CONST and _int_arg(t.src[0]):
            terms.append((t.src[1], t.src[0].arg))
        else:
            terms.append((t, 1))
    return terms, const


def _build_sum(terms: Terms, const: int, dtype: DType) -> UOp:
    out: UOp | None = None
    for base, k in terms:
        if k == 0:
            continue
        t = base if k == 1 else UOp(Ops.MUL, dtype, (base, _iconst(dtype, k)))
        out = t if out is None else UOp(Ops.ADD, dtype, (out, t))
    if out is None:
        return _iconst(dtype, const)
    return out if const == 0 else UOp(Ops.ADD, dtype, (out, _iconst(dtype, const)))


def _divmod_pair(base: UOp, op: Ops) -> tuple[UOp, int] | None:
    """(x, c) for `base` = `x op c` with a positive constant c."""
    if base.op is op and base.src[1].op is Ops.CONST and _int_arg(base.src[1]) and base.src[1].arg > 0:
        return base.src[0], base.src[1].arg
    return None


def _quotient(x: UOp, c: int) -> UOp:
    """`x // c` as the rules leave it: `(y // c1) // c` is `y // (c1*c)`."""
    if (inner := _divmod_pair(x, Ops.IDIV)) is not None:
        return UOp(Ops.IDIV, x.dtype, (inner[0], _iconst(x.dtype, inner[1] * c)))
    return UOp(Ops.IDIV, x.dtype, (x, _iconst(x.dtype, c)))


def fold_sum(u: UOp) -> UOp | None:
    """Canonical sum: flatten, combine like terms, rejoin `x%c + (x//c)*c` into x, constant last."""
    if not _scalar_int(u):
        return None
    terms, const = _terms(u)
    merged: dict[UOp, int] = {}
    for base, k in terms:
        merged[base] = merged.get(base, 0) + k
    for base, k in list(merged.items()):
        if k == 0 or (pair := _divmod_pair(base, Ops.MOD)) is None:
            continue
        x, c = pair
        quotient = _quotient(x, c)
        if merged.get(quotient, 0) == k * c:  # x%c*k + (x//c)*c*k == x*k
            merged[base] = merged[quotient] = 0
            x_terms, x_const = _terms(x)
            for xb, xk in x_terms:
                merged[xb] = merged.get(xb, 0) + k * xk
            const += k * x_const
    for base, k in list(merged.items()):
        if k == 0 or (pair := _divmod_pair(base, Ops.IDIV)) is None or pair[0].op is Ops.ADD:
            continue
        x, c = pair
        if (j := merged.get(x, 0)) != 0 and k == -j * c:  # x*j - (x//c)*c*j == (x%c)*j
            merged[base] = merged[x] = 0
            remainder = UOp(Ops.MOD, u.dtype, (x, base.src[1]))
            merged[remainder] = merged.get(remainder, 0) + j
    new = _build_sum(list(merged.items()), const, u.dtype)
    return None if new is u else new


# ---- division and remainder by a constant ----


def _split_quotient(x: UOp, terms: Terms, const: int, d: int) -> tuple[Terms, int, UOp] | None:
    """x == Q*d + R with Q the terms whose coefficient d divides, valid for C division when x and R share a sign."""
    q_terms = [(b, k // d) for b, k in terms if k % d == 0]
    r_terms = [(b, k) for b, k in terms if k % d != 0]
    if x.vmin >= 0:
        q_const, r_const = const // d, const % d
    elif x.vmax <= 0:
        q_const, r_const = _c_idiv(const, d), _c_mod(const, d)
    else:
        return None
    if not q_terms and q_const == 0:
        return None
    r = _build_sum(r_terms, r_const, x.dtype)
    if not (r.vmin >= 0 if x.vmin >= 0 else r.vmax <= 0):
        return None
    return q_terms, q_const, r


def _split_small(x: UOp, terms: Terms, const: int, d: int) -> tuple[UOp, UOp] | None:
    """x == B + S with B a multiple of g = gcd(d, B's coefficients) and 0 <= S < g, for x >= 0: x//d == B//d."""
    if x.vmin < 0 or not terms:
        return None
    ordered = sorted(terms, key=lambda t: -abs(t[1]))
    for n in range(1, len(ordered) + 1):
        big, small = ordered[:n], ordered[n:]
        g = math.gcd(d, *(k for _, k in big))
        if g == 1:
            return None
        if not small and const % g == 0:
            continue
        s = _build_sum(small, const % g, x.dtype)
        if 0 <= s.vmin and s.vmax < g:
            return _build_sum(big, const - const % g, x.dtype), s
    return None


def fold_idiv(x: UOp, c: UOp) -> UOp | None:
    if not _scalar_int(x) or not _int_arg(c) or c.arg == 0:
        return None
    d: int = c.arg
    if d < 0:
        # x // MIN stays: -MIN does not fit the dtype (it wraps back to MIN, and the rule would undo itself)
        return (x // -d) * -1 if -d <= dtypes.max(x.dtype) else None
    if (inner := _divmod_pair(x, Ops.IDIV)) is not None:
        return inner[0] // (inner[1] * d)
    terms, const = _terms(x)
    g = math.gcd(d, const, *(k for _, k in terms))
    if g > 1:
        return _build_sum([(b, k // g) for b, k in terms], const // g, x.dtype) // (d // g)
    if (split := _split_quotient(x, terms, const, d)) is not None:
        q_terms, q_const, r = split
        if q_terms or r.op is not Ops.ADD:
            return _build_sum(q_terms, q_const, x.dtype) + r // d
    if (parts := _split_small(x, terms, const, d)) is not None:
        return parts[0] // d
    return None


def fold_mod(x: UOp, c: UOp) -> UOp | None:
    if not _scalar_int(x) or not _int_arg(c) or c.arg == 0:
        return None
    d: int = c.arg
    if d < 0:
        return x % -d if -d <= dtypes.max(x.dtype) else None
    if (inner := _divmod_pair(x, Ops.MOD)) is not None and inner[1] % d == 0:
        return inner[0] % d
    lo, hi = x.vmin, x.vmax
    if isinstance(lo, int) and isinstance(hi, int) and (q := _c_idiv(lo, d)) == _c_idiv(hi, d):
        return x if q == 0 else x + _iconst(x.dtype, -q * d)
    terms, const = _terms(x)
    g = math.gcd(d, const, *(k for _, k in terms))
    if g > 1:
        return (_build_sum([(b, k // g) for b, k in terms], const // g, x.dtype) % (d // g)) * g
    if (split := _split_quotient(x, terms, const, d)) is not None:
        return split[2] % d
    if (parts := _split_small(x, terms, const, d)) is not None:
        return parts[0] % d + parts[1]
    return None


# ---- comparisons against constants ----


def _scaled(x: UOp) -> tuple[UOp, int, int] | None:
    """(y, g, k) with x == g*y + k, g the gcd of x's coefficients; None when x is already in that form with g=1, k=0."""
    terms, const = _terms(x)
    if not terms:
        return None
    g = math.gcd(*(k for _, k in terms))
    if g == 1 and const == 0:
        return None
    return _build_sum([(b, k // g) for b, k in terms], 0, x.dtype), g, const


def _lt_bound_of_quotient(d: int, e: int) -> int:
    """n with: trunc(x/e) < d  <=>  x < n (e > 0, C division)."""
    return d * e if d > 0 else (d - 1) * e + 1


def fold_lt_const(x: UOp, c: UOp) -> UOp | None:
    if not _scalar_int(x) or x.op is Ops.CONST or not _int_arg(c):
        return None
    if (pair := _divmod_pair(x, Ops.IDIV)) is not None:
        return pair[0].lt(_lt_bound_of_quotient(c.arg, pair[1]))
    if (s := _scaled(x)) is None:
        return None
    y, g, k = s
    return y.lt(-((k - c.arg) // g))  # g*y + k < c  <=>  y < ceil((c-k)/g)


def fold_gt_const(c: UOp, x: UOp) -> UOp | None:
    if not _scalar_int(x) or x.op is Ops.CONST or not _int_arg(c):
        return None
    if (pair := _divmod_pair(x, Ops.IDIV)) is not None:  # c < x//e  <=>  not (x//e < c+1)
        return UOp(Ops.CMPLT, _BOOL, (_iconst(x.dtype, _lt_bound_of_quotient(c.arg + 1, pair[1]) - 1), pair[0]))
    if (s := _scaled(x)) is None:
        return None
    y, g, k = s
    return UOp(Ops.CMPLT, _BOOL, (_iconst(x.dtype, (c.arg - k) // g), y))  # c < g*y + k  <=>  floor((c-k)/g) < y


def fold_eq_const(u: UOp, x: UOp, c: UOp) -> UOp | None:
    if not _scalar_int(x) or x.op is Ops.CONST or not _int_arg(c) or (s := _scaled(x)) is None:
        return None
    y, g, k = s
    if (c.arg - k) % g != 0:
        return UOp.const(_BOOL, u.op is Ops.CMPNE)
    return UOp(u.op, _BOOL, (y, _iconst(x.dtype, (c.arg - k) // g)))


def fold_not_lt(a: UOp, b: UOp) -> UOp | None:
    """not (x < c) is c-1 < x, and not (c < x) is x < c+1, for ints."""
    if not _scalar_int(a):
        return None
    if b.op is Ops.CONST and _int_arg(b) and a.op is not Ops.CONST:
        return UOp(Ops.CMPLT, _BOOL, (_iconst(a.dtype, b.arg - 1), a))
    if a.op is Ops.CONST and _int_arg(a) and b.op is not Ops.CONST:
        return b.lt(_iconst(b.dtype, a.arg + 1))
    return None


# ---- bounds ----


def fold_decided(u: UOp) -> UOp | None:
    """An int or bool ALU node whose bounds leave one value is that constant."""
    if u.dtype.count != 1 or not (dtypes.is_int(u.dtype) or dtypes.is_bool(u.dtype)):
        return None
    if not all(dtypes.is_int(s.dtype) or dtypes.is_bool(s.dtype) for s in u.src):
        return None
    lo, hi = u.vmin_vmax
    if lo != hi or not isinstance(lo, int):
        return None
    return _iconst(u.dtype, lo)


def fold_max_bounds(x: UOp, y: UOp) -> UOp | None:
    if not _scalar_int(x):
        return None
    if x.vmin >= y.vmax:
        return x
    return y if y.vmin >= x.vmax else None


def swap_const(u: UOp, c: UOp, x: UOp) -> UOp | None:
    if x.op is Ops.CONST or (u.op is Ops.MAX and dtypes.is_float(u.dtype)):
        return None
    return u.replace(src=(x, c))


# ---- conditions as intervals ----

Interval = tuple[UOp, int | float, int | float]


def _interval(cond: UOp) -> Interval | None:
    """(x, lo, hi) with cond <=> lo <= x <= hi, for comparisons of an int x with a constant."""
    if cond.op is Ops.CMPNE and cond.src[1].op is Ops.CONST and cond.src[1].arg is True:
        if (inner := _interval(cond.src[0])) is None or cond.src[0].op is Ops.CMPEQ:
            return None
        x, lo, hi = inner
        return (x, hi + 1, _INF) if lo == -_INF else (x, -_INF, lo - 1)
    if cond.op not in (Ops.CMPLT, Ops.CMPEQ) or not dtypes.is_int(cond.src[0].dtype):
        return None
    a, b = cond.src
    if b.op is Ops.CONST and a.op is not Ops.CONST and _int_arg(b):
        return (a, -_INF, b.arg - 1) if cond.op is Ops.CMPLT else (a, b.arg, b.arg)
    if cond.op is Ops.CMPLT and a.op is Ops.CONST and b.op is not Ops.CONST and _int_arg(a):
        return (b, a.arg + 1, _INF)
    return None


def _clip(iv: Interval) -> tuple[int | float, int | float]:
    x, lo, hi = iv
    return max(lo, x.vmin), min(hi, x.vmax)


def _implies(a: Interval | None, b: Interval | None) -> bool:
    """Every x in a (within x's bounds) is in b."""
    if a is None or b is None or a[0] is not b[0]:
        return False
    lo, hi = _clip(a)
    return lo > hi or (b[1] <= lo and hi <= b[2])


def _chain(u: UOp, op: Ops) -> list[UOp]:
    out: list[UOp] = []
    stack = [u]
    while stack:
        t = stack.pop()
        if t.op is op and dtypes.is_bool(t.dtype):
            stack.extend(reversed(t.src))
        elif t not in out:
            out.append(t)
    return out


def _build_chain(parts: list[UOp], op: Ops) -> UOp:
    out = parts[0]
    for p in parts[1:]:
        out = UOp(op, _BOOL, (out, p))
    return out


def _drop_redundant(parts: list[UOp], keep_stronger: bool) -> list[UOp]:
    """Drop each part implied by (AND: keep_stronger) or implying (OR) another kept part; earlier parts win ties."""
    ivs = [_interval(p) for p in parts]
    kept = list(range(len(parts)))
    for i in range(len(parts)):
        for j in kept:
            if j == i:
                continue
            stronger, weaker = (j, i) if keep_stronger else (i, j)
            if _implies(ivs[stronger], ivs[weaker]) and (not _implies(ivs[weaker], ivs[stronger]) or j < i):
                kept.remove(i)
                break
    return [parts[i] for i in kept]


def fold_and(u: UOp) -> UOp | None:
    """AND chain: drop conditions another one implies; contradicting intervals make it False."""
    if u.dtype != _BOOL:
        return None
    parts = _chain(u, Ops.AND)
    ivs = [iv for p in parts if (iv := _interval(p)) is not None]
    for i, a in enumerate(ivs):
        for b in ivs[i + 1 :]:
            if a[0] is b[0] and max(_clip(a)[0], b[1]) > min(_clip(a)[1], b[2]):
                return UOp.const(_BOOL, False)
    new = _build_chain(_drop_redundant(parts, keep_stronger=True), Ops.AND)
    return None if new is u else new


def fold_or(u: UOp) -> UOp | None:
    """OR chain: drop conditions that imply another one; two intervals covering the bounds make it True."""
    if u.dtype != _BOOL:
        return None
    parts = _chain(u, Ops.OR)
    ivs = [iv for p in parts if (iv := _interval(p)) is not None]
    for i, a in enumerate(ivs):
        for b in ivs[i + 1 :]:
            (lo1, hi1), (lo2, hi2) = sorted([_clip(a), _clip(b)])
            if a[0] is b[0] and lo1 <= a[0].vmin and hi1 + 1 >= lo2 and max(hi1, hi2) >= a[0].vmax:
                return UOp.const(_BOOL, True)
    new = _build_chain(_drop_redundant(parts, keep_stronger=False), Ops.OR)
    return None if new is u else new


_PURE = frozenset({Ops.CONST, Ops.RANGE, Ops.DEFINE_VAR, Ops.BIND, Ops.SPECIAL}) | GroupOp.ALU


def _narrow_under_gate(gate: UOp, a: UOp) -> UOp | None:
    """`a` simplified with the bounds `gate` puts on its ranges and variables: equal to `a` wherever gate holds.

    Only pure index arithmetic: a load under the gate could otherwise read another address where the gate is false."""
    if not _scalar_int(a) or a.op is Ops.CONST or not all(x.op in _PURE for x in a.toposort):
        return None
    narrowed: dict[UOp, tuple[int, int]] = {}
    for cond in _chain(gate, Ops.AND):
        if (iv := _interval(cond)) is None or iv[0].op not in (Ops.RANGE, Ops.DEFINE_VAR) or iv[0] not in a.toposort:
            continue
        v = iv[0]
        lo, hi = narrowed.get(v, (v.vmin, v.vmax))
        lo, hi = max(lo, iv[1]), min(hi, iv[2])
        if isinstance(lo, int) and isinstance(hi, int) and lo <= hi and (lo, hi) != (v.vmin, v.vmax):
            narrowed[v] = (lo, hi)
    if not narrowed:
        return None
    gate_vars = {v: UOp.variable(f"{v.render()}#gated", lo, hi, v.dtype) for v, (lo, hi) in narrowed.items()}
    simplified = graph_rewrite(substitute(a, gate_vars), pm_simplify, name="symbolic gated")
    back = substitute(simplified, {g: v for v, g in gate_vars.items()})
    return None if back is a else back


def narrow_gated_where(c: UOp, a: UOp, b: UOp) -> UOp | None:
    return None if (new := _narrow_under_gate(c, a)) is None else c.where(new, b)


def narrow_gated_index(u: UOp, buf: UOp, i: UOp, c: UOp) -> UOp | None:
    if c.op is Ops.CONST and c.arg is True:
        return u.replace(src=(buf, i))
    return None if (new := _narrow_under_gate(c, i)) is None else u.replace(src=(buf, new, c))


# ---- the tables ----

_IDX = UPat.var("x", _INTS)

# values the bounds decide (first: cheapest and strongest)
pm_bounds = PatternMatcher(
    [
        (UPat(GroupOp.ALU, name="u"), fold_decided),
        (UPat.var("x").maximum(UPat.var("y")), fold_max_bounds),
    ]
)

# canonical order and sums: constants right, `term*coeff` chains with like terms combined
pm_canonical = PatternMatcher(
    [
        (UPat(GroupOp.Commutative, src=(UPat.cvar("c"), UPat.var("x")), name="u"), swap_const),
        (UPat(Ops.ADD, _INTS, name="u"), fold_sum),
        ((_IDX * UPat.cvar("c1")) * UPat.cvar("c2"), lambda x, c1, c2: x * _iconst(x.dtype, c1.arg * c2.arg)),
        (_IDX * (UPat.var("y") * UPat.cvar("c")), lambda x, y, c: None if x.op is Ops.CONST else (x * y) * c),
        ((UPat.var("x", _INTS) + UPat.var("y")) * UPat.cvar("c"), lambda x, y, c: x * c + y * c),
    ]
)

# division and remainder by a constant
pm_divmod = PatternMatcher(
    [
        (_IDX // UPat.cvar("c"), fold_idiv),
        (_IDX % UPat.cvar("c"), fold_mod),
    ]
)

# comparisons of a sum with a constant
pm_compare = PatternMatcher(
    [
        (UPat(Ops.CMPLT, src=(UPat.var("x"), UPat.cvar("c"))), fold_lt_const),
        (UPat(Ops.CMPLT, src=(UPat.cvar("c"), UPat.var("x"))), fold_gt_const),
        (UPat((Ops.CMPNE, Ops.CMPEQ), src=(UPat.var("x"), UPat.cvar("c")), name="u"), fold_eq_const),
        (UPat(Ops.CMPNE, src=(UPat(Ops.CMPLT, src=(UPat.var("a"), UPat.var("b"))), _TRUE)), fold_not_lt),
    ]
)

_WHERE_IN_TRUE = UPat(Ops.WHERE, src=(UPat.var("c"), UPat.var("a"), UPat.var()))
_WHERE_IN_FALSE = UPat(Ops.WHERE, src=(UPat.var("c"), UPat.var(), UPat.var("b")))

# conditions and gates: AND/OR chains as intervals, where-of-where, gated values
pm_conditions = PatternMatcher(
    [
        (UPat(Ops.AND, _BOOL, name="u"), fold_and),
        (UPat(Ops.OR, _BOOL, name="u"), fold_or),
        (
            UPat(Ops.CMPNE, src=(UPat.var("c", _BOOL), _TRUE)).where(UPat.var("a"), UPat.var("b")),
            lambda c, a, b: c.where(b, a),
        ),
        (UPat.var("c").where(_WHERE_IN_TRUE, UPat.var("b")), lambda c, a, b: c.where(a, b)),
        (UPat.var("c").where(UPat.var("a"), _WHERE_IN_FALSE), lambda c, a, b: c.where(a, b)),
        (UPat.var("c", _BOOL).where(UPat.var("x", _BOOL), _FALSE), lambda c, x: c.logical_and(x)),
        (UPat.var("c", _BOOL).where(_TRUE, UPat.var("x", _BOOL)), lambda c, x: UOp(Ops.OR, _BOOL, (c, x))),
        (UPat.var("c", _BOOL).where(UPat.var("a"), UPat.var("b")), narrow_gated_where),
        (UPat(Ops.INDEX, src=(UPat.var("buf"), UPat.var("i"), UPat.var("c", _BOOL)), name="u"), narrow_gated_index),
    ]
)

pm_symbolic = pm_bounds + pm_canonical + pm_divmod + pm_compare + pm_conditions

pm_simplify = pm_constant_fold + pm_symbolic


def simplify(u: UOp) -> UOp:
    """Fold constants and bring index arithmetic under `u` to canonical form.

    >>> from xgrad.uop.ops import UOp
    >>> r = UOp.range(16, 0)
    >>> simplify((r * 4 + 3) // 4).render(), simplify((r * 4 + 3) % 4).render(), simplify(r.lt(16)).render()
    ('r0', '3', 'True')
    """
    global _simplified
    if len(_simplified) > _SIMPLIFIED_LIMIT:
        _simplified = {}  # a new dict, not clear(): a simplify running further up the stack keeps its own
    return graph_rewrite(u, pm_simplify, name="symbolic", memo=_simplified)


# every node simplify has seen -> its canonical form. The rules read nothing but the node, so the answer never
# changes; codegen simplifies the same index expressions many times (each pass, each lane, each vector offset).
_simplified: dict[UOp, UOp] = {}
_SIMPLIFIED_LIMIT = 50_000


# ---- evaluation and substitution ----


def _leaf_value(x: UOp, var_vals: Mapping[str, int]) -> Any:
    if x.op is Ops.CONST:
        return x.arg
    if x.op is Ops.DEFINE_VAR:
        if x.arg[0] not in var_vals:
            raise XgradError(f"no value for variable {x.arg[0]!r}; pass it in var_vals (known: {sorted(var_vals)})")
        return var_vals[x.arg[0]]
    if x.op is Ops.RANGE:
        name = x.render()
        if name not in var_vals:
            raise XgradError(f"no value for range {name!r}; pass it in var_vals as {name!r}")
        return var_vals[name]
    raise XgradError(f"sym_infer cannot evaluate {x.op}; it evaluates ALU expressions of constants and variables")


def sym_infer(u: UOp, var_vals: Mapping[str, int]) -> int:
    """Evaluate an int/bool expression with C semantics; variables by name, ranges as 'r<axis>'.

    >>> from xgrad.uop.ops import UOp
    >>> n = UOp.variable("n", 1, 10)
    >>> sym_infer((n * 3 - 7) // 2, {"n": 2})
    0
    """
    bound = {x.src[0].arg[0]: x.src[1].arg for x in u.toposort if x.op is Ops.BIND}
    var_vals = {**bound, **var_vals}
    values: dict[UOp, Any] = {}
    for x in u.toposort:
        if x.op is Ops.BIND:
            values[x] = var_vals[x.src[0].arg[0]]
        elif x.op is Ops.CAST:
            values[x] = truncate(x.dtype)(values[x.src[0]])
        elif x.op in _EXEC and x.src:
            args = tuple(values[s] for s in x.src)
            values[x] = truncate(x.dtype)(_EXEC[x.op](*args))
        elif x not in values:
            values[x] = _leaf_value(x, var_vals)
    return int(values[u])


def substitute_vars(u: UOp, var_vals: Mapping[str, int | UOp]) -> UOp:
    """Replace the variables named in `var_vals` (bound or not) by constants or expressions, then simplify.

    >>> from xgrad.uop.ops import UOp
    >>> n = UOp.variable("n", 1, 10)
    >>> substitute_vars(n * 4 + 1, {"n": 3}).render()
    '13'
    """
    mapping: dict[UOp, UOp] = {}
    for x in u.toposort:
        var = x.src[0] if x.op is Ops.BIND else x
        if var.op is Ops.DEFINE_VAR and (name := var.arg[0]) in var_vals:
            value = var_vals[name]
            mapping[x] = value if isinstance(value, UOp) else _iconst(var.dtype, value)
    return simplify(substitute(u, mapping, name="substitute_vars"))


__all__ = [
    "pm_bounds",
    "pm_canonical",
    "pm_compare",
    "pm_conditions",
    "pm_constant_fold",
    "pm_divmod",
    "pm_simplify",
    "pm_symbolic",
    "simplify",
    "substitute_vars",
    "sym_infer",
]
