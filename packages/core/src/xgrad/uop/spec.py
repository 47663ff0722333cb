"""Spec tables: the legal IR at each stage boundary. Each is a PatternMatcher whose rules return True for a legal
node (False or no match = illegal); `check` runs one over a graph and raises with the offending node."""

from __future__ import annotations

from xgrad.dtype import dtypes
from xgrad.errors import XgradError
from xgrad.uop.ops import GroupOp, Ops, UOp
from xgrad.uop.pattern import PatternMatcher, UPat


class SpecError(XgradError):
    """A pass produced IR that its stage does not allow: a bug in xgrad, not in user code."""


def _ok(**kw: UOp) -> bool:
    return True


def _index_ok(x: UOp) -> bool:
    return (
        x.src[0].op is Ops.PARAM
        and x.src[1].dtype == dtypes.index
        and (len(x.src) == 2 or x.src[2].dtype == dtypes.bool)
    )


def _alu_ok(x: UOp) -> bool:
    if x.op in GroupOp.Comparison:
        return x.dtype.scalar() == dtypes.bool and x.src[0].dtype == x.src[1].dtype
    if x.op is Ops.WHERE:
        return x.src[0].dtype.scalar() == dtypes.bool and x.src[1].dtype == x.src[2].dtype == x.dtype
    if x.op in (Ops.SHL, Ops.SHR):
        return x.dtype == x.src[0].dtype
    return all(s.dtype == x.dtype for s in x.src)


# the kernel AST the scheduler hands to codegen
spec_kernel_ast = PatternMatcher(
    [
        (UPat(Ops.SINK, name="x"), lambda x: all(s.op is Ops.STORE for s in x.src)),
        (UPat(Ops.STORE, src=(UPat(Ops.INDEX), UPat()), name="x"), lambda x: x.src[0].dtype == x.src[1].dtype),
        (UPat(Ops.INDEX, name="x"), _index_ok),
        (UPat(Ops.LOAD, src=(UPat(Ops.INDEX),), name="x"), lambda x: x.dtype == x.src[0].dtype),
        (UPat(Ops.PARAM, name="x"), lambda x: isinstance(x.arg, int)),
        (UPat(Ops.RANGE, src=(UPat(),), name="x"), lambda x: x.dtype == dtypes.index),
        (
            UPat(Ops.REDUCE, name="x"),
            lambda x: all(r.op is Ops.RANGE for r in x.src[1:]) and x.arg in (Ops.ADD, Ops.MAX, Ops.MUL),
        ),
        (UPat((Ops.CONST, Ops.DEFINE_VAR)), _ok),
        (UPat((Ops.CAST, Ops.BITCAST)), _ok),
        (UPat(GroupOp.ALU, name="x"), _alu_ok),
    ]
)


def check(root: UOp, spec: PatternMatcher, stage: str) -> None:
    for u in root.toposort:
        if spec.first_result(u) is not True:
            raise SpecError(f"illegal {u.op} in {stage}:\n{u}")


def check_kernel_ast(ast: UOp) -> None:
    check(ast, spec_kernel_ast, "kernel AST")
