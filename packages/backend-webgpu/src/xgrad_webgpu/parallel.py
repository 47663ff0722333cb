"""One flat parallel range per elementwise kernel, the way a GPU wants its work.

IR in: a kernel AST from the scheduler (SINK of STOREs; one LOOP range per output dimension, REDUCE ranges). IR out:
for a kernel without a reduction, the same AST with its output ranges merged into one LOOP range over all output
elements, each old range recovered from it by division and modulo by constants; a kernel with a reduction unchanged.

Why: one flat range gives codegen's GPU heuristic (`xgrad_codegen.gpu_opt`) one long contiguous loop to split into
workgroups of 64 threads with 4 elements each (a (64, 8, 6, 6) output: 72 workgroups that read neighbouring elements,
62 us on lavapipe against 112 us for the heuristic's workgroups over the separate ranges). A reduction keeps its
ranges: the heuristic then upcasts the output's spatial dimensions and unrolls a conv's window, so that the
division and modulo of the conv's window views fold into constants per lane, and makes workgroups of the other
output ranges; over one flat range (which 4 elements per thread do not split at row ends) that index math ran for
every lane and every step of the window (the demo's conv input gradient on lavapipe: 7.9 ms merged, 1.1 ms not).
"""

from __future__ import annotations

from xgrad.dtype import dtypes
from xgrad.uop.ops import AxisType, Ops, UOp
from xgrad.uop.pattern import substitute


def output_ranges(ast: UOp) -> list[UOp]:
    """The LOOP ranges of a kernel AST in axis order (the scheduler numbers output dimensions outermost first)."""
    return sorted((u for u in ast.toposort if u.op is Ops.RANGE and u.arg[1] is AxisType.LOOP), key=lambda r: r.arg[0])


def merge_output_ranges(ast: UOp) -> UOp:
    """`ast` with its constant-size output ranges merged into one when it has no reduction (see the module
    docstring)."""
    if any(u.op is Ops.RANGE and u.arg[1] is AxisType.REDUCE for u in ast.toposort):
        return ast
    return flatten_output_ranges(ast)


def flatten_output_ranges(ast: UOp) -> UOp:
    """`ast` with its constant-size output ranges merged into one, reduction or not (unchanged when there are fewer
    than two, a range has a symbolic size or the output is empty)."""
    loops = output_ranges(ast)
    if len(loops) < 2 or any(r.src[0].op is not Ops.CONST for r in loops):
        return ast
    sizes = [int(r.src[0].arg) for r in loops]
    if 0 in sizes:  # an empty kernel: nothing runs anyway
        return ast
    total = 1
    for s in sizes:
        total *= s
    flat = UOp.range(total, loops[0].arg[0], AxisType.LOOP)
    replace: dict[UOp, UOp] = {}
    stride = total
    for r, size in zip(loops, sizes):
        stride //= size
        idx = flat if stride == 1 else flat // UOp.const(dtypes.index, stride)
        if stride * size != total:  # not the outermost: wrap
            idx = idx % UOp.const(dtypes.index, size)
        replace[r] = idx
    return substitute(ast, replace)
