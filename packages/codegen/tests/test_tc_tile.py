"""Tensor cores tiled through shared memory (xgrad_codegen.tc_tile): blocks of warps, each warp several fragments,
the operands' k-slices staged in shared memory; run with GPU semantics on the PYTHON executor against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import data, kernel_asts

from xgrad import Tensor
from xgrad.dtype import dtypes
from xgrad.uop.ops import Ops
from xgrad_codegen import tc_tile
from xgrad_codegen.gpu_opt import apply_opts, gpu_candidates
from xgrad_codegen.opt import Opt, OptError, apply_opt, kernel_ranges
from xgrad_codegen.pipeline import before_optimize, full_rewrite
from xgrad_codegen.pydevice import PythonRenderer
from xgrad_codegen.pyexec import ProgramError
from xgrad_codegen.pygpu import eval_launch, run_gpu_program
from xgrad_codegen.renderer import AsyncWait, MatrixLoad
from xgrad_codegen.tc import match_matmul
from xgrad_codegen.tc_tile import TILE_SHAPES, TileShape

ARCHS = ["sm_90", "gfx1100", "gfx942"]


def operands(m: int, k: int, n: int, dtype=dtypes.float16) -> tuple[np.ndarray, np.ndarray]:
    """A (m x k) and B (k x n) as float32 arrays holding values exactly representable in `dtype`."""
    rng = np.random.default_rng(m * 10007 + k * 101 + n)
    a = Tensor(rng.standard_normal((m, k)).astype(np.float32)).cast(dtype).float().numpy()
    b = Tensor(rng.standard_normal((k, n)).astype(np.float32)).cast(dtype).float().numpy()
    return a, b


def run_matmul(renderer: PythonRenderer, a: np.ndarray, b: np.ndarray, opts: list[Opt]) -> tuple[np.ndarray, list]:
    """a @ b (float16 operands, float32 sums) lowered with `opts` for `renderer` and run with GPU semantics; the
    operands are bound to the PARAMs the matmul's A and B loads read."""
    x, y = Tensor(a).half().realize(), Tensor(b).half().realize()
    (ast,) = kernel_asts(lambda: x.matmul(y, dtype=dtypes.float32))
    _, load_a, load_b, *_ = match_matmul(before_optimize(ast), renderer.tensor_cores[0])
    uops = full_rewrite(ast, renderer, opts)
    out = np.zeros((a.shape[0], b.shape[1]), np.float32)
    bufs: list = [None, None, None]
    bufs[0] = memoryview(out).cast("B")
    bufs[load_a.src[0].src[0].arg] = memoryview(np.ascontiguousarray(a.astype(np.float16))).cast("B")
    bufs[load_b.src[0].src[0].arg] = memoryview(np.ascontiguousarray(b.astype(np.float16))).cast("B")
    run_gpu_program(uops, bufs)
    return out, uops


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    "m,k,n,code",
    [
        (64, 64, 64, 22222),  # multiples of the block (64 x 32 x 32 on sm_90): 4 warps, 2 x 2 fragments, 2 slices
        (64, 96, 64, 222222),  # the same double-buffered: 3 slices, slice 0 staged before the loop
        (40, 56, 24, 22121),  # no multiples: m, n and k padded (the loads past the end read 0, stores skipped)
        (70, 33, 50, 222222),  # odd k: the last k-slice padded by 31 (double-buffered)
    ],
)
def test_tiled_matmul_matches_numpy(arch, m, k, n, code):
    renderer = PythonRenderer(arch)
    a, b = operands(m, k, n)
    got, uops = run_matmul(renderer, a, b, [Opt("TC", 0, code)])
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-4)
    shape, tc = TileShape.from_code(code), renderer.tensor_cores[0]
    assert eval_launch(uops, {})[1][0] == shape.threads(tc)  # warps_m x warps_n warps per block
    assert sum(u.op is Ops.WMMA for u in uops) == shape.frags_m * shape.frags_n * shape.frags_k
    # one buffer: a barrier before the copies are stored and one after; double-buffered: one per slice
    assert sum(u.op is Ops.BARRIER for u in uops) == (1 if shape.stages == 2 else 2)
    shared = sum(u.arg[1] * u.dtype.itemsize for u in uops if u.op is Ops.DEFINE_LOCAL)
    assert shared == shape.shared_bytes(tc) and sum(u.op is Ops.DEFINE_LOCAL for u in uops) == 2


