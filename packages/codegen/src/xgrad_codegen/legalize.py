"""Legalisation of linear programs: a linear program (list of UOps ending in SINK) and a renderer's rewrite table in,
the rewritten linear program out, still linear (each replacement placed where the node it replaces stood).
`pm_split_vector_ops` builds the common table of a language with scalar-only ops."""

from __future__ import annotations

from xgrad.dtype import dtypes
from xgrad.uop.ops import GroupOp, Ops, UOp
from xgrad.uop.pattern import PatternMatcher, UPat


def split_vector_alu(x: UOp) -> UOp | None:
    """A vector ALU op the language has no vector form of -> one scalar op per lane, gathered by VECTORIZE."""
    if x.dtype.count == 1:
        return None
    lanes = []
    for i in range(x.dtype.count):
        srcs = tuple(UOp(Ops.GEP, s.dtype.scalar(), (s,), i) if s.dtype.count > 1 else s for s in x.src)
        lanes.append(UOp(x.op, x.dtype.scalar(), srcs, x.arg))
    return UOp(Ops.VECTORIZE, x.dtype, tuple(lanes))


def split_bool_vector_cast(x: UOp) -> UOp | None:
    """A vector CAST to or from bool -> per-lane casts (bool vectors are not real vector types in C)."""
    if x.dtype.count == 1 or not (dtypes.is_bool(x.dtype) or dtypes.is_bool(x.src[0].dtype)):
        return None
    return split_vector_alu(x)


def pm_split_vector_ops(ops: frozenset[Ops]) -> PatternMatcher:
    """The rules that split vector `ops` into lanes (ops a language only has on scalars)."""
    return PatternMatcher(
        [
            (UPat(ops, name="x"), split_vector_alu),
            (UPat(Ops.CAST, name="x"), split_bool_vector_cast),
        ]
    )


PURE_OPS = GroupOp.ALU | {Ops.CONST, Ops.GEP, Ops.VECTORIZE, Ops.CAST, Ops.BITCAST, Ops.INDEX}


def legalize_linear(uops: list[UOp], pm: PatternMatcher | None) -> list[UOp]:
    """Apply rewrite table `pm` to a linear program, keeping it linear: a rewritten node is replaced by the nodes of
    its replacement, placed where it stood (sources first); users see the replacement. New pure nodes already visible
    in the current loop scope are reused, not placed twice."""
    if pm is None:
        return uops
    out: list[UOp] = []
    new_of: dict[UOp, UOp] = {}
    scopes: list[set[UOp]] = [set()]

    def visible(u: UOp) -> bool:
        return any(u in s for s in scopes)

    def place(u: UOp, depth: int = 0) -> UOp:
        assert depth < 64, f"legalize rules do not terminate at {u.op}"
        if (new := pm.rewrite(u)) is not None:
            return ensure(new, depth + 1)
        if u.op is Ops.END and len(scopes) > 1:
            scopes.pop()
        out.append(u)
        scopes[-1].add(u)
        if u.op is Ops.RANGE:
            scopes.append({u})
        return u

    def ensure(u: UOp, depth: int) -> UOp:
        if visible(u):
            return u
        srcs = tuple(ensure(s, depth) for s in u.src)
        return place(u.replace(src=srcs), depth)

    for u in uops:
        rebuilt = u.replace(src=tuple(new_of.get(s, s) for s in u.src))
        if rebuilt.op in PURE_OPS and visible(rebuilt):
            new_of[u] = rebuilt
            continue
        new_of[u] = place(rebuilt)
    return out
