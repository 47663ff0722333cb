"""Reverse-mode autodiff over the tensor graph.

In: a tensor-graph root UOp, the gradient of the root, and the target UOps. Out: a map from each reached target to a
tensor-graph UOp holding its gradient (built from the same tensor-graph ops, so it schedules like any other graph).

`pm_gradient` holds one rule per op. A rule gets the node as `ret` and the gradient of its output as `ctx`, and
returns one gradient per source (None where no gradient flows: comparisons, WHERE conditions, DETACH, BITCAST).
Ties in MAX (elementwise and reduction) split the gradient evenly, as torch's `maximum` and `amax` do.
"""

from __future__ import annotations

import math

from xgrad.dtype import dtypes, sum_acc_dtype
from xgrad.errors import GradientError
from xgrad.uop.ops import GroupOp, Ops, UOp
from xgrad.uop.pattern import PatternMatcher, UPat

GradTuple = tuple[UOp | None, ...]


# ---- small builders (every constant takes the shape and device of the node it meets) ----
def _neg(x: UOp) -> UOp:
    return UOp(Ops.NEG, x.dtype, (x,))


def _where(cond: UOp, a: UOp, b: UOp) -> UOp:
    return UOp(Ops.WHERE, a.dtype, (cond, a, b))


def _zeros(x: UOp) -> UOp:
    return x.const_like(0)


def _inverse_order(order: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sorted(range(len(order)), key=order.__getitem__))


# ---- rules: (ctx = gradient of ret, ret = the node) -> one gradient per source ----
def grad_cast(ctx: UOp, ret: UOp) -> GradTuple:
    src = ret.src[0]
    return (ctx.cast(src.dtype),) if dtypes.is_float(src.dtype) else (None,)


def grad_sin(ctx: UOp, ret: UOp) -> GradTuple:
    x = ret.src[0]
    cos_x = UOp(Ops.SIN, x.dtype, (x.const_like(math.pi / 2).alu(Ops.ADD, _neg(x)),))
    return (ctx.alu(Ops.MUL, cos_x),)


def grad_max(ctx: UOp, ret: UOp) -> GradTuple:
    """As torch: the larger operand takes the gradient, a tie splits it, and with a NaN both take it."""
    a, b = ret.src
    unless_smaller = _where(a.alu(Ops.CMPEQ, b), ctx.alu(Ops.MUL, 0.5), ctx)
    return (
        _where(a.alu(Ops.CMPLT, b), _zeros(ctx), unless_smaller),
        _where(b.alu(Ops.CMPLT, a), _zeros(ctx), unless_smaller),
    )


def grad_reduce_sum(ctx: UOp, ret: UOp) -> GradTuple | None:
    if ret.arg[0] is not Ops.ADD:
        return None
    x = ret.src[0]
    assert x.shape is not None
    return (ctx.expand(x.shape),)


def grad_reduce_max(ctx: UOp, ret: UOp) -> GradTuple | None:
    if ret.arg[0] is not Ops.MAX:
        return None
    x = ret.src[0]
    assert x.shape is not None
    is_max = x.alu(Ops.CMPEQ, ret.expand(x.shape))
    if dtypes.is_float(x.dtype):  # a NaN maximum: its NaNs share the gradient (as torch's max)
        is_max = is_max.alu(Ops.OR, x.alu(Ops.CMPNE, x))
    count = _where(is_max, x.const_like(1), _zeros(x)).reduce_axis(Ops.ADD, ret.arg[1])
    share = ctx.alu(Ops.FDIV, count).expand(x.shape)
    return (_where(is_max, share, _zeros(share)),)


