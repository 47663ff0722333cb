"""GPU lowering (xgrad_codegen.gpu, gpu_opt) run with GPU semantics on the PYTHON executor (`DEV=PYTHON::<arch>`,
xgrad_codegen.pygpu): workgroups, shared memory, barriers, group reductions, launch limits; results against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import data, kernel_asts

from xgrad import Device, Tensor
from xgrad.dtype import dtypes
from xgrad.errors import DeviceError
from xgrad.uop.ops import AxisType, Ops, UOp
from xgrad_codegen.gpu import lower_gpu_dims, map_dims
from xgrad_codegen.gpu_opt import gpu_candidates, gpu_heuristic_opts
from xgrad_codegen.opt import Opt, OptError, apply_opt, kernel_ranges
from xgrad_codegen.pipeline import before_optimize, full_rewrite
from xgrad_codegen.pydevice import GPU_ARCHS, PythonRenderer
from xgrad_codegen.pyexec import ProgramError
from xgrad_codegen.pygpu import eval_launch, run_gpu_program
from xgrad_codegen.search import candidates

ARCHS = sorted(GPU_ARCHS)


def softmax_np(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def run_on(renderer: PythonRenderer, ast: UOp, inputs: list[np.ndarray], out_shape: tuple[int, ...], opts=None):
    """Lower `ast` for `renderer`, run it with GPU semantics on `inputs`, return (output, linear program)."""
    uops = full_rewrite(ast, renderer, opts)
    out = np.zeros(out_shape, np.float32)
    run_gpu_program(uops, [memoryview(out).cast("B"), *(memoryview(np.ascontiguousarray(x)).cast("B") for x in inputs)])
    return out, uops


@pytest.mark.parametrize("arch", ARCHS)
def test_ops_match_numpy_on_gpu_arch(arch):
    dev = f"PYTHON::{arch}"
    a, b = data(6, 37), data(6, 37, seed=1)
    got = (Tensor(a, device=dev) * 2 + Tensor(b, device=dev)).relu().numpy()
    np.testing.assert_allclose(got, np.maximum(a * 2 + b, 0), rtol=1e-6)
    np.testing.assert_allclose(Tensor(a, device=dev).sum(axis=0).numpy(), a.sum(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(Tensor(a, device=dev).max(axis=1).numpy(), a.max(1))
    m = data(8, 12, seed=2) @ data(12, 5, seed=3)
    got = (Tensor(data(8, 12, seed=2), device=dev) @ Tensor(data(12, 5, seed=3), device=dev)).numpy()
    np.testing.assert_allclose(got, m, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_wide_softmax_uses_a_group_reduction(arch):
    """A 4096-wide row softmax: every reduction splits over a workgroup's threads and meets in shared memory."""
    x = Tensor(data(2, 4096)).realize()
    asts = kernel_asts(lambda: x.softmax(-1))
    renderer = PythonRenderer(arch)
    reduces = [a for a in asts if any(u.op is Ops.REDUCE for u in a.toposort)]
    assert reduces
    for ast in reduces:
        opts = gpu_heuristic_opts(before_optimize(ast), renderer)
        assert any(o.op == "GROUP" for o in opts), opts
        uops = full_rewrite(ast, renderer)
        assert sum(u.op is Ops.DEFINE_LOCAL for u in uops) >= 1
        assert sum(u.op is Ops.BARRIER for u in uops) >= 1
        (gx, gy, gz), (lx, ly, lz) = eval_launch(uops, {})
        assert lx * ly * lz >= 64  # a workgroup of threads per row
    a = data(2, 4096, seed=4)
    got = Tensor(a, device=f"PYTHON::{arch}").softmax(-1).numpy()
    np.testing.assert_allclose(got, softmax_np(a), rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("op, amount", [("GROUP", 16), ("GROUPTOP", 16), ("GROUP", 12)])
def test_group_reductions_one_after_another_match_numpy(op, amount):
    """Three grouped reductions in one thread (the rows upcast), each through its own shared slots: a power-of-two
    group combines its slots in halving steps (a barrier after each), another adds them up in every thread."""
    renderer = PythonRenderer("sm_90")
    a = data(3, 96)
    x = Tensor(a).realize()
    (ast,) = kernel_asts(lambda: x.sum(axis=1))
    base = before_optimize(ast)
    red = next(r.arg[0] for r in kernel_ranges(base) if r.arg[1] is AxisType.REDUCE)
    out, uops = run_on(renderer, ast, [a], (3,), [Opt(op, red, amount), Opt("UPCAST", 0, 3)])
    np.testing.assert_allclose(out, a.sum(1), rtol=1e-5)
    steps = amount.bit_length() - 1 if amount & (amount - 1) == 0 else 0
    assert sum(u.op is Ops.BARRIER for u in uops) == 3 * (1 + steps)
    assert sum(u.op is Ops.DEFINE_LOCAL for u in uops) == 3


def test_local_and_group_together_match_numpy():
    renderer = PythonRenderer("gfx942")
    a = data(8, 96)
    x = Tensor(a).realize()
    (ast,) = kernel_asts(lambda: x.max(axis=1))
    # the reduce range keeps its id (1) after LOCAL splits the rows (id 0; the threads get id 2), though it is now
    # listed third by kernel_ranges
    out, uops = run_on(renderer, ast, [a], (8,), [Opt("LOCAL", 0, 4), Opt("GROUPTOP", 1, 8)])
    np.testing.assert_allclose(out, a.max(1))
    assert eval_launch(uops, {})[1] == (8, 4, 1)  # group threads on x, the output's threads on y


def test_launch_limits_split_and_merge_dims():
    """More workgroups than one dimension allows spread over y and z (masked when no exact factorization fits);
    more workgroup ranges than dimensions merge."""
    renderer = PythonRenderer("sm_90")
    renderer.global_max = (4, 3, 5)
    a = data(7, 2, 3, seed=5)
    x = Tensor(a).realize()
    (ast,) = kernel_asts(lambda: (x * 3).contiguous())
    out, uops = run_on(renderer, ast, [a], (7, 2, 3), [])
    np.testing.assert_allclose(out, a * 3)
    (gx, gy, gz), _ = eval_launch(uops, {})
    assert gx <= 4 and gy <= 3 and gz <= 5 and gx * gy * gz >= 42
    mapping, valid = map_dims([UOp.range(13, 0, AxisType.GLOBAL)], (4, 4), "gidx")
    assert valid is not None  # 13 is prime: 16 ids, 3 masked off
    mapping, valid = map_dims([UOp.range(12, 0, AxisType.GLOBAL)], (4, 4), "gidx")
    assert valid is None  # 12 = 4 x 3 exactly
    empty = [UOp.range(n, i, AxisType.GLOBAL) for i, n in enumerate((0, 3, 3, 3))]  # merged: no workgroups
    mapping, valid = map_dims(empty, (8, 8, 8), "gidx")
    assert valid is None and {u.arg for e in mapping.values() for u in e.toposort if u.op is Ops.SPECIAL} == {
        ("gidx0", 0)
    }


def test_launch_limits_too_small_raise_opterror():
    renderer = PythonRenderer("sm_90")
    renderer.global_max = (2, 2)
    x = Tensor(data(3, 5)).realize()
    (ast,) = kernel_asts(lambda: (x + 1).contiguous())
    with pytest.raises(OptError, match="exceed the launch limits"):
        full_rewrite(ast, renderer, [])
    renderer = PythonRenderer("sm_90")
    renderer.max_threads = 8
    with pytest.raises(OptError, match="threads per workgroup"):
        full_rewrite(ast, renderer, [Opt("LOCAL", 1, 5), Opt("LOCAL", 0, 3)])
    assert lower_gpu_dims(apply_opt(before_optimize(ast), Opt("LOCAL", 1, 5)), renderer) is not None


def test_symbolic_workgroup_count():
    n = UOp(Ops.DEFINE_VAR, dtypes.index, (), ("n", 1, 100))
    mapping, valid = map_dims([UOp.range(n, 0, AxisType.GLOBAL)], (16, 16), "gidx")
    assert valid is not None
    specials = sorted({u for e in mapping.values() for u in e.toposort if u.op is Ops.SPECIAL}, key=lambda u: u.arg)
    assert [s.arg[0] for s in specials] == ["gidx0", "gidx1"]


def test_cpu_renderer_declares_no_workgroups_and_refuses_local():
    cpu = Device["CPU"].renderer
    assert not cpu.has_local and not cpu.has_shared and cpu.global_max == () and cpu.tensor_cores == ()
    ast = before_optimize(kernel_asts(lambda: Tensor(data(4, 64)).realize().sum(1))[0])
    assert gpu_candidates(ast, cpu) == []
    assert not any(o.op in ("LOCAL", "GROUP", "GROUPTOP") for o in candidates(ast, cpu))
    with pytest.raises(OptError, match="no workgroups"):
        full_rewrite(ast, cpu, [Opt("LOCAL", 0, 2)])
    assert not any(u.op in (Ops.SPECIAL, Ops.BARRIER, Ops.DEFINE_LOCAL) for u in full_rewrite(ast, cpu))


def test_beam_candidates_include_gpu_actions_within_limits():
    renderer = PythonRenderer("gfx1100")
    ast = before_optimize(kernel_asts(lambda: Tensor(data(4, 512)).realize().sum(1))[0])
    cands = candidates(ast, renderer)
    assert {"LOCAL", "GROUP", "GROUPTOP"} <= {o.op for o in cands}
    renderer.max_threads = 8
    assert max(o.amount for o in gpu_candidates(ast, renderer)) <= 8
    # every GPU candidate lowers and computes the right sum
    a = data(4, 512)
    for opt in gpu_candidates(ast, PythonRenderer("gfx1100"))[:6]:
        out, _ = run_on(PythonRenderer("gfx1100"), ast, [a], (4,), [opt])
        np.testing.assert_allclose(out, a.sum(1), rtol=1e-4, atol=1e-5)


def _group_program(barrier: bool) -> list[UOp]:
    """A tiny GPU program: 4 threads write their id to shared memory, then each reads its neighbour's."""
    lid = UOp(Ops.SPECIAL, dtypes.index, (), ("lidx0", 4))
    smem = UOp(Ops.DEFINE_LOCAL, dtypes.int32, (), (0, 4))
    out = UOp(Ops.PARAM, dtypes.int32, (), 0)
    st = smem.index(lid).store(lid.cast(dtypes.int32))
    after = UOp(Ops.BARRIER, dtypes.void, (st,)) if barrier else st
    read = UOp(Ops.NOOP, dtypes.int32, (smem, after)).index((lid + 1) % 4).load()
    sink = out.index(lid).store(read).sink()
    from xgrad_codegen.linearize import linearize

    return linearize(sink)


def test_shared_memory_is_per_workgroup_and_barriers_order_it():
    out = np.zeros(4, np.int32)
    run_gpu_program(_group_program(barrier=True), [memoryview(out).cast("B")])
    assert out.tolist() == [1, 2, 3, 0]


def test_missing_barrier_is_reported_as_a_race():
    out = np.zeros(4, np.int32)
    with pytest.raises(ProgramError, match="shared memory race"):
        run_gpu_program(_group_program(barrier=False), [memoryview(out).cast("B")])


def test_unknown_python_arch_is_refused():
    with pytest.raises(DeviceError, match="sm_90"):
        PythonRenderer("sm_12")


def test_python_device_name_with_arch():
    assert Device.canonicalize("python::sm_90") == "PYTHON::sm_90"
    assert Device["PYTHON::gfx942"].renderer.has_local
    assert not Device["PYTHON"].renderer.has_local


def test_group_reduction_inside_another_reduction_loop():
    """out = sum over rows of (max over the row): the grouped max runs once per step of the outer sum, so its shared
    slots are rewritten each step; without the barrier before the write a fast thread would overwrite a slot another
    thread still reads (the executor reports that as a race)."""
    from xgrad.uop.ops import KernelInfo

    out, x = UOp(Ops.PARAM, dtypes.float32, (), 0), UOp(Ops.PARAM, dtypes.float32, (), 1)
    rows, cols = UOp.range(4, 0, AxisType.REDUCE), UOp.range(64, 1, AxisType.REDUCE)
    inner = UOp(Ops.REDUCE, dtypes.float32, (x.index(rows * 64 + cols).load(), cols), Ops.MAX)
    outer = UOp(Ops.REDUCE, dtypes.float32, (inner, rows), Ops.ADD)
    ast = out.index(UOp.const(dtypes.index, 0)).store(outer).sink(arg=KernelInfo("nested"))
    a = data(4, 64, seed=7)
    got, uops = run_on(PythonRenderer("sm_90"), ast, [a], (1,), [Opt("GROUP", 1, 16)])
    np.testing.assert_allclose(got, [a.max(1).sum()], rtol=1e-6)
    assert sum(u.op is Ops.BARRIER for u in uops) == 1 + 1 + 4  # before the write, after it, 4 halving steps


@pytest.mark.parametrize("arch", ARCHS)
def test_tensor_core_layouts_cover_each_matrix(arch):
    """Each declared instruction's register layout puts every element of A (m x k), B (k x n) and D (m x n) in some
    lane (copies allowed for A and B, as RDNA3 has), and D's exactly once."""
    for tc in PythonRenderer(arch).tensor_cores:
        m, n, k = tc.dims
        for operand, shape in (("a", (m, k)), ("b", (k, n)), ("c", (m, n))):
            places = [tc.place(operand, lane, e) for lane in range(tc.threads) for e in range(tc.elements(operand))]
            assert set(places) == {(i, j) for i in range(shape[0]) for j in range(shape[1])}, (tc.name, operand)
            if operand == "c":
                assert len(places) == m * n


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
def test_half_matmul_runs_on_the_tensor_cores(arch, dtype):
    """A float16/bfloat16 matmul accumulating in float32 is one WMMA per warp and k-block of the arch's instruction,
    emulated lane by lane; the result matches numpy's float32 matmul of the same values."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((32, 48)).astype(np.float32)
    b = rng.standard_normal((48, 16)).astype(np.float32)
    x, y = Tensor(a).cast(dtype).realize(), Tensor(b).cast(dtype).realize()
    (ast,) = kernel_asts(lambda: x.matmul(y, dtype=dtypes.float32))
    renderer = PythonRenderer(arch)
    uops = full_rewrite(ast, renderer)
    wmmas = [u for u in uops if u.op is Ops.WMMA]
    assert len(wmmas) == 1 and wmmas[0].arg.dtype == dtype and wmmas[0].arg in renderer.tensor_cores
    assert eval_launch(uops, {})[1][0] == wmmas[0].arg.threads  # one warp per workgroup
    dev = f"PYTHON::{arch}"
    got = Tensor(a, device=dev).cast(dtype).matmul(Tensor(b, device=dev).cast(dtype), dtype=dtypes.float32).numpy()
    want = x.float().numpy() @ y.float().numpy()  # the operands as rounded to dtype, products exact in float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_tensor_cores_leave_other_kernels_alone():
    renderer = PythonRenderer("sm_90")
    x = Tensor(data(32, 48)).realize()  # float32: no declared instruction takes it
    (ast,) = kernel_asts(lambda: x @ Tensor(data(48, 16, seed=1)).realize())
    assert not any(u.op is Ops.WMMA for u in full_rewrite(ast, renderer))
    # 3 rows: padding them to a 16-row tile (tc_tile) would be 5x the work, and 3 is no multiple of 16 (tc.py)
    h, w = Tensor(data(3, 48)).half().realize(), Tensor(data(48, 16, seed=1)).half().realize()
    (ast,) = kernel_asts(lambda: h.matmul(w, dtype=dtypes.float32))
    assert not any(u.op is Ops.WMMA for u in full_rewrite(ast, renderer))


@pytest.mark.parametrize("arch", ARCHS)
def test_null_device_compiles_a_matmul_with_tensor_cores(arch):
    """DEV=NULL:PYTHON:<arch> lowers a float16 matmul onto the arch's instruction without running it."""
    x, y = Tensor(data(64, 32)).half().realize(), Tensor(data(32, 32, seed=1)).half().realize()
    (ast,) = kernel_asts(lambda: x.matmul(y, dtype=dtypes.float32))
    src = Device[f"NULL:PYTHON:{arch}"].compile(ast).info.src
    assert "WMMA" in src and PythonRenderer(arch).tensor_cores[0].name in src


def test_group_on_a_tensor_core_sum_is_refused():
    """A tensor core's sum is of vector fragments; GROUP (shared slots of scalars) refuses it, so BEAM skips it (it
    wrote overlapping slots before, which the executor reported as a race)."""
    from xgrad_codegen.gpu_opt import apply_opts

    renderer = PythonRenderer("sm_90")
    x, y = Tensor(data(32, 32)).half().realize(), Tensor(data(32, 16, seed=1)).half().realize()
    (ast,) = kernel_asts(lambda: x.matmul(y, dtype=dtypes.float32))
    tc_ast = apply_opts(before_optimize(ast), [Opt("TC", 0)], renderer)
    red = next(r.arg[0] for r in kernel_ranges(tc_ast) if r.arg[1] is AxisType.REDUCE)
    with pytest.raises(OptError, match="vectors"):
        full_rewrite(ast, renderer, [Opt("TC", 0), Opt("GROUP", red, 2)])
    with pytest.raises(OptError, match="tensor_cores"):
        apply_opt(before_optimize(ast), Opt("TC", 0))  # which instruction needs the renderer
