"""The optimizer on convolutions: the heuristic unrolls the 3x3 window completely (no short loops, no gate per window
step) and the result still matches torch, on every device."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from kernel_helpers import data, kernel_asts

from xgrad import Device, Tensor
from xgrad.engine import realize
from xgrad.uop.ops import AxisType, UOp
from xgrad.uop.symbolic import simplify
from xgrad_codegen.fold import fold_indexes
from xgrad_codegen.opt import SMALL_REDUCE, Opt, OptError, apply_opt, heuristic_opts, kernel_ranges
from xgrad_codegen.pipeline import full_rewrite
from xgrad_cpu.compiler import knows_evex512, predefined_macros


def conv_ast(x: np.ndarray, w: np.ndarray) -> UOp:
    """The kernel AST of conv2d(x, w, padding=1), as the pipeline hands it to the optimizer."""
    xt, wt = Tensor(x).realize(), Tensor(w).realize()
    return fold_indexes(simplify(kernel_asts(lambda: xt.conv2d(wt, padding=1))[-1]))


def test_conv_heuristic_unrolls_the_window_and_keeps_the_channel_loop() -> None:
    ast = conv_ast(data(2, 8, 6, 16), data(8, 8, 3, 3, seed=1))
    opts = heuristic_opts(ast, 8, scratch=True)
    assert [o.op for o in opts].count("UNROLL") == 2 and all(o.amount == 0 for o in opts if o.op == "UNROLL")
    for opt in opts:
        ast = apply_opt(ast, opt)
    reduces = [r for r in kernel_ranges(ast) if r.arg[1] is AxisType.REDUCE]
    unrolled = [r for r in kernel_ranges(ast) if r.arg[1] is AxisType.UNROLL]
    assert [int(r.src[0].arg) for r in reduces] == [8] and sorted(int(r.src[0].arg) for r in unrolled) == [3, 3]


def test_matmul_heuristic_keeps_a_long_reduction_a_loop() -> None:
    seen: list[UOp] = []
    orig = realize.run_kernel

    def spy(item: Any, vals: dict[str, int]) -> Any:
        seen.append(item.ast)
        return orig(item, vals)

    a, b = Tensor(data(8, 2 * SMALL_REDUCE)).realize(), Tensor(data(2 * SMALL_REDUCE, 16, seed=1)).realize()
    realize.run_kernel = spy  # type: ignore[assignment]
    try:
        (a @ b).realize()
    finally:
        realize.run_kernel = orig
    assert "UNROLL" not in [o.op for o in heuristic_opts(simplify(seen[-1]), 8, scratch=True)]


def test_conv2d_with_unrolled_window_matches_torch(xgrad_device: str) -> None:
    x, w = data(1, 3, 5, 8), data(4, 3, 3, 3, seed=2)
    got = Tensor(x, device=xgrad_device).conv2d(Tensor(w, device=xgrad_device), padding=1).numpy()
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.fixture
def cpu_width_16(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The CPU device with AVX-512's 16-float vectors, on any host: where the target lacks AVX-512 the C compiler
    splits each vector in two, and the masked loads and stores take their portable loops."""
    compiler = Device["CPU"].compiler
    macros = predefined_macros(tuple(compiler.cmd), compiler.flags)
    if "__AVX512F__ " in macros and "__EVEX512__ " not in macros and knows_evex512(compiler.name):
        # AVX-512's instructions without its 512-bit registers (clang 19's -mno-avx512f on an AVX10 host): clang
        # refuses a 64-byte vector argument there outright, where on an AVX2 target it only warns
        pytest.skip("the compiler's target has AVX-512 instructions but no 512-bit registers (no __EVEX512__)")
    renderer = Device["CPU"].renderer
    monkeypatch.setattr(renderer, "max_vector_width", 16)
    yield renderer


