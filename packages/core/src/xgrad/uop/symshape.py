"""Symbolic shapes: sizes that are index expressions of bound variables.

`UOp.variable(name, min, max)` is a DEFINE_VAR; `.bind(value)` makes BIND(DEFINE_VAR, CONST value). A tensor shape may
hold `sint`s (int or such an expression), so the args of movement ops and the sizes of IOTA nodes may too.

IR in (`unbind_graph`): a tensor graph whose shape args hold BINDs. IR out: the same graph with every BIND replaced by
its DEFINE_VAR, plus `var_vals` (name -> value). The unbound graph is the same for every value, so the schedule cache
hits, the kernel ASTs are the same and each kernel is compiled once for the whole range of its variables; the values
reach the kernels at launch. `rebind` puts values back (a realized view keeps showing its bound shape) and
`resolve_binds` replaces each BIND by its value (a concrete graph, used to read data back).

Buffers of symbolic size are allocated at the size's maximum over the variables' ranges (`sint_max`), so one buffer
(and one JIT capture) serves every value; the tensor is a view of the first `numel` elements.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from xgrad.dtype import dtypes
from xgrad.errors import ShapeError
from xgrad.uop.ops import Ops, UOp, sint
from xgrad.uop.symbolic import simplify, sym_infer


def _arg_uops(arg: Any) -> Iterator[UOp]:
    if isinstance(arg, UOp):
        yield arg
    elif isinstance(arg, tuple):
        for a in arg:
            yield from _arg_uops(a)


def _map_arg(arg: Any, memo: Mapping[UOp, UOp]) -> Any:
    if isinstance(arg, UOp):
        return memo[arg]
    if isinstance(arg, tuple):
        return tuple(_map_arg(a, memo) for a in arg)
    return arg


def _has_uop_arg(u: UOp) -> bool:
    return isinstance(u.arg, (UOp, tuple)) and next(_arg_uops(u.arg), None) is not None


def deep_substitute(roots: Iterable[UOp], mapping: Mapping[UOp, UOp]) -> list[UOp]:
    """Replace nodes by identity, in sources and in the UOps inside args (shapes), without recursion."""
    memo: dict[UOp, UOp] = {}
    stack: list[tuple[UOp, bool]] = [(r, False) for r in roots]
    while stack:
        node, ready = stack.pop()
        if node in memo:
            continue
        if node in mapping:
            memo[node] = mapping[node]
            continue
        deps = (*node.src, *_arg_uops(node.arg)) if isinstance(node.arg, (UOp, tuple)) else node.src
        if not ready:
            stack.append((node, True))
            stack.extend((d, False) for d in deps if d not in memo)
            continue
        new_src = tuple(memo[s] for s in node.src)
        new_arg = _map_arg(node.arg, memo) if isinstance(node.arg, (UOp, tuple)) else node.arg
        same = all(a is b for a, b in zip(new_src, node.src)) and new_arg == node.arg
        memo[node] = node if same else UOp(node.op, node.dtype, new_src, new_arg)
    return [memo[r] for r in roots]


@functools.lru_cache(maxsize=4096)
def tuple_holds_uops(arg: tuple[Any, ...]) -> bool:
    """Whether a (hashable) tuple arg has a UOp inside; cached: the same shapes come back in every step."""
    return next(_arg_uops(arg), None) is not None


def holds_uops(arg: Any) -> bool:
    """Whether a node's arg is or holds a UOp: a symbolic size, or a shape or bound with one in it."""
    return isinstance(arg, UOp) or (type(arg) is tuple and tuple_holds_uops(arg))


def _shape_nodes(roots: Iterable[UOp]) -> list[UOp]:
    """Every UOp inside the shape args of the graphs under `roots` (the expressions and their leaves)."""
    out: dict[UOp, None] = {}
    for u in UOp(Ops.SINK, src=tuple(roots)).toposort:
        arg = u.arg
        if holds_uops(arg):
            for a in _arg_uops(arg):
                out.update(a.toposort)
    return list(out)