def grad_reduce_prod(ctx: UOp, ret: UOp) -> GradTuple | None:
    """d prod / d x_i is the product of the other elements. Dividing the product by x_i fails at zeros, so (as torch
    does) the product of the nonzero elements is used: with no zero it divided by x_i, with one zero it is the
    gradient of that zero (the others get 0), with two or more zeros every gradient is 0."""
    if ret.arg[0] is not Ops.MUL:
        return None
    x = ret.src[0]
    assert x.shape is not None
    axes = ret.arg[1]
    is_zero = x.alu(Ops.CMPEQ, x.const_like(0))
    nonzero = _where(is_zero, x.const_like(1), x)
    prod_nonzero = nonzero.reduce_axis(Ops.MUL, axes).expand(x.shape)
    zeros = _where(is_zero, x.const_like(1), _zeros(x)).reduce_axis(Ops.ADD, axes).expand(x.shape)
    only_zero = is_zero.alu(Ops.AND, zeros.alu(Ops.CMPEQ, x.const_like(1)))
    others = _where(
        zeros.alu(Ops.CMPEQ, _zeros(x)),
        prod_nonzero.alu(Ops.FDIV, nonzero),
        _where(only_zero, prod_nonzero, _zeros(x)),
    )
    return (ctx.expand(x.shape).alu(Ops.MUL, others),)


def grad_expand(ctx: UOp, ret: UOp) -> GradTuple:
    x = ret.src[0]
    assert x.shape is not None and ret.shape is not None
    axes = tuple(i for i, (s, n) in enumerate(zip(x.shape, ret.shape)) if s != n)
    acc = sum_acc_dtype(ctx.dtype)
    return (ctx.cast(acc).reduce_axis(Ops.ADD, axes).cast(ctx.dtype).reshape(x.shape),)


def _sum_to(grad: UOp, src: UOp) -> UOp:
    """`grad` summed over the axes that `src` (0-d, or of the same rank with 1s) was broadcast along."""
    assert grad.shape is not None and src.shape is not None
    if len(src.shape) == 0:
        axes = tuple(range(len(grad.shape)))
    else:
        assert len(src.shape) == len(grad.shape), f"gradient shape {grad.shape} does not broadcast from {src.shape}"
        axes = tuple(i for i, (s, n) in enumerate(zip(src.shape, grad.shape)) if s != n)
    acc = sum_acc_dtype(grad.dtype)
    return grad.cast(acc).reduce_axis(Ops.ADD, axes).cast(grad.dtype).reshape(src.shape)


def grad_pad(ctx: UOp, ret: UOp) -> GradTuple:
    x = ret.src[0]
    assert x.shape is not None
    return (ctx.shrink(tuple((before, before + s) for (before, _), s in zip(ret.arg, x.shape))),)


def grad_shrink(ctx: UOp, ret: UOp) -> GradTuple:
    x = ret.src[0]
    assert x.shape is not None
    return (ctx.pad(tuple((start, s - end) for (start, end), s in zip(ret.arg, x.shape))),)


def grad_reshape(ctx: UOp, ret: UOp) -> GradTuple:
    x = ret.src[0]
    assert x.shape is not None
    return (ctx.reshape(x.shape),)


def grad_copy(ctx: UOp, ret: UOp) -> GradTuple:
    home = UOp(Ops.DEVICE, arg=ret.src[0].device)
    return (UOp(Ops.COPY, ctx.dtype, (ctx, home)), None)