@pytest.mark.parametrize("arch", ARCHS)
def test_heuristic_tiles_a_large_half_matmul(arch):
    """A 1024^3 float16 matmul (compiled, not run) gets a 128 x 128 tile (the largest that leaves tc_tile.MIN_BLOCKS
    blocks) with double-buffered k-slices of 32: on sm_90 8 warps of 4 x 4 m16n8 fragments, on RDNA3/CDNA3 4 warps
    of 4 x 4 16x16 ones; each warp's k-slice is frags_m x frags_n x frags_k WMMAs and each thread copies (BM + BN) x
    32 / threads elements from global memory."""
    renderer = PythonRenderer(arch)
    x, y = Tensor.empty(1024, 1024, dtype=dtypes.half), Tensor.empty(1024, 1024, dtype=dtypes.half)
    (ast,) = kernel_asts(lambda: x.matmul(y, dtype=dtypes.float32))
    uops = full_rewrite(ast, renderer)
    ((opt,),) = [u.arg.opts for u in uops if u.op is Ops.SINK]
    tc = renderer.tensor_cores[0]
    shape = TileShape.from_code(opt.amount)
    assert opt.op == "TC" and shape.threads(tc) <= renderer.max_threads
    bm, bn, bk = shape.block(tc)
    assert (bm, bn, bk) == (128, 128, 32) and shape.frags_m * shape.frags_n == 16
    wmmas = sum(u.op is Ops.WMMA for u in uops)
    # what each thread reads from global memory: loads, or (sm_90: cp.async) the sources of asynchronous copies
    global_loads = [u.src[0] for u in uops if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.PARAM]
    copies = [u.src[1] for u in uops if u.op is Ops.STORE and u.src[1].op is Ops.INDEX]
    assert not (copies and global_loads) and bool(copies) == bool(renderer.async_copy_bytes)
    global_loads += copies
    assert wmmas == shape.frags_m * shape.frags_n * shape.frags_k
    # double-buffered: each thread copies its share of slice 0 before the loop and of the next slice in it
    assert shape.stages == 2
    assert sum(u.dtype.count for u in global_loads) == 2 * (bm + bn) * bk // shape.threads(tc)
    assert all(u.dtype.count == 8 for u in global_loads)  # 16-byte vectors (the renderer's aligned_vector_bytes)
    # in the loop per thread 1/8 (sm_90: 8 warps) or 1/4 (4 warps of 16x16x16) loads per WMMA; tc.py: 12 (sm_90)
    assert 4 * (len(global_loads) // 2) <= wmmas


def test_heuristic_tiles_a_padded_batched_matmul_with_bias():
    """A batched matmul of a transposed operand plus a bias, 2 x 60 x 48 x 40 (m no multiple of 16), through the
    device on PYTHON::sm_90: the heuristic tiles it (padding within tc_tile.MAX_WASTE); the epilogue's bias loads
    are gated like the stores."""
    dev = "PYTHON::sm_90"
    rng = np.random.default_rng(3)
    at = rng.standard_normal((2, 48, 60)).astype(np.float16)  # A transposed: its m axis is the contiguous one
    b = rng.standard_normal((2, 48, 40)).astype(np.float16)
    bias = rng.standard_normal((40,)).astype(np.float32)
    x, y = Tensor(at, device=dev), Tensor(b, device=dev)
    got = (x.transpose(1, 2).matmul(y, dtype=dtypes.float32) + Tensor(bias, device=dev)).numpy()
    want = np.matmul(at.astype(np.float32).transpose(0, 2, 1), b.astype(np.float32)) + bias
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    tx, ty = Tensor(at).realize(), Tensor(b).realize()
    (ast,) = kernel_asts(lambda: tx.transpose(1, 2).matmul(ty, dtype=dtypes.float32) + Tensor(bias).realize())
    uops = full_rewrite(ast, PythonRenderer("sm_90"))
    ((opt,),) = [u.arg.opts for u in uops if u.op is Ops.SINK]
    assert opt.op == "TC" and opt.amount != 0 and any(u.op is Ops.DEFINE_LOCAL for u in uops)


@pytest.mark.parametrize(
    "m,k,n,vector_bytes,widths",
    [
        (64, 64, 64, 16, {8}),  # rows of 64 halves: every copy one aligned 16-byte vector
        (70, 33, 50, 16, {1, 2}),  # A's rows of 33 halves: no alignment, scalars; B's of 50: pairs
        (64, 64, 64, 0, {1}),  # a renderer without aligned vector loads: scalars
    ],
)
def test_staged_copies_are_vectors_only_where_aligned(m, k, n, vector_bytes, widths):
    renderer = PythonRenderer("sm_90")
    renderer.aligned_vector_bytes = vector_bytes
    a, b = operands(m, k, n)
    got, uops = run_matmul(renderer, a, b, [Opt("TC", 0, 22222)])
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-4)
    loads = [u for u in uops if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.PARAM]
    stores = [u for u in uops if u.op is Ops.STORE and u.src[0].src[0].op is Ops.DEFINE_LOCAL]
    assert {u.dtype.count for u in loads} == widths and {u.src[1].dtype.count for u in stores} == widths


