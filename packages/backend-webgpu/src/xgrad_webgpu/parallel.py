"""One flat parallel range per kernel, the way a GPU wants its work.

IR in: a kernel AST from the scheduler (SINK of STOREs; one LOOP range per output dimension, REDUCE ranges). IR out:
the same AST with its output ranges merged into one LOOP range over all output elements; each old range is recovered
from it by division and modulo by constants.

Why: one flat range gives codegen's GPU heuristic (`xgrad_codegen.gpu_opt`) one long contiguous loop to split into
workgroups of up to 64 threads (LOCAL) after its register tile (a (64, 8, 6, 6) output: 18432 elements, 4 per
thread, 72 workgroups of 64 threads that read neighbouring elements), whatever the output's shape; separate short
ranges would each become a small workgroup dimension.
"""

from __future__ import annotations

from xgrad.dtype import dtypes
from xgrad.uop.ops import AxisType, Ops, UOp
from xgrad.uop.pattern import substitute


def output_ranges(ast: UOp) -> list[UOp]:
    """The LOOP ranges of a kernel AST in axis order (the scheduler numbers output dimensions outermost first)."""
    return sorted((u for u in ast.toposort if u.op is Ops.RANGE and u.arg[1] is AxisType.LOOP), key=lambda r: r.arg[0])


def merge_output_ranges(ast: UOp) -> UOp:
    """`ast` with its constant-size output ranges merged into one (unchanged when there are fewer than two, or a
    range has a symbolic size or the output is empty)."""
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
