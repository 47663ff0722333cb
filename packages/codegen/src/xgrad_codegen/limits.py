"""The int32 limit of kernel index math. IR in: a kernel AST from the scheduler. IR out: the same AST, or a ShapeError.

Every renderer computes indexes in 32 bits (C `int`, WGSL `i32`, CUDA and HIP `int`), and the PYTHON executor follows
the same GPU semantics. A kernel whose loop bounds or buffer indexes (through any views) can leave that range would
wrap: a wrong answer (the CPU backend's argmax of 3.2e9 elements gave 0, `Tensor.arange(2**31 + 8)[-1:]` a negative
number) or a crash. Codegen refuses such a kernel first, before it simplifies the indexes (so an index that only an
int32 wrap would fold, like arange's, is seen), naming the size and the limit.
"""

from __future__ import annotations

import math

from xgrad.dtype import dtypes
from xgrad.errors import ShapeError
from xgrad.uop.ops import KernelInfo, Ops, UOp
from xgrad.uop.symbolic import simplify

MAX_INDEX = 2**31 - 1


def check_index_bounds(ast: UOp) -> UOp:
    """`ast` unchanged, or ShapeError if a loop bound or an index of the kernel can leave int32: a dimension, an
    element count, or an index computed through a tensor's views above 2**31 - 1. An index whose interval is out of
    range gets a second look in its simplified form, which has the same value: intervals are loose where a symbolic
    size divides (x // n of a sum holding a multiple of n: the quotient's interval grows with n, its value does
    not). The whole kernel is not simplified for this: folding its casts of data would hide an index that only int32
    wrapping brings back in range (the end of a long arange)."""
    for u in ast.toposort:
        if (bad := _magnitude(u)) is not None and _magnitude(simplify(u)) is not None:
            name = ast.arg.name if isinstance(ast.arg, KernelInfo) else "?"
            raise ShapeError(
                f"kernel {name} needs an index or size of {bad:,}, beyond the {MAX_INDEX:,} (2**31 - 1) that kernel "
                f"index math (int32) holds: a dimension or the element count of a tensor in it is too large; split "
                f"the work into parts of at most {MAX_INDEX:,} elements"
            )
    return ast


def _magnitude(u: UOp) -> int | None:
    """The size or index magnitude of index node `u` when int32 cannot hold it; None when it fits (or is no index)."""
    if u.dtype is not dtypes.index:
        return None
    low, high = u.vmin_vmax
    if not (math.isfinite(low) and math.isfinite(high)):  # no bound known (a division by a size-0 axis's 0)
        return None
    if high <= MAX_INDEX and low >= -MAX_INDEX - 1:
        return None
    # a constant (a size, an offset) by its value, a loop by its size, an index by its largest magnitude
    return int(u.arg if u.op is Ops.CONST else u.src[0].vmax if u.op is Ops.RANGE else max(high, -low))
