"""Optimizer actions (`xgrad_codegen.opt`, `xgrad_codegen.pack`): results match numpy at sizes that are not multiples
of the register tile, the heuristic builds the kernel structure it documents, and illegal actions raise OptError."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import ScratchRenderer, data, kernel_asts, matmul_ast

from xgrad import Tensor
from xgrad.uop.ops import AxisType, Ops
from xgrad_codegen.opt import (
    OPT_ACTIONS,
    Opt,
    OptError,
    OptOps,
    apply_opt,
    candidate_opts,
    heuristic_opts,
    kernel_ranges,
    range_size,
)
from xgrad_codegen.pack import is_scratch, packable_loads
from xgrad_codegen.pipeline import full_rewrite
from xgrad_codegen.renderer import CStyleRenderer
from xgrad_codegen.search import heuristic


class PlainRenderer(CStyleRenderer):
    max_vector_width = 8


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 7, 7), (5, 33, 20), (12, 9, 40), (16, 16, 16), (33, 65, 17)])
def test_matmul_matches_numpy_when_sizes_are_not_tile_multiples(xgrad_device: str, m: int, k: int, n: int) -> None:
    a, b = data(m, k), data(k, n, seed=1)
    out = (Tensor(a, device=xgrad_device) @ Tensor(b, device=xgrad_device)).numpy()
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "m,k,n",
    [(64, 64, 64), (7, 1000, 33), (1000, 7, 48), (36, 100, 1000), (128, 256, 80), (4, 3, 1024), (50, 40, 1000)],
)
def test_matmul_matches_numpy_on_cpu_with_packed_panels(m: int, k: int, n: int) -> None:
    a, b = data(m, k), data(k, n, seed=1)
    out = (Tensor(a, device="CPU") @ Tensor(b, device="CPU")).numpy()
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)


def test_batched_matmul_matches_numpy_on_cpu_with_packed_panels() -> None:
    a, b = data(3, 20, 48), data(3, 48, 32, seed=1)
    out = (Tensor(a, device="CPU") @ Tensor(b, device="CPU")).numpy()
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)


def test_matmul_heuristic_packs_the_right_operand_and_tiles_6x16() -> None:
    opts = heuristic_opts(matmul_ast(64, 64, 64), 8, scratch=True)
    # 64 rows are padded to 66 so that tiles of 6 rows fit
    assert [o.op for o in opts] == ["UPCAST", "PADTO", "UPCAST", "GLOBAL", "PACK"]
    assert [o.amount for o in opts[:3]] == [16, 6, 6]


def test_a_batched_matmul_packs_each_batch_whole_in_parallel_over_the_batch() -> None:
    """16 batches of 256x256 @ 256x256: the batch becomes the parallel loop and each batch's whole right operand one
    packed panel (256 KB), so a row tile of the left operand stays in L1 across all 16 column blocks (4.0 -> 3.1 ms,
    40 alternating runs); 4 batches are too few to share out, and 512x512 panels (1 MB) too big: the column blocks
    stay the parallel loop. The result matches numpy."""
    a, b = data(16, 64, 256), data(16, 256, 256, seed=1)
    (ast,) = kernel_asts(lambda: Tensor(a) @ Tensor(b))
    opts = heuristic(ast, ScratchRenderer())
    assert [o.op for o in opts] == ["UPCAST", "PADTO", "UPCAST", "GLOBAL", "PACK"] and opts[3].axis == 0
    np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)
    for x, w in ((data(4, 64, 256), data(4, 256, 256)), (data(16, 8, 512), data(16, 512, 512))):
        (ast,) = kernel_asts(lambda x=x, w=w: Tensor(x) @ Tensor(w))
        assert Opt("GLOBAL", 0) not in heuristic(ast, ScratchRenderer())


def test_matmul_heuristic_tiles_short_row_ranges_4x16() -> None:
    opts = heuristic_opts(matmul_ast(32, 64, 64), 8, scratch=True)
    assert [o.op for o in opts] == ["UPCAST", "UPCAST", "GLOBAL", "PACK"]
    assert [o.amount for o in opts[:2]] == [16, 4]


@pytest.mark.parametrize("m", [2, 3, 4])
def test_a_few_rows_times_a_matrix_tile_all_rows(m: int) -> None:
    """2-4 rows (batched decode of a few streams): the rows are upcast whole as the register tile, so each loaded
    vector of the matrix serves every row (without a tile each row streamed the whole matrix again)."""
    opts = heuristic_opts(matmul_ast(m, 64, 256), 16, scratch=True)
    assert [(o.op, o.amount) for o in opts[:2]] == [("UPCAST", 32), ("UPCAST", m)]
    a, b = data(m, 64), data(64, 256, seed=1)
    np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_reduction_without_a_vector_axis_upcasts_an_outer_linear_loop() -> None:
    """No vector axis (6 output columns): the rows, which every access steps through by a constant stride, are
    upcast by 16 so the lanes share the rest of the index math (a conv's input gradient: the demo's training step
    went from 6.3 to 3.0 ms in bench/bench_train.py), and the reduction is not unrolled on top. The 6 columns, which
    the left operand's loads do not read, are upcast whole on top (a 16 x 6 scalar tile: 320 x 10 @ 10 x 6 went from
    31 to 4 us)."""
    assert heuristic_opts(matmul_ast(32, 10, 6), 8, scratch=True) == [Opt("UPCAST", 0, 16), Opt("UPCAST", 1, 6)]
    assert heuristic_opts(matmul_ast(12, 10, 6), 8, scratch=True)[0] == Opt("UPCAST", 0, 4)  # leaves 2 iterations
    for m in (32, 12, 7):
        a, b = data(m, 10), data(10, 6, seed=1)
        np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_a_conv_weight_gradient_upcasts_a_second_loop_that_a_load_does_not_read() -> None:
    """The demo's second conv's weight gradient (16 x 8 x 3 x 3 over a batch of 64 and 4 x 4 positions) has no vector
    axis: its output channels are upcast by 8 and then its input channels by 8, a scalar outer product where each
    output-gradient value feeds 8 FMAs and each input value 8 more (225 -> 54 us on scratch buffers)."""
    torch = pytest.importorskip("torch")
    x, w = data(64, 8, 6, 6), data(16, 8, 3, 3, seed=1)
    wt = Tensor(w).is_param_()
    asts = kernel_asts(lambda: _conv_weight_grad(Tensor(x), wt))
    grad_ast = next(a for a in asts if a.arg is not None and "16_8_3_3" in a.arg.name)
    opts = heuristic_opts(grad_ast, 8, scratch=True)
    assert [(o.op, o.amount) for o in opts] == [("UPCAST", 8), ("UPCAST", 8)]
    tw = torch.tensor(w, requires_grad=True)
    torch.nn.functional.conv2d(torch.tensor(x), tw).square().sum().backward()
    assert wt.grad is not None
    np.testing.assert_allclose(wt.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_a_one_channel_conv_weight_gradient_upcasts_its_window_too() -> None:
    """The demo's first conv (1 -> 8 channels, 3 x 3 over 8 x 8 images): 4 output channels, then the window's rows
    and columns (3 each), which the output gradient does not depend on: 36 accumulators, and the fused relu gradient
    is computed once per position instead of 9 times (90 -> 23 us)."""
    torch = pytest.importorskip("torch")
    x, w = data(64, 1, 8, 8), data(8, 1, 3, 3, seed=1)
    wt = Tensor(w).is_param_()
    asts = kernel_asts(lambda: _conv_weight_grad(Tensor(x), wt))
    grad_ast = next(a for a in asts if a.arg is not None and a.arg.name.startswith("r_8_3_3"))
    opts = heuristic_opts(grad_ast, 8, scratch=True)
    assert [(o.op, o.amount) for o in opts] == [("UPCAST", 4), ("UPCAST", 3), ("UPCAST", 3)]
    tw = torch.tensor(w, requires_grad=True)
    torch.nn.functional.conv2d(torch.tensor(x), tw).square().sum().backward()
    assert wt.grad is not None
    np.testing.assert_allclose(wt.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)


def _conv_weight_grad(x: Tensor, w: Tensor) -> Tensor:
    x.conv2d(w).square().sum().backward()
    assert w.grad is not None
    return w.grad


def test_a_short_odd_row_axis_still_gets_a_padded_register_tile() -> None:
    """10 rows (a linear layer's weight gradient, 10 x 256 over a batch of 64): padded to 12 with clamped loads and
    tiled 4 x 16, instead of one accumulator vector (one FMA chain, latency-bound: 220 -> 126 us here)."""
    opts = heuristic_opts(matmul_ast(10, 64, 256), 8, scratch=True)
    assert [(o.op, o.amount) for o in opts[:3]] == [("UPCAST", 16), ("PADTO", 4), ("UPCAST", 4)]
    a, b = data(10, 64), data(64, 256, seed=1)
    np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_padded_rows_clamp_their_loads_and_gate_only_their_stores() -> None:
    """A 6-row tile over 64 rows: the inner loop's loads carry no gate (the extra rows read row 63), the stores of
    the extra rows are gated, and the result matches numpy."""
    uops = full_rewrite(matmul_ast(64, 32, 64), ScratchRenderer())
    accs = [u for u in uops if u.op is Ops.DEFINE_ACC]
    assert len(accs) == 12 and all(u.dtype.count == 8 for u in accs)
    loads = [u for u in uops if u.op is Ops.LOAD]
    assert loads and all(len(u.src[0].src) == 2 for u in loads)
    gated = [u for u in uops if u.op is Ops.STORE and not is_scratch(u.src[0].src[0]) and len(u.src[0].src) == 3]
    assert len(gated) == 4  # rows 4 and 5 of a tile may be past row 63 (66 = 64 + 2), 2 vectors each
    a, b = data(64, 32), data(32, 64, seed=1)
    np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_matmul_heuristic_without_scratch_does_not_pack() -> None:
    opts = heuristic_opts(matmul_ast(64, 64, 64), 8)
    assert "PACK" not in [o.op for o in opts] and "UNROLL" not in [o.op for o in opts]


def test_matmul_kernel_has_12_vector_accumulators_and_a_packed_panel() -> None:
    uops = full_rewrite(matmul_ast(66, 64, 64), ScratchRenderer())
    accs = [u for u in uops if u.op is Ops.DEFINE_ACC]
    assert len(accs) == 12 and all(u.dtype.count == 8 for u in accs)
    scratch = [u for u in uops if is_scratch(u)]
    assert len(scratch) == 1 and int(scratch[0].src[0].arg) == 64 * 16
    ranges = [u for u in uops if u.op is Ops.RANGE]
    # the column blocks run outermost and in parallel; the packing loop runs before the row tiles
    assert ranges[0].arg[1] is AxisType.GLOBAL and int(ranges[0].src[0].arg) == 64 // 16
    fill, rows = ranges[1], ranges[2]
    first_fill_store = next(i for i, u in enumerate(uops) if u.op is Ops.STORE and is_scratch(u.src[0].src[0]))
    assert uops.index(fill) < first_fill_store < uops.index(rows)
    assert not any(u.op is Ops.RANGE and u.arg[1] is AxisType.UNROLL for u in uops)


def test_scratch_reads_come_after_the_loop_that_fills_them() -> None:
    uops = full_rewrite(matmul_ast(32, 24, 32), ScratchRenderer())
    fill_end = max(i for i, u in enumerate(uops) if u.op is Ops.STORE and is_scratch(u.src[0].src[0]))
    reads = [i for i, u in enumerate(uops) if u.op is Ops.LOAD and is_scratch(u.src[0].src[0])]
    assert reads and min(reads) > fill_end


def test_every_candidate_applies_to_a_matmul() -> None:
    ast = matmul_ast(16, 24, 32)
    cands = candidate_opts(ast, ScratchRenderer())
    assert {o.op for o in cands} >= {"UPCAST", "UNROLL", "GLOBAL"}
    for opt in cands:
        assert opt.op in OPT_ACTIONS
        apply_opt(ast, opt)


def test_pack_is_a_candidate_only_for_renderers_with_scratch() -> None:
    ast = matmul_ast(16, 24, 32)
    n = len(kernel_ranges(ast))
    opts = [Opt("UPCAST", 1, 8), Opt("UPCAST", 0, 4)]
    for opt in opts:
        ast = apply_opt(ast, opt)
    ast = apply_opt(ast, Opt("GLOBAL", 1))
    assert any(o.op == "PACK" for o in candidate_opts(ast, ScratchRenderer()))
    assert not any(o.op == "PACK" for o in candidate_opts(ast, PlainRenderer()))
    assert n == 3


@pytest.mark.parametrize(
    "opt,message",
    [
        (Opt("UPCAST", 2, 4), "applies to a LOOP range"),  # axis 2 is the reduction
        (Opt("UNROLL", 0, 4), "applies to a REDUCE range"),
        (Opt("UPCAST", 0, 5), "cannot split"),
        (Opt("UPCAST", 7, 4), "no range has id 7: the kernel's range ids are \\[0, 1, 2\\]"),
        (Opt("PACK", 9), "out of range"),
        (Opt("PACK", 0), "GLOBAL"),  # no parallel loop chosen yet
    ],
)
def test_illegal_action_raises_opt_error(opt: Opt, message: str) -> None:
    with pytest.raises(OptError, match=message):
        apply_opt(matmul_ast(16, 24, 32), opt)


def test_an_opt_names_its_range_by_id_not_by_position() -> None:
    """UPCAST splits the columns (id 1): their lanes get a fresh id (3) and sort before the reduction, which keeps its
    id (2) though kernel_ranges now lists it fourth. UNROLL 2 unrolls the reduction; axis 3 is the lanes."""
    ast = apply_opt(matmul_ast(16, 24, 32), Opt("UPCAST", 1, 8))
    kinds = [AxisType.LOOP, AxisType.LOOP, AxisType.UPCAST, AxisType.REDUCE]
    assert [r.arg for r in kernel_ranges(ast)] == list(zip([0, 1, 3, 2], kinds))
    unrolled = apply_opt(ast, Opt("UNROLL", 2, 4))
    reductions = {r.arg: range_size(r) for r in kernel_ranges(unrolled) if r.arg[1] is not AxisType.LOOP}
    assert reductions == {(3, AxisType.UPCAST): 8, (2, AxisType.REDUCE): 6, (4, AxisType.UNROLL): 4}
    with pytest.raises(OptError, match="UNROLL applies to a REDUCE range, not to a UPCAST range"):
        apply_opt(ast, Opt("UNROLL", 3, 4))
    assert str(Opt("UNROLL", 2, 4)) == "UNROLL(2,4)"  # how DEBUG and BEAM print it


def test_an_unknown_action_is_refused_when_made() -> None:
    with pytest.raises(OptError, match="unknown optimizer action 'SPLAT'"):
        Opt("SPLAT", 0, 4)
    assert Opt("UPCAST", 0, 4) == Opt(OptOps.UPCAST, 0, 4) and Opt("TC", 0).op is OptOps.TC


def test_pack_needs_the_parallel_loop_among_the_loops_the_load_reads_in() -> None:
    ast = apply_opt(matmul_ast(16, 24, 32), Opt("GLOBAL", 0))  # the rows are the parallel loop
    errors, packed = [], []
    for i in range(len(packable_loads(ast))):
        try:
            packed.append(apply_opt(ast, Opt("PACK", i)))
        except OptError as e:
            errors.append(str(e))
    # the left operand's rows are reused by every column: packable; the right operand does not read the rows
    assert len(packed) == 1 and len(errors) == 1 and "GLOBAL" in errors[0]


def test_unrolled_terms_go_into_the_accumulator_one_by_one() -> None:
    """An UNROLL's lanes are added to the register in turn, acc = acc + t0; acc = acc + t1; ..., so each term's
    operands die once it is added (a conv's 9 window taps need not all be live at once: its kernel ran 5-13% faster)."""
    uops = full_rewrite(matmul_ast(4, 16, 4), CStyleRenderer(), [Opt("UNROLL", 2, 4)])
    steps = [u for u in uops if u.op is Ops.ASSIGN_ACC]
    assert len(steps) == 4
    acc = steps[0].src[0]
    for before, step in zip([acc, *steps], steps):
        assert step.src[0] is acc and step.src[1].op is Ops.ADD and step.src[1].src[0] is before


def test_several_accumulators_take_their_unrolled_terms_in_turn() -> None:
    """With 4 accumulators of 4 terms each, the program adds term k to every accumulator before term k + 1 to any:
    an operand the accumulators share for one step (a conv's input vector for one window tap) is then live for that
    step only, and neighbouring additions do not wait for each other (conv 32x64x56x56: 9.0 -> 8.0 ms at batch 4)."""
    uops = full_rewrite(matmul_ast(4, 16, 4), CStyleRenderer(), [Opt("UPCAST", 0, 4), Opt("UNROLL", 2, 4)])
    targets = [u.src[0] for u in uops if u.op is Ops.ASSIGN_ACC]
    accs = list(dict.fromkeys(targets))
    assert len(accs) == 4 and targets == accs * 4
    a, b = data(4, 16), data(16, 4, seed=1)
    np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-5, atol=1e-5)


def test_a_row_the_vector_does_not_divide_takes_half_vectors_or_pads() -> None:
    """With 16-float vectors (AVX-512) a tiled output row that 16 does not divide is padded to whole vectors when that
    adds at most a quarter (56 -> 64), else tiled by 8-float vectors, as with 8-float ones (24), never by 4 (the
    bench's conv got 4-lane tiles for a while: 89 ms against 37 with 8 lanes on a Zen 5 host)."""
    narrow = matmul_ast(64, 64, 24)  # 16 rows of one 8-float vector (AVX-512 has 32 registers), 8 rows with AVX2
    assert heuristic_opts(narrow, 16, scratch=True)[:2] == [Opt("UPCAST", 1, 8), Opt("UPCAST", 0, 16)]
    assert heuristic_opts(narrow, 8, scratch=True)[:2] == [Opt("UPCAST", 1, 8), Opt("UPCAST", 0, 8)]
    assert heuristic_opts(matmul_ast(64, 64, 56), 16, scratch=True)[:2] == [Opt("PADTO", 1, 16), Opt("UPCAST", 1, 16)]
    assert heuristic_opts(matmul_ast(64, 64, 56), 8, scratch=True)[0] == Opt("UPCAST", 1, 8)
    assert heuristic_opts(matmul_ast(64, 64, 64), 16, scratch=True)[0] == Opt("UPCAST", 1, 32)


def test_a_matvec_of_nested_reductions_keeps_independent_chains() -> None:
    """A matrix-vector product summed group by group (a quantised matrix: 20 groups of 32, each group's sum scaled
    once) is as long a chain of FMAs as one reduction of 640, though its inner reduction is 32 long: 4 vectors of
    outputs side by side, as for a plain matvec, not one latency-bound chain of vector FMAs."""
    x, w, s = Tensor(data(1, 640)).realize(), Tensor(data(640, 256, seed=1)).realize(), Tensor(data(20, 256)).realize()

    def nested() -> Tensor:
        return ((x.reshape(1, 20, 32, 1) * w.reshape(1, 20, 32, 256)).sum(2) * s.reshape(1, 20, 256)).sum(1)

    (ast,) = kernel_asts(nested)
    assert [(o.op, o.amount) for o in heuristic_opts(ast, 16)] == [("UPCAST", 16), ("UPCAST", 4), ("UNROLL", 4)]
    groups = data(1, 640).reshape(20, 32, 1) * data(640, 256, seed=1).reshape(20, 32, 256)
    expected = (groups.sum(1) * data(20, 256)).sum(0)
    np.testing.assert_allclose(nested().numpy().reshape(-1), expected, rtol=1e-4, atol=1e-4)


def test_row_sums_read_across_rows_keep_one_vector_chain() -> None:
    """A softmax's sum of exp over each row of 1024 x 1024: the output vector's 8 lanes are 8 rows, each lane read
    from its own row (a gather), so the matvec's 4 vectors side by side (32 rows' streams at once) do not apply: that
    ran the kernel 2x slower than 8 rows (bench_cpu's softmax 2.1 -> 4.5 ms on a Zen 3 host). The loads' lanes are
    one row apart here, 1024 floats; in the matvec above they are contiguous."""
    xv = data(1024, 1024)
    x = Tensor(xv).realize()

    def row_sums() -> Tensor:
        return x.exp().sum(-1)

    (ast,) = kernel_asts(row_sums)
    assert [(o.op, o.amount) for o in heuristic_opts(ast, 8)] == [("UPCAST", 8), ("UNROLL", 4)]
    np.testing.assert_allclose(row_sums().numpy(), np.exp(xv.astype(np.float64)).sum(-1), rtol=1e-4)


def test_dot_products_sharing_an_operand_run_as_independent_chains() -> None:
    """Attention's scores at decode: 4 query heads x 13 cached keys (a symbolic count there), each a dot product over
    256 values, no loop long enough for a vector. The heads' lanes share each key load and are 4 independent FMA
    chains (one chain per score before: latency-bound; Gemma 3 270M's 4-row round spent 5.4 ms of 45 in them on one
    thread, 3.4 ms with the lanes)."""
    qv, kv = data(4, 256), data(13, 256, seed=1)
    q, k = Tensor(qv).realize(), Tensor(kv).realize()

    def scores() -> Tensor:
        return (q.reshape(4, 1, 256) * k.reshape(1, 13, 256)).sum(-1)

    (ast,) = kernel_asts(scores)
    assert [(o.op, o.amount) for o in heuristic_opts(ast, 16)] == [("UPCAST", 4)]
    np.testing.assert_allclose(scores().numpy(), qv @ kv.T, rtol=1e-4, atol=1e-4)