def test_small_matmul_takes_a_small_tile():
    """The heuristic keeps enough blocks (tc_tile.MIN_BLOCKS) before growing the tile: a 256^3 matmul gets 32 x 32
    blocks (64 of them), not 128 x 128 (4)."""
    renderer = PythonRenderer("sm_90")
    x, y = Tensor.empty(256, 256, dtype=dtypes.half), Tensor.empty(256, 256, dtype=dtypes.half)
    (ast,) = kernel_asts(lambda: x.matmul(y, dtype=dtypes.float32))
    uops = full_rewrite(ast, renderer)
    ((opt,),) = [u.arg.opts for u in uops if u.op is Ops.SINK]
    assert TileShape.from_code(opt.amount).block(renderer.tensor_cores[0])[:2] == (32, 32)


def test_tile_codes_round_trip_and_bad_ones_are_refused():
    for shape in TILE_SHAPES:
        assert TileShape.from_code(shape.code) == shape
    assert TileShape.from_code(244422).stages == 2 and TileShape.from_code(24442).stages == 1
    for bad in (1234, 244425, 1234567, 20442, -1):
        with pytest.raises(OptError, match="five digits"):
            TileShape.from_code(bad)


def test_tiled_kernel_takes_no_further_actions():
    """After a tiled TC every thread and lane shares the staged tiles: UPCAST/UNROLL/LOCAL (which would duplicate
    the copies into one shared array) and a second TC are refused, so BEAM skips them."""
    renderer = PythonRenderer("sm_90")
    x, y = Tensor(data(64, 64)).half().realize(), Tensor(data(64, 64, seed=1)).half().realize()
    (ast,) = kernel_asts(lambda: x.matmul(y, dtype=dtypes.float32))
    tiled = apply_opts(before_optimize(ast), [Opt("TC", 0, 22222)], renderer)
    for r in kernel_ranges(tiled):
        for op in ("UPCAST", "UNROLL", "LOCAL", "GROUP"):
            with pytest.raises(OptError, match="after a tiled TC"):
                apply_opt(tiled, Opt(op, r.arg[0], 2))
    with pytest.raises(OptError, match="once"):
        apply_opts(tiled, [Opt("TC", 0, 11111)], renderer)
    assert not [o for o in gpu_candidates(tiled, renderer) if o.op == "TC"]


def test_limits_refuse_a_tile():
    """A tile needing more threads or shared memory than the renderer has raises OptError naming the limit."""
    renderer = PythonRenderer("sm_90")
    x, y = Tensor(data(128, 64)).half().realize(), Tensor(data(64, 128, seed=1)).half().realize()
    base = before_optimize(kernel_asts(lambda: x.matmul(y, dtype=dtypes.float32))[0])
    renderer.max_threads = 128
    with pytest.raises(OptError, match="threads"):
        apply_opts(base, [Opt("TC", 0, 24442)], renderer)
    renderer.shared_max = 4096
    with pytest.raises(OptError, match="shared memory"):
        apply_opts(base, [Opt("TC", 0, 22222)], renderer)
    # within 4 KB: the smallest tiles, one warp's also with 2 and 3 stages (3.75 KB), not 4 (5 KB)
    assert {o.amount for o in gpu_candidates(base, renderer) if o.op == "TC"} <= {22121, 11111, 111112, 111113}