def bound_values(binds: Iterable[UOp]) -> dict[str, int]:
    """name -> value of BIND nodes; ShapeError when one variable is bound to two values."""
    var_vals: dict[str, int] = {}
    for b in binds:
        name, value = b.src[0].arg[0], int(b.src[1].arg)
        if var_vals.setdefault(name, value) != value:
            raise ShapeError(
                f"variable {name!r} is bound to both {var_vals[name]} and {value} at once; "
                "bind each variable to one value"
            )
    return var_vals


def graph_binds(roots: Iterable[UOp]) -> list[UOp]:
    """The BINDs in the shapes of the graphs under `roots`."""
    return [u for u in _shape_nodes(roots) if u.op is Ops.BIND]


def unbind_graph(roots: list[UOp]) -> tuple[list[UOp], dict[str, int]]:
    """`roots` with every BIND (in shapes) replaced by its DEFINE_VAR, and the bound values by variable name."""
    binds = graph_binds(roots)
    if not binds:
        return roots, {}
    var_vals = bound_values(binds)
    return deep_substitute(roots, {b: b.src[0] for b in binds}), var_vals


def graph_vars(roots: Iterable[UOp]) -> set[UOp]:
    """The DEFINE_VARs (bound or not) in the shapes of the graphs under `roots`."""
    return {u for u in _shape_nodes(roots) if u.op is Ops.DEFINE_VAR}


def rebind(u: UOp, var_vals: Mapping[str, int]) -> UOp:
    """`u` with each unbound variable named in `var_vals` bound to its value (a BIND already there is rebound)."""
    mapping: dict[UOp, UOp] = {}
    for x in _shape_nodes([u]):
        var = x.src[0] if x.op is Ops.BIND else x
        if var.op is Ops.DEFINE_VAR and var.arg[0] in var_vals:
            mapping[x] = var.bind(var_vals[var.arg[0]])  # a BIND is replaced whole: its variable is not visited
    return deep_substitute([u], mapping)[0] if mapping else u


def resolve_binds(u: UOp) -> UOp:
    """`u` with every size expression in its args replaced by its value now: a graph of concrete shapes."""
    memo: dict[UOp, UOp] = {}
    for x in u.toposort:
        new_src = tuple(memo[s] for s in x.src)
        new_arg = _resolve_arg(x.arg) if _has_uop_arg(x) else x.arg
        same = all(a is b for a, b in zip(new_src, x.src)) and new_arg is x.arg
        memo[x] = x if same else UOp(x.op, x.dtype, new_src, new_arg)
    return memo[u]


def _resolve_arg(arg: Any) -> Any:
    if isinstance(arg, UOp):
        return sint_value(arg)
    if isinstance(arg, tuple):
        return tuple(_resolve_arg(a) for a in arg)
    return arg


# ---- sizes ----
def is_symbolic(shape: Iterable[sint]) -> bool:
    return any(isinstance(s, UOp) for s in shape)


def sint_value(s: sint) -> int:
    """The value of a size now: an int, or an expression of bound variables evaluated at their values."""
    if isinstance(s, int):
        return s

    unbound = [x.arg[0] for x in s.toposort if x.op is Ops.DEFINE_VAR]
    bound = {x.src[0].arg[0] for x in s.toposort if x.op is Ops.BIND}
    if missing := [n for n in unbound if n not in bound]:
        raise ShapeError(f"size {s.render()} uses the unbound variable(s) {missing}; bind them with .bind(value)")
    return int(sym_infer(s, {}))


def sint_max(s: sint) -> int:
    """The largest value a size can take over its variables' ranges (an int as is)."""
    if isinstance(s, int):
        return s
    hi = s.vmax
    if not isinstance(hi, int):
        raise ShapeError(f"size {s.render()} has no finite upper bound; give its variables a max")
    return hi