@pytest.mark.parametrize("width", [56, 40])
def test_conv_rows_pad_to_whole_16_lane_vectors_and_match_torch(cpu_width_16: Any, width: int) -> None:
    """With 16-float vectors a conv row that 16 does not divide (56 -> 64, 40 -> 48) is padded to whole vectors:
    the last vector's padded lanes are masked off in its loads and in its stores (the bench's conv kernel on a Zen 5
    host: 37.0 -> 29.7 ms). With 8-float vectors the same row takes 8-lane vectors and no padding."""
    x, w = data(2, 8, 5, width), data(8, 8, 3, 3, seed=3)
    ast = conv_ast(x, w)
    opts = heuristic_opts(ast, 16, scratch=True)
    assert opts[:2] == [Opt("PADTO", 3, 16), Opt("UPCAST", 3, 16)], opts
    assert not any(o.op == "PADTO" for o in heuristic_opts(ast, 8, scratch=True))
    src = cpu_width_16.render("k", full_rewrite(ast, cpu_width_16))
    assert "mload_float16(" in src and "mstore_float16(" in src
    got = Tensor(x).conv2d(Tensor(w), padding=1).numpy()
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_matmul_with_a_padded_16_lane_row_matches_numpy(cpu_width_16: Any) -> None:
    a, b = data(37, 64), data(64, 56, seed=4)  # 56 columns: padded to 64, the last vector's 8 extra lanes masked
    np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_conv_heuristic_makes_the_batch_the_parallel_loop() -> None:
    """Each thread works through whole images (their input stays in L2 across the output-channel blocks), with 16
    output channels per tile where AVX-512's 32 registers hold them; a single image is split by its rows instead.
    The weights stay where they lie when their panel would serve each element fewer than MIN_PANEL_REUSE times (here
    8 images x 6 rows): packing it whole costs every thread the whole panel per call."""
    ast = conv_ast(data(8, 8, 6, 16), data(32, 8, 3, 3, seed=1))  # axes: batch, out channels, rows, columns
    assert heuristic_opts(ast, 16, scratch=True)[:2] == [Opt("UPCAST", 3, 16), Opt("UPCAST", 1, 16)]
    for width in (16, 8):
        assert heuristic_opts(ast, width, scratch=True)[-1] == Opt("GLOBAL", 0)
    one = conv_ast(data(1, 8, 12, 16), data(32, 8, 3, 3, seed=1))  # a batch of 1 has no axis: out channels, rows, ..
    assert heuristic_opts(one, 8, scratch=True)[-1] == Opt("GLOBAL", 1)


def test_whole_pack_fills_the_weights_before_the_parallel_loop_and_matches_torch() -> None:
    """A conv whose weights serve each element 8 images x 16 rows x 2 column blocks times packs them whole (PACK
    amount 1) before the parallel loop: the bench's conv 22.0-24.8 -> 20.1-20.6 ms on a Zen 5 host."""
    x, w = data(8, 8, 16, 32), data(16, 8, 3, 3, seed=5)
    ast = conv_ast(x, w)
    opts = heuristic_opts(ast, 8, scratch=True)
    assert opts[-1] == Opt("PACK", 1, 1)
    batch_parallel = opts[:-1]
    for o in batch_parallel:
        ast = apply_opt(ast, o)
    with pytest.raises(OptError, match="parallel"):  # the input is read by the parallel loop: not whole
        apply_opt(ast, Opt("PACK", 0, 1))
    with pytest.raises(OptError, match="GLOBAL"):  # the weights are not: only whole
        apply_opt(ast, Opt("PACK", 1))
    src = Device["CPU"].renderer.render("k", full_rewrite(conv_ast(x, w), Device["CPU"].renderer, opts))
    assert src.index("pack0[") < src.index("= start;")  # filled once per call, before the parallel loop
    got = Tensor(x).conv2d(Tensor(w), padding=1).numpy()
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.fixture
def cpu_width_8(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The CPU device with AVX2's 8-float vectors, whatever the host has."""
    renderer = Device["CPU"].renderer
    monkeypatch.setattr(renderer, "max_vector_width", 8)
    yield renderer


def test_conv_on_8_lane_vectors_tiles_4_channels_by_2_rows_and_matches_torch(cpu_width_8: Any) -> None:
    """With 16 registers a conv's tile is 4 output channels x 2 image rows of one vector (each input vector feeds 4
    FMAs, each broadcast weight 2) rather than 8 channels x 1 row; with AVX-512's 16-float vectors (32 registers) the
    channels alone still make the tile."""
    x, w = data(2, 8, 6, 24), data(16, 8, 3, 3, seed=6)  # axes: batch, out channels, rows, columns
    ast = conv_ast(x, w)
    opts = heuristic_opts(ast, 8, scratch=True)
    assert opts[:2] == [Opt("UPCAST", 3, 8), Opt("UPCAST", 1, 4)], opts
    assert Opt("UPCAST", 2, 2) in opts  # the rows, after the window's unrolls
    wide = heuristic_opts(ast, 16, scratch=True)
    assert wide[:2] == [Opt("UPCAST", 3, 8), Opt("UPCAST", 1, 8)] and Opt("UPCAST", 2, 2) not in wide, wide
    src = cpu_width_8.render("k", full_rewrite(ast, cpu_width_8))
    assert src.count("float8 acc") == 8
    got = Tensor(x).conv2d(Tensor(w), padding=1).numpy()
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