def test_beam_candidates_offer_tile_shapes_for_half_matmuls_only():
    renderer = PythonRenderer("sm_90")
    x, y = Tensor(data(128, 64)).half().realize(), Tensor(data(64, 128, seed=1)).half().realize()
    base = before_optimize(kernel_asts(lambda: x.matmul(y, dtype=dtypes.float32))[0])
    codes = {o.amount for o in gpu_candidates(base, renderer) if o.op == "TC"}
    tc, limits = renderer.tensor_cores[0], (renderer.max_threads, renderer.shared_max, renderer.async_copy_bytes)
    assert codes == {s.code for s in TILE_SHAPES if s.fits(tc, *limits)} and {244422, 224423, 222224} <= codes
    assert 244423 not in codes  # 3 stages of the 8-warp tile: 57 KB, more than 48
    f32 = before_optimize(kernel_asts(lambda: Tensor(data(128, 64)).realize() @ Tensor(data(64, 128)).realize())[0])
    assert not [o for o in gpu_candidates(f32, renderer) if o.op == "TC"]


def test_untiled_tensor_core_still_applies_with_amount_zero(monkeypatch):
    """TC with amount 0 is tc.py's one WMMA per warp, straight from global memory (what BEAM compares against)."""
    monkeypatch.setattr(tc_tile, "MIN_BLOCKS", 1)  # irrelevant to explicit opts: the heuristic is not asked
    renderer = PythonRenderer("sm_90")
    a, b = operands(32, 48, 16)
    got, uops = run_matmul(renderer, a, b, [Opt("TC", 0)])
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-4)
    assert not any(u.op is Ops.DEFINE_LOCAL for u in uops) and sum(u.op is Ops.WMMA for u in uops) == 1


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize(
    "m,k,n",
    [
        (64, 64, 64),  # 2 slices of 32: fewer than 3 or 4 stages (the prologue's extra slices are empty)
        (40, 56, 24),  # m, n and k padded: the copies past the end zero-fill (src-size 0)
        (64, 160, 32),  # 5 slices: the copies of slices ko+1..ko+stages-1 in flight while slice ko's WMMAs run
    ],
)
def test_pipelined_tiles_copy_asynchronously(m, k, n, stages):
    """On a renderer with asynchronous copies (PYTHON::sm_90 as NVIDIA's cp.async) a 2..4-stage tile copies its
    slices without registers: no global loads of A or B, one STORE of an INDEX per chunk; the prologue commits
    slices 0..stages-3 with barriers that wait for nothing, and the loop's one barrier waits until at most stages-2
    groups are in flight. The executor lands a copy only at its wait (NaN before), so the result proves the waits."""
    renderer = PythonRenderer("sm_90")
    a, b = operands(m, k, n)
    code = 22222 * 10 + stages
    got, uops = run_matmul(renderer, a, b, [Opt("TC", 0, code)])
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-4)
    assert not [u for u in uops if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.PARAM]
    copies = [u for u in uops if u.op is Ops.STORE and u.src[1].op is Ops.INDEX]
    assert copies and all(u.src[0].src[0].op is Ops.DEFINE_LOCAL and u.src[1].dtype.count == 8 for u in copies)
    waits = [u.arg.pending for u in uops if u.op is Ops.BARRIER]
    assert waits == [*range(1, stages - 1), stages - 2]
    shared = sum(u.arg[1] * u.dtype.itemsize for u in uops if u.op is Ops.DEFINE_LOCAL)
    assert shared == TileShape.from_code(code).shared_bytes(renderer.tensor_cores[0])