pm_gradient = PatternMatcher(
    [
        # unary math
        (UPat(Ops.CAST, name="ret"), grad_cast),
        (UPat(Ops.RECIPROCAL, name="ret"), lambda ctx, ret: (_neg(ctx.alu(Ops.MUL, ret).alu(Ops.MUL, ret)),)),
        (UPat(Ops.SIN, name="ret"), grad_sin),
        (
            UPat(Ops.LOG2, name="ret"),
            lambda ctx, ret: (ctx.alu(Ops.FDIV, ret.src[0].alu(Ops.MUL, math.log(2))),),
        ),
        (UPat(Ops.EXP2, name="ret"), lambda ctx, ret: (ctx.alu(Ops.MUL, ret).alu(Ops.MUL, math.log(2)),)),
        (UPat(Ops.SQRT, name="ret"), lambda ctx, ret: (ctx.alu(Ops.FDIV, ret.alu(Ops.MUL, 2)),)),
        (UPat(Ops.NEG), lambda ctx: (_neg(ctx),)),
        (UPat(Ops.TRUNC), lambda ctx: (_zeros(ctx),)),
        # binary and ternary math
        (UPat(Ops.ADD), lambda ctx: (ctx, ctx)),
        (UPat(Ops.SUB), lambda ctx: (ctx, _neg(ctx))),
        (UPat(Ops.MUL, name="ret"), lambda ctx, ret: (ctx.alu(Ops.MUL, ret.src[1]), ctx.alu(Ops.MUL, ret.src[0]))),
        (
            UPat(Ops.FDIV, name="ret"),
            lambda ctx, ret: (ctx.alu(Ops.FDIV, ret.src[1]), _neg(ctx.alu(Ops.MUL, ret).alu(Ops.FDIV, ret.src[1]))),
        ),
        (UPat(Ops.MAX, name="ret"), grad_max),
        (
            UPat(Ops.MULACC, name="ret"),
            lambda ctx, ret: (ctx.alu(Ops.MUL, ret.src[1]), ctx.alu(Ops.MUL, ret.src[0]), ctx),
        ),
        (
            UPat(Ops.WHERE, name="ret"),
            lambda ctx, ret: (None, _where(ret.src[0], ctx, _zeros(ctx)), _where(ret.src[0], _zeros(ctx), ctx)),
        ),
        (UPat(GroupOp.Comparison), lambda ctx: (None, None)),
        # reductions
        (UPat(Ops.REDUCE_AXIS, name="ret"), grad_reduce_sum),
        (UPat(Ops.REDUCE_AXIS, name="ret"), grad_reduce_max),
        (UPat(Ops.REDUCE_AXIS, name="ret"), grad_reduce_prod),
        # movement: each gradient is the inverse movement
        (UPat(Ops.RESHAPE, name="ret"), grad_reshape),
        (UPat(Ops.PERMUTE, name="ret"), lambda ctx, ret: (ctx.permute(_inverse_order(ret.arg)),)),
        (UPat(Ops.EXPAND, name="ret"), grad_expand),
        (UPat(Ops.PAD, name="ret"), grad_pad),
        (UPat(Ops.SHRINK, name="ret"), grad_shrink),
        (UPat(Ops.FLIP, name="ret"), lambda ctx, ret: (ctx.flip(ret.arg),)),
        # structure
        (UPat(Ops.CONTIGUOUS), lambda ctx: (ctx,)),
        (UPat(Ops.CONTIGUOUS_BACKWARD), lambda ctx: (UOp(Ops.CONTIGUOUS, ctx.dtype, (ctx,)),)),
        (UPat(Ops.DETACH), lambda ctx: (None,)),
        (UPat(Ops.BITCAST), lambda ctx: (None,)),
        (UPat(Ops.COPY, name="ret"), grad_copy),
        (UPat(Ops.ASSIGN), lambda ctx: (None, ctx)),
    ]
)


# ---- custom kernels (xgrad.custom_kernel): an output is DETACH(buffer) with arg (call, position); the gradient goes
# from the outputs to their CUSTOM_KERNEL call, and from the call to its arguments through the call's grad_fxn ----
def _grad_sources(u: UOp) -> tuple[UOp, ...]:
    """Where a gradient flows on from `u`: its sources; from a custom kernel's output to the call (not the buffer),
    from the call to its arguments (not the kernel)."""
    if u.op is Ops.DETACH and u.arg is not None:
        return (u.arg[0],)
    return u.src[1:] if u.op is Ops.CUSTOM_KERNEL else u.src


def _walk_through_calls(root: UOp) -> dict[UOp, None]:
    """The topological order of the nodes under root along `_grad_sources` (it reaches custom kernels' arguments)."""
    order: dict[UOp, None] = {}
    stack: list[tuple[UOp, bool]] = [(root, False)]
    while stack:
        node, ready = stack.pop()
        if ready:
            order[node] = None
        elif node not in order:
            stack.append((node, True))
            stack.extend((s, False) for s in reversed(_grad_sources(node)) if s not in order)
    return order


