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


def _movement_ok(x: UOp) -> bool:
    return x.src[0].shape is not None and x.shape is not None and x.dtype == x.src[0].dtype


def _same_shape_srcs(x: UOp) -> bool:
    shapes = {s.shape for s in x.src if s.shape is not None}
    return len(shapes) <= 1


# the tensor graph `Tensor` builds and the scheduler takes
spec_tensor_graph = PatternMatcher(
    [
        (UPat(Ops.DEVICE, name="x"), lambda x: isinstance(x.arg, str)),
        (UPat(Ops.BUFFER, src=(UPat(Ops.DEVICE),), name="x"), lambda x: isinstance(x.arg, tuple) and x.arg[1] >= 0),
        (UPat(Ops.CONST, src=(UPat(Ops.DEVICE),)), _ok),
        (UPat(Ops.IOTA, src=(UPat(Ops.DEVICE),)), _ok),
        (UPat((Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP), name="x"), _movement_ok),
        (UPat(Ops.REDUCE_AXIS, name="x"), lambda x: x.arg[0] in (Ops.ADD, Ops.MAX, Ops.MUL)),
        (UPat((Ops.CONTIGUOUS, Ops.CONTIGUOUS_BACKWARD, Ops.DETACH), name="x"), lambda x: x.dtype == x.src[0].dtype),
        (UPat(Ops.COPY, src=(UPat(), UPat(Ops.DEVICE))), _ok),
        (UPat(Ops.COLLECTIVE, name="x"), lambda x: len(x.src) >= 1 and all(s.shape is not None for s in x.src)),
        (UPat(Ops.ASSIGN, name="x"), lambda x: x.src[0].shape == x.src[1].shape and x.src[0].dtype == x.src[1].dtype),
        (UPat((Ops.CAST, Ops.BITCAST)), _ok),
        (UPat(Ops.SINK), _ok),
        (UPat(GroupOp.ALU, name="x"), lambda x: _alu_ok(x) and _same_shape_srcs(x)),
    ]
)

# the linear program codegen hands to renderers
spec_linear = PatternMatcher(
    [
        (UPat((Ops.PARAM, Ops.DEFINE_VAR, Ops.CONST, Ops.SINK, Ops.SPECIAL, Ops.BARRIER)), _ok),
        (UPat(Ops.DEFINE_LOCAL, name="x"), lambda x: not x.src and x.arg[1] > 0),
        (UPat(Ops.RANGE, src=(UPat(),)), _ok),
        (UPat(Ops.END, src=(UPat(Ops.RANGE),)), _ok),
        (UPat(Ops.INDEX, name="x"), lambda x: x.src[0].op in (Ops.PARAM, Ops.DEFINE_LOCAL)),
        (UPat(Ops.LOAD, src=(UPat(Ops.INDEX),), name="x"), lambda x: x.dtype == x.src[0].dtype),
        (UPat(Ops.STORE, src=(UPat(Ops.INDEX), UPat()), name="x"), lambda x: x.src[0].dtype == x.src[1].dtype),
        (UPat(Ops.DEFINE_ACC, name="x"), lambda x: len(x.src) == 1),
        (UPat(Ops.ASSIGN_ACC, src=(UPat(Ops.DEFINE_ACC), UPat()), name="x"), lambda x: x.dtype == x.src[0].dtype),
        (UPat((Ops.VECTORIZE, Ops.GEP, Ops.CAST, Ops.BITCAST)), _ok),
        (UPat(Ops.WMMA, name="x"), lambda x: len(x.src) == 3 and x.dtype == x.src[2].dtype),
        (UPat(GroupOp.ALU, name="x"), _alu_ok),
    ]
)


def check_linear(program: list[UOp]) -> None:
    """A linear program: every op legal, sources before users, loops properly nested, a SINK at the end."""
    seen: set[UOp] = set()
    open_loops: list[UOp] = []
    for u in program:
        if spec_linear.first_result(u) is not True:
            raise SpecError(f"illegal {u.op} in a linear program:\n{u}")
        if any(s not in seen for s in u.src):
            raise SpecError(f"{u.op} uses a value defined after it in the linear program")
        if u.op is Ops.RANGE:
            open_loops.append(u)
        if u.op is Ops.END:
            if not open_loops or open_loops.pop() is not u.src[0]:
                raise SpecError("END does not close the innermost open loop")
        seen.add(u)
    if open_loops or not program or program[-1].op is not Ops.SINK:
        raise SpecError("a linear program must close every loop and end in a SINK")


def check_tensor_graph(root: UOp) -> None:
    check(root, spec_tensor_graph, "tensor graph")


def check(root: UOp, spec: PatternMatcher, stage: str) -> None:
    for u in root.walk():  # not cached on `root`: a checked graph may be dropped right after (see `UOp.walk`)
        if spec.first_result(u) is not True:
            raise SpecError(f"illegal {u.op} in {stage}:\n{u}")


def check_kernel_ast(ast: UOp) -> None:
    check(ast, spec_kernel_ast, "kernel AST")