def test_unaligned_operands_keep_register_copies_and_refuse_deep_pipelines():
    """A's rows of 33 halves give no 4-byte chunk: double-buffered slices are copied through registers as before,
    and 3 stages (which need asynchronous copies) raise OptError."""
    renderer = PythonRenderer("sm_90")
    a, b = operands(70, 33, 50)
    got, uops = run_matmul(renderer, a, b, [Opt("TC", 0, 222222)])
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-4)
    assert not [u for u in uops if u.op is Ops.STORE and u.src[1].op is Ops.INDEX]
    with pytest.raises(OptError, match="asynchronous copies"):
        run_matmul(renderer, a, b, [Opt("TC", 0, 222223)])


def test_waiting_for_one_group_too_few_is_caught(monkeypatch):
    """The executor's model of cp.async is strict enough to catch a wrong pipeline: if every barrier waited for one
    group fewer, the slice read would still be in flight (a race with the copying threads)."""
    monkeypatch.setattr(tc_tile, "AsyncWait", lambda pending: AsyncWait(pending + 1))
    a, b = operands(64, 160, 32)
    with pytest.raises(ProgramError, match="race"):
        run_matmul(PythonRenderer("sm_90"), a, b, [Opt("TC", 0, 222223)])


@pytest.mark.parametrize("arch", ARCHS)
def test_deep_pipelines_only_where_copies_are_asynchronous(arch):
    """BEAM is offered 3 and 4 stages only on a renderer with async_copy_bytes (PYTHON::sm_90, not RDNA3/CDNA3),
    where they fit its shared memory; elsewhere asking for them raises OptError. The heuristic keeps 2 stages."""
    renderer = PythonRenderer(arch)
    x, y = Tensor(data(128, 64)).half().realize(), Tensor(data(64, 128, seed=1)).half().realize()
    base = before_optimize(kernel_asts(lambda: x.matmul(y, dtype=dtypes.float32))[0])
    stages = {TileShape.from_code(o.amount).stages for o in gpu_candidates(base, renderer) if o.op == "TC" and o.amount}
    assert stages == ({1, 2, 3, 4} if renderer.async_copy_bytes else {1, 2})
    if not renderer.async_copy_bytes:
        with pytest.raises(OptError, match="stages"):
            apply_opts(base, [Opt("TC", 0, 222223)], renderer)
    assert TileShape.from_code(222224).stages == 4 and TileShape.from_code(222224).code == 222224
    with pytest.raises(OptError, match="tile shape"):
        TileShape.from_code(222225)


@pytest.mark.parametrize(
    "code,loads",
    [
        (
            222222,
            2 * 2 + 1 * 2,
        ),  # 2 A fragments x 2 k-fragments (x4), one pair of B fragments x 2 k-fragments (x4 .trans)
        (221322, 1 * 2 + 2 * 2),  # 3 B fragments: a pair (x4 .trans) and one alone (x2 .trans) per k-fragment
    ],
)
def test_fragments_come_from_warp_wide_matrix_loads(code, loads):
    """Where the renderer has matrix_loads (PYTHON::sm_90 as NVIDIA's ldmatrix) and the instruction's layout is
    ldmatrix's, a warp reads each A fragment with one x4 matrix load and each two B fragments with one x4 .trans:
    no scalar shared loads are left; the executor hands each lane the elements other lanes' rows hold."""
    renderer = PythonRenderer("sm_90")
    a, b = operands(64, 64, 96)
    got, uops = run_matmul(renderer, a, b, [Opt("TC", 0, code)])
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-4)
    shared_loads = [u for u in uops if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.DEFINE_LOCAL]
    assert all(isinstance(u.arg, MatrixLoad) for u in shared_loads) and len(shared_loads) == loads
    assert {(u.arg.count, u.arg.trans) for u in shared_loads} >= {(4, False), (4, True)}


def test_other_layouts_read_fragments_element_by_element():
    """RDNA3's WMMA layout is not ldmatrix's: its fragments stay scalar shared loads even with matrix_loads."""
    renderer = PythonRenderer("gfx1100")
    renderer.matrix_loads = True
    a, b = operands(64, 64, 64)
    got, uops = run_matmul(renderer, a, b, [Opt("TC", 0, 11111)])
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-4)
    assert not [u for u in uops if u.op is Ops.LOAD and u.arg is not None]