def call_gradient(call: UOp, received: dict[int, UOp]) -> tuple[UOp | None, ...]:
    """The gradients of a custom kernel's arguments, from its `grad_fxn` and the gradients its outputs received (by
    position; as tinygrad, only those are passed: `grad_fxn(g, call)` for one, `grad_fxn(*gs, call=call)` for more)."""
    if call.arg is None:
        raise GradientError(
            "a custom kernel made without grad_fxn cannot be differentiated; pass grad_fxn=(*grads, call) -> "
            "(one gradient UOp or None per argument)"
        )
    grads = [received[k] for k in sorted(received)]
    out = call.arg(*grads, call=call) if len(grads) > 1 else call.arg(grads[0], call)
    args = call.src[1:]
    if not isinstance(out, (tuple, list)) or len(out) != len(args):
        raise GradientError(
            f"grad_fxn of a custom kernel must return one gradient (or None) per argument ({len(args)})"
        )
    return tuple(None if g is None else g if isinstance(g, UOp) else g.uop for g in out)


def _on_path(order: dict[UOp, None], targets: set[UOp]) -> dict[UOp, bool]:
    """For every node of a topological `order`: whether some target is under it (or is it)."""
    on_path: dict[UOp, bool] = {}
    for u in order:
        on_path[u] = u in targets or any(on_path[s] for s in _grad_sources(u))
    return on_path


def nodes_with_gradient_path(root: UOp) -> set[UOp]:
    """The nodes under root (and root) that a gradient can reach: the walk stops at DETACH, which cuts the graph
    (a custom kernel's output leads on to its call's arguments)."""
    seen: set[UOp] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if node in seen or (node.op is Ops.DETACH and node.arg is None):
            continue
        seen.add(node)
        stack.extend(_grad_sources(node))
    return seen


def compute_gradient(root: UOp, root_grad: UOp, targets: set[UOp]) -> dict[UOp, UOp]:
    """Gradients of `root` with respect to each target that a differentiable path reaches.

    Walks the graph from root to leaves (reverse topological order), so a node's gradient is complete (summed over
    all its users) before its rule runs. Only nodes with a target under them are visited. Targets that no gradient
    reaches are absent from the result."""
    order = root.walk()  # not cached on root: the loss is dropped after backward (see UOp.walk)
    if any(u.op is Ops.DETACH and u.arg is not None for u in order):  # custom kernels: on to their arguments
        order = _walk_through_calls(root)
    on_path = _on_path(order, targets)
    grads: dict[UOp, UOp] = {root: root_grad}
    calls: dict[UOp, dict[int, UOp]] = {}  # custom kernel call -> the gradients of its outputs, by position
    for node in reversed(order):
        srcs = _grad_sources(node)
        if not any(on_path[s] for s in srcs):
            continue
        if node.op is Ops.CUSTOM_KERNEL:
            if (received := calls.get(node)) is None:
                continue
            src_grads = call_gradient(node, received)
        else:
            if (grad := grads.get(node)) is None:
                continue
            if node.op is Ops.DETACH and node.arg is not None:  # a custom kernel's output: on to its call
                call, k = node.arg
                received = calls.setdefault(call, {})
                received[k] = received[k].alu(Ops.ADD, grad) if k in received else grad
                continue
            src_grads = pm_gradient.first_result(node, grad)
        if src_grads is None:
            raise GradientError(f"no gradient rule for {node.op.name} ({node.dtype.name}); it cannot be differentiated")
        assert len(src_grads) == len(srcs), f"gradient rule for {node.op} returned {len(src_grads)} grads"
        for src, src_grad in zip(srcs, src_grads):
            if src_grad is None or not on_path[src]:
                continue
            if src_grad.shape != src.shape:  # a 0-d operand broadcast implicitly: its gradient is summed to it
                src_grad = _sum_to(src_grad, src)
            grads[src] = grads[src].alu(Ops.ADD, src_grad) if src in grads else src_grad
    return {t: g for t, g in grads.items() if t in targets}


__all__ = ["pm_gradient", "compute_gradient", "nodes_with_gradient_path"]
