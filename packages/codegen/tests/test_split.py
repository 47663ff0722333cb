"""SPLIT and wide packed panels (`xgrad_codegen.opt`, `xgrad_codegen.pack`): a SPLIT of the parallel loop puts its
inner part inside the row tiles, PACK then copies a panel several register tiles wide, results match numpy, and the
action refuses what it cannot do."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import ScratchRenderer, data, matmul_ast

from xgrad import Tensor
from xgrad.uop.ops import AxisType, Ops, UOp
from xgrad_codegen.opt import Opt, OptError, apply_opt, candidate_opts, heuristic_opts, range_of
from xgrad_codegen.pack import MAX_SCRATCH_BYTES, index_step, is_scratch
from xgrad_codegen.pipeline import full_rewrite


def test_matmul_heuristic_splits_the_parallel_loop_before_packing_when_blocks_are_plenty() -> None:
    opts = heuristic_opts(matmul_ast(8, 24, 512), 8, scratch=True)
    assert [o.op for o in opts] == ["UPCAST", "UPCAST", "GLOBAL", "SPLIT", "PACK"]
    assert opts[3].amount == 4  # 32 column blocks of 16: 8 parallel blocks of 4, a panel 64 columns wide


def test_matmul_heuristic_does_not_split_few_blocks() -> None:
    opts = heuristic_opts(matmul_ast(64, 64, 64), 8, scratch=True)
    assert "SPLIT" not in [o.op for o in opts]


def test_split_panel_kernel_reads_a_wide_panel_inside_the_row_tiles() -> None:
    uops = full_rewrite(matmul_ast(8, 24, 512), ScratchRenderer())
    (scratch,) = [u for u in uops if is_scratch(u)]
    assert int(scratch.src[0].arg) == 24 * 64
    ranges = [(u.arg[1], int(u.src[0].arg)) for u in uops if u.op is Ops.RANGE]
    # parallel blocks, the fill loops (24 rows of the right operand, the 4 tiles of each row: the fill nests by the
    # stride it reads with, largest outermost), the row tiles, the 4 tiles, the reduction
    assert ranges == [(AxisType.GLOBAL, 8), (AxisType.LOOP, 24), (AxisType.LOOP, 4)] + [
        (AxisType.LOOP, 2),
        (AxisType.LOOP, 4),
        (AxisType.REDUCE, 24),
    ]


def test_the_panel_fill_reads_each_row_of_the_right_operand_in_one_contiguous_run() -> None:
    ast = matmul_ast(8, 24, 512)
    for opt in heuristic_opts(ast, 8, scratch=True):
        ast = apply_opt(ast, opt)
    fill = ast.src[0]  # PACK puts the STORE that fills the panel first
    assert is_scratch(fill.src[0].src[0])
    (read,) = [u for u in fill.src[1].toposort if u.op is Ops.LOAD]
    loops = sorted(
        (u for u in fill.toposort if u.op is Ops.RANGE and u.arg[1] is AxisType.LOOP), key=lambda r: r.arg[0]
    )
    # outer to inner (the order loops open in): the next row of B, then the next 16-float tile of that row
    steps = [index_step(read.src[0].src[1], r) for r in loops]
    assert [st for st in steps if st] == [512, 16]


@pytest.mark.parametrize("m,k,n", [(8, 24, 512), (5, 17, 256), (3, 40, 1024)])
def test_split_matmul_matches_numpy_on_cpu(m: int, k: int, n: int) -> None:
    a, b = data(m, k), data(k, n, seed=1)
    out = (Tensor(a, device="CPU") @ Tensor(b, device="CPU")).numpy()
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)


def test_split_batched_matmul_matches_numpy_on_cpu() -> None:
    a, b = data(2, 8, 16), data(2, 16, 512, seed=1)
    out = (Tensor(a, device="CPU") @ Tensor(b, device="CPU")).numpy()
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)


def _tiled() -> UOp:
    ast = matmul_ast(8, 24, 512)
    for opt in (Opt("UPCAST", 1, 16), Opt("UPCAST", 0, 4), Opt("GLOBAL", 1)):
        ast = apply_opt(ast, opt)
    return ast


def test_split_is_a_candidate_only_on_the_parallel_loop() -> None:
    ast = _tiled()
    splits = [o for o in candidate_opts(ast, ScratchRenderer()) if o.op == "SPLIT"]
    assert splits and all(range_of(ast, o.axis).arg[1] is AxisType.GLOBAL for o in splits)


@pytest.mark.parametrize(
    "opts,message",
    [
        ([Opt("SPLIT", 1, 3)], "that divides 32, not 3"),
        ([Opt("SPLIT", 1, 32)], "whole range"),
        ([Opt("PACK", 1), Opt("SPLIT", 1, 4)], "after PACK"),
    ],
)
def test_illegal_split_raises_opt_error(opts: list[Opt], message: str) -> None:
    ast = _tiled()
    with pytest.raises(OptError, match=message):
        for opt in opts:
            ast = apply_opt(ast, opt)


def test_no_range_action_follows_pack() -> None:
    """PACK is the last action on a kernel (it renumbers the loops its panel does not read). Only SPLIT checked that:
    BEAM=2 on matmul 1024 on an AVX2 host (8 lanes) proposed this candidate, whose PADTO of a loop PACK had made
    left linearize stuck (an AssertionError under SPEC=1, so the search failed)."""
    ast = matmul_ast(1024, 1024, 1024)
    for opt in (Opt("UPCAST", 1, 16), Opt("PADTO", 0, 6), Opt("UPCAST", 0, 6), Opt("GLOBAL", 1), Opt("SPLIT", 1, 4)):
        ast = apply_opt(ast, opt)
    packed = apply_opt(ast, Opt("PACK", 1))
    loop = next(r for r in packed.toposort if r.op is Ops.RANGE and r.arg[1] is AxisType.LOOP)
    # a second PACK too (BEAM on a 32x48x32 matmul proposed one; its kernel failed to render)
    for opt in (
        Opt("PADTO", loop.arg[0], 6),
        Opt("UPCAST", loop.arg[0], 2),
        Opt("GLOBAL", loop.arg[0]),
        Opt("PACK", 0, 1),
    ):
        with pytest.raises(OptError, match=f"{opt.op} after PACK"):
            apply_opt(packed, opt)
    assert full_rewrite(packed, ScratchRenderer(), [])  # the candidate up to PACK renders


def test_pack_refuses_a_wide_panel_over_the_scratch_limit() -> None:
    k = MAX_SCRATCH_BYTES // (4 * 16 * 4) + 8  # a 4-tile panel over this many reduction steps does not fit
    ast = matmul_ast(8, k, 128)
    for opt in (Opt("UPCAST", 1, 16), Opt("UPCAST", 0, 4), Opt("GLOBAL", 1), Opt("SPLIT", 1, 4)):
        ast = apply_opt(ast, opt)
    with pytest.raises(OptError, match="exceed"):
        apply_opt(ast, Opt("PACK", 1))