def sint_min(s: sint) -> int:
    if isinstance(s, int):
        return s
    lo = s.vmin
    return lo if isinstance(lo, int) else 0


Polynomial = dict[tuple[str, ...], int]


def _atom(u: UOp) -> str:
    """The name of a size's leaf: a variable by its name (bound or not), any other node by its printed form."""
    if u.op is Ops.DEFINE_VAR:
        return str(u.arg[0])
    if u.op is Ops.BIND:
        return str(u.src[0].arg[0])
    return f"<{u!r}>"


def size_polynomial(s: sint) -> Polynomial:
    """A size as a sum of monomials: sorted leaf names -> integer coefficient (zero terms dropped). Sums and products
    are expanded, so `i+j` and `j+i`, or `i*j` and `j*i`, give the same polynomial; other nodes (`//`, `%`, max) are
    leaves."""
    if isinstance(s, int):
        return {(): s} if s else {}
    if s.op is Ops.CONST and isinstance(s.arg, int):
        return {(): s.arg} if s.arg else {}
    if s.op is Ops.ADD:
        out = dict(size_polynomial(s.src[0]))
        for k, c in size_polynomial(s.src[1]).items():
            out[k] = out.get(k, 0) + c
        return {k: c for k, c in out.items() if c}
    if s.op is Ops.MUL:
        prod_: Polynomial = {}
        for ka, ca in size_polynomial(s.src[0]).items():
            for kb, cb in size_polynomial(s.src[1]).items():
                k = tuple(sorted(ka + kb))
                prod_[k] = prod_.get(k, 0) + ca * cb
        return {k: c for k, c in prod_.items() if c}
    return {(_atom(s),): 1}


def sym_equal(a: sint, b: sint) -> bool:
    """Whether two sizes are equal for every value of their variables: the same expanded polynomial (sums and
    products in any order), or a difference that simplifies to 0."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if a is b or size_polynomial(a) == size_polynomial(b):
        return True

    diff = simplify(a - b if isinstance(a, UOp) else UOp.const(dtypes.index, a) - b)
    return diff.op is Ops.CONST and diff.arg == 0


def same_symbolic_size(a: object, b: object) -> bool:
    """Whether a and b are symbolic sizes (UOps) equal for every value of their variables, though maybe written
    differently (`i+j`, `j+i`)."""
    return isinstance(a, UOp) and isinstance(b, UOp) and sym_equal(a, b)


def canonical_sum(sizes: Iterable[sint]) -> sint:
    """The sum of sizes built in one order whatever order they come in (ints first, then the expressions by their
    leaves), so `cat` along a symbolic axis gives the same size node for (i, j) and (j, i)."""
    items = list(sizes)
    total: sint = sum(x for x in items if isinstance(x, int))
    for x in sorted((x for x in items if isinstance(x, UOp)), key=lambda u: sorted(size_polynomial(u).items())):
        total = x if isinstance(total, int) and total == 0 else total + x
    return total


def sym_prod(xs: Iterable[sint]) -> sint:
    """The product of sizes, an int when all are ints (ones are skipped so expressions stay small)."""
    out: sint = 1
    for x in xs:
        if isinstance(x, int) and x == 1:
            continue
        out = x if isinstance(out, int) and out == 1 else out * x
    return out


def shape_str(shape: Iterable[sint]) -> str:
    """A shape for messages: `(2, i=3)`."""
    parts = [str(s) if isinstance(s, int) else repr(s) for s in shape]
    return f"({parts[0]},)" if len(parts) == 1 else f"({', '.join(parts)})"


__all__ = [
    "bound_values",
    "deep_substitute",
    "graph_binds",
    "graph_vars",
    "holds_uops",
    "is_symbolic",
    "rebind",
    "resolve_binds",
    "shape_str",
    "sint_max",
    "sint_min",
    "sint_value",
    "sym_equal",
    "sym_prod",
    "unbind_graph",
]
