"""Tensor cores: a matmul-shaped reduction becomes one WMMA per warp and k-block, in the renderer's register layout.

IR in: a kernel AST as `optimize` takes it. IR out, when the kernel is a matmul whose operands have a declared
TensorCore's dtype: the output ranges m and n split into blocks (GLOBAL later) and one LOCAL range of `threads` lanes;
the reduction over k becomes REDUCE(ADD, WMMA(A fragment, B fragment, 0), k-blocks) of the accumulator's vector
dtype, each fragment a VECTORIZE of the loads that lane holds (`TensorCore.place`), and the STORE one per element
of the lane's D fragment (a GEP of the sum). What a WMMA means is `xgrad_codegen.pygpu`'s warp step.

A matmul here: one REDUCE(ADD) over one k range whose value is the product of two loads (each, or the product, cast
to the accumulator dtype), A read through m and k, B through k and n (a batch range read by both is kept), with m,
n and k multiples of the instruction's shape.
"""

from __future__ import annotations

from xgrad.dtype import dtypes
from xgrad.uop.ops import AxisType, Ops, UOp
from xgrad.uop.pattern import substitute
from xgrad.uop.symbolic import simplify
from xgrad_codegen.opt import OptError, kernel_ranges, range_size
from xgrad_codegen.renderer import TensorCore
from xgrad_codegen.tc_conv import as_matmul


def _strip_cast(u: UOp) -> UOp:
    return u.src[0] if u.op is Ops.CAST else u


def _operands(red: UOp) -> tuple[UOp, UOp] | None:
    """The two loads whose product `red` sums, or None."""
    value = _strip_cast(red.src[0])
    if value.op is not Ops.MUL:
        return None
    x, y = (_strip_cast(s) for s in value.src)
    return (x, y) if x.op is Ops.LOAD and y.op is Ops.LOAD else None


def _reads(load: UOp) -> set[UOp]:
    return {u for u in simplify(load.src[0]).toposort if u.op is Ops.RANGE}


def _lane_expr(bits: tuple[tuple[int, int], ...], lane: UOp, axis: int) -> UOp:
    """The part of a position on `axis` that the lane id contributes (see TensorCore)."""
    out = UOp.const(dtypes.index, 0)
    for i, (ax, weight) in enumerate(bits):
        if ax == axis and weight:
            out = out + ((lane // (1 << i)) % 2) * weight
    return out


def lane_place(tc: TensorCore, operand: str, lane: UOp, e: int) -> tuple[UOp, UOp]:
    """(row, column) of element `e` of `operand` held by lane `lane` (a UOp)."""
    lane_bits, _ = getattr(tc, operand)
    r0, c0 = tc.place(operand, 0, e)
    return _lane_expr(lane_bits, lane, 0) + r0, _lane_expr(lane_bits, lane, 1) + c0


def match_matmul(ast: UOp, tc: TensorCore) -> tuple[UOp, UOp, UOp, UOp, UOp, UOp]:
    """(the REDUCE, A's load, B's load, m, n, k) of `ast`, a matmul `tc` can compute (any sizes: see the module
    docstring); OptError saying why when it is not one."""
    reds = [u for u in ast.toposort if u.op is Ops.REDUCE]
    if len(reds) != 1 or reds[0].arg is not Ops.ADD or len(reds[0].src) != 2 or reds[0].dtype != tc.acc:
        raise OptError(f"{tc.name} applies to one sum over one range accumulating in {tc.acc.name}")
    red = reds[0]
    k = red.src[1]
    ops = _operands(red)
    if ops is None or any(x.dtype != tc.dtype for x in ops):
        raise OptError(f"{tc.name} needs the sum of a product of two {tc.dtype.name} loads")
    first, second = ops
    only_a, only_b = _reads(first) - _reads(second), _reads(second) - _reads(first)
    if len(only_a) != 1 or len(only_b) != 1:
        raise OptError(f"{tc.name} needs one output range read only by each operand (a matmul's m and n)")
    m, n = next(iter(only_a)), next(iter(only_b))
    if any(r.arg[1] is not AxisType.LOOP for r in (m, n)) or k not in _reads(first) or k not in _reads(second):
        raise OptError(f"{tc.name}: m and n must be output loops and both operands must read k")
    if any(range_size(r) is None for r in (m, n, k)):
        raise OptError(f"{tc.name} needs m, n and k of constant size")
    return red, first, second, m, n, k


def apply_tensor_core(ast: UOp, tc: TensorCore) -> UOp:
    """`ast` with its matmul done by `tc` (see the module docstring); OptError when it is not such a matmul."""
    ast = as_matmul(ast, tc)  # a conv: one matmul over merged, padded ranges (tc_conv.py)
    red, first, second, m, n, k = match_matmul(ast, tc)
    tm, tn, tk = tc.dims
    sizes = (range_size(m), range_size(n), range_size(k))
    if any(s is None or s % t for s, t in zip(sizes, (tm, tn, tk))):
        raise OptError(f"{tc.name} needs m, n, k multiples of {tc.dims}, not {sizes}")
    next_id = max(r.arg[0] for r in kernel_ranges(ast)) + 1
    mo = UOp.range(int(sizes[0] or 0) // tm, m.arg[0], AxisType.LOOP)
    no = UOp.range(int(sizes[1] or 0) // tn, n.arg[0], AxisType.LOOP)
    ko = UOp.range(int(sizes[2] or 0) // tk, k.arg[0], AxisType.REDUCE)
    lane = UOp.range(tc.threads, next_id, AxisType.LOCAL)

    def fragment(load: UOp, operand: str, rows: tuple[UOp, UOp, int], cols: tuple[UOp, UOp, int]) -> UOp:
        loads = []
        for e in range(tc.elements(operand)):
            r, c = lane_place(tc, operand, lane, e)
            loads.append(substitute(load, {rows[0]: rows[1] * rows[2] + r, cols[0]: cols[1] * cols[2] + c}))
        return UOp(Ops.VECTORIZE, tc.dtype.vec(len(loads)), tuple(loads))

    a = fragment(first, "a", (m, mo, tm), (k, ko, tk))
    b = fragment(second, "b", (k, ko, tk), (n, no, tn))
    acc = tc.acc.vec(tc.elements("c"))
    wmma = UOp(Ops.WMMA, acc, (a, b, UOp.const(acc, 0.0)), tc)
    total = UOp(Ops.REDUCE, acc, (wmma, ko), Ops.ADD)
    stores = []
    for st in ast.src:
        for e in range(tc.elements("c")):
            r, c = lane_place(tc, "c", lane, e)
            lane_value = UOp(Ops.GEP, tc.acc, (total,), e)
            stores.append(substitute(st, {red: lane_value, m: mo * tm + r, n: no * tn + c}))
    return ast.replace(src=tuple(stores))


def tensor_core_for(ast: UOp, tensor_cores: tuple[TensorCore, ...]) -> tuple[int, UOp] | None:
    """The first of `tensor_cores` that applies to `ast`, with `ast` rewritten for it, or None."""
    for i, tc in enumerate(tensor_cores):
        try:
            return i, apply_tensor_core(ast, tc)
        except OptError:
            continue
    return None
