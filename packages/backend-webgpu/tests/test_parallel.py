"""Output ranges merge into one flat parallel range: every output element becomes work for the GPU."""

from __future__ import annotations

import itertools

import numpy as np

from xgrad.dtype import dtypes
from xgrad.tensor import Tensor
from xgrad.uop.ops import AxisType, Ops, UOp
from xgrad.uop.pattern import substitute
from xgrad.uop.symbolic import simplify
from xgrad_webgpu.parallel import flatten_output_ranges, merge_output_ranges, output_ranges

IDX = dtypes.index


def transpose_ast(shape: tuple[int, int, int]) -> UOp:
    """out[i, j, k] = x[k, i, j] with one LOOP range per output dimension (what the scheduler makes)."""
    a, b, c = shape
    r = [UOp.range(s, i) for i, s in enumerate(shape)]
    out, x = UOp(Ops.PARAM, dtypes.float32, (), 0), UOp(Ops.PARAM, dtypes.float32, (), 1)
    value = x.index(r[2] * (a * b) + r[0] * b + r[1]).load()
    return UOp(Ops.SINK, dtypes.void, (out.index(r[0] * (b * c) + r[1] * c + r[2]).store(value),))


def _indexes(ast: UOp, values: dict[UOp, int]) -> tuple[int, ...]:
    """The constant store and load indexes of `ast` with its ranges set to `values`."""
    done = simplify(substitute(ast, {r: UOp.const(IDX, v) for r, v in values.items()}))
    return tuple(int(u.src[1].arg) for u in done.toposort if u.op is Ops.INDEX)


def test_output_ranges_become_one_range_over_all_elements() -> None:
    ast = transpose_ast((2, 3, 4))
    merged = merge_output_ranges(ast)
    (flat,) = output_ranges(merged)
    assert flat.src[0].arg == 24 and flat.arg[1] is AxisType.LOOP


def test_merged_range_visits_the_same_elements_in_row_major_order() -> None:
    shape = (2, 3, 4)
    ast, merged = transpose_ast(shape), merge_output_ranges(transpose_ast(shape))
    loops, (flat,) = output_ranges(ast), output_ranges(merged)
    for n, combo in enumerate(itertools.product(*(range(s) for s in shape))):
        assert _indexes(merged, {flat: n}) == _indexes(ast, dict(zip(loops, combo)))


def test_single_symbolic_and_empty_outputs_are_left_alone() -> None:
    one = UOp.range(8, 0)
    out = UOp(Ops.PARAM, dtypes.float32, (), 0)
    ast = UOp(Ops.SINK, dtypes.void, (out.index(one).store(UOp.const(dtypes.float32, 1.0)),))
    assert merge_output_ranges(ast) is ast
    n = UOp.variable("n", 1, 9)
    r0, r1 = UOp.range(n, 0), UOp.range(4, 1)
    ast = UOp(Ops.SINK, dtypes.void, (out.index(r0 * 4 + r1).store(UOp.const(dtypes.float32, 1.0)),))
    assert merge_output_ranges(ast) is ast
    r0, r1 = UOp.range(0, 0), UOp.range(4, 1)
    ast = UOp(Ops.SINK, dtypes.void, (out.index(r0 * 4 + r1).store(UOp.const(dtypes.float32, 1.0)),))
    assert merge_output_ranges(ast) is ast


def test_permuted_reduction_matches_numpy_on_webgpu(webgpu: str) -> None:
    x = np.random.default_rng(1).normal(size=(3, 5, 7, 4)).astype(np.float32)
    out = Tensor(x, device=webgpu).permute(2, 0, 3, 1).sum(3).numpy()
    np.testing.assert_allclose(out, x.transpose(2, 0, 3, 1).sum(3), rtol=1e-5, atol=1e-6)


def test_a_reduction_keeps_its_output_ranges() -> None:
    """Only elementwise kernels are merged (see the module docstring); flatten_output_ranges merges any kernel."""
    r = [UOp.range(3, 0), UOp.range(4, 1), UOp.range(5, 2, AxisType.REDUCE)]
    out, x = UOp(Ops.PARAM, dtypes.float32, (), 0), UOp(Ops.PARAM, dtypes.float32, (), 1)
    total = UOp(Ops.REDUCE, dtypes.float32, (x.index(r[0] * 20 + r[1] * 5 + r[2]).load(), r[2]), Ops.ADD)
    ast = UOp(Ops.SINK, dtypes.void, (out.index(r[0] * 4 + r[1]).store(total),))
    assert merge_output_ranges(ast) is ast
    (flat,) = output_ranges(flatten_output_ranges(ast))
    assert flat.src[0].arg == 12
