"""The GPU heuristic's renderer-declared preferences (xgrad_codegen.gpu_opt): `group_max_outputs` decides when a long
reduction is split over a workgroup, `min_local` how wide a workgroup must be (lavapipe's SIMD lanes), and a
workgroup the store-contiguous loop leaves narrow is filled from the other output loops. Programs run with GPU
semantics on the PYTHON executor (xgrad_codegen.pygpu); results against numpy."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from kernel_helpers import data, kernel_items

from xgrad import Tensor
from xgrad.uop.ops import AxisType, UOp
from xgrad_codegen.gpu_opt import gpu_candidates, gpu_heuristic_opts, threads_of
from xgrad_codegen.opt import Opt, apply_opt, kernel_ranges
from xgrad_codegen.pipeline import before_optimize, full_rewrite
from xgrad_codegen.pydevice import PythonRenderer
from xgrad_codegen.pygpu import run_gpu_program


class LavapipeLike(PythonRenderer):
    """sm_90's limits with preferences like those the WebGPU device declares for lavapipe: workgroups of at least 8
    threads (its SIMD lanes), and no group reduction in a kernel of 8 outputs or more."""

    min_local = 8
    group_max_outputs = 8


def kernel_with_inputs(fn: Callable[[], Tensor]) -> tuple[UOp, list[np.ndarray]]:
    """The one kernel that realizing `fn()` runs, with the contents of its input buffers in PARAM order."""
    (found,) = kernel_items(fn, inputs=True)
    return found


def _run(ast: UOp, renderer: PythonRenderer, inputs: list[np.ndarray], out_shape: tuple[int, ...]) -> np.ndarray:
    out = np.zeros(out_shape, np.float32)
    bufs = [memoryview(out).cast("B"), *(memoryview(np.ascontiguousarray(x)).cast("B") for x in inputs)]
    run_gpu_program(full_rewrite(ast, renderer), bufs)
    return out


def _applied(ast: UOp, opts: list[Opt]) -> UOp:
    for opt in opts:
        ast = apply_opt(ast, opt)
    return ast


def test_group_reduction_only_below_the_renderers_group_max_outputs() -> None:
    """8 sums of 1024: a GPU (16384) splits each over a workgroup; a renderer that keeps 8 outputs busy without it
    gets one thread per sum. Both add up the same."""
    x = data(8, 1024)
    t = Tensor(x).realize()
    ast, inputs = kernel_with_inputs(lambda: t.sum(1))
    base = before_optimize(ast)
    gpu, lavapipe = PythonRenderer("sm_90"), LavapipeLike("sm_90")
    assert any(o.op == "GROUP" for o in gpu_heuristic_opts(base, gpu))
    assert not any(o.op == "GROUP" for o in gpu_heuristic_opts(base, lavapipe))
    for renderer in (gpu, lavapipe):
        np.testing.assert_allclose(_run(ast, renderer, inputs, (8,)), x.sum(1), rtol=1e-5, atol=1e-4)


def test_narrow_workgroup_is_filled_from_the_other_output_loops() -> None:
    """A conv's weight gradient: the register tile upcasts the contiguous loop to 2 iterations, so the workgroup takes
    threads from the output channels too (8 in all; the old rule stopped at the contiguous loop's 2)."""
    x, w = data(16, 8, 3, 3), data(12, 8, 3, 3, seed=1)
    a, b = Tensor(x).realize(), Tensor(w).realize()
    ast, inputs = kernel_with_inputs(lambda: a.conv2d(b))
    renderer = PythonRenderer("sm_90")
    opts = gpu_heuristic_opts(before_optimize(ast), renderer)
    assert sum(o.op == "LOCAL" for o in opts) >= 2
    assert threads_of(_applied(before_optimize(ast), opts)) >= 8
    want = np.einsum("nchw,ochw->no", x, w).reshape(16, 12, 1, 1)
    np.testing.assert_allclose(_run(ast, renderer, inputs, (16, 12, 1, 1)), want, rtol=1e-5, atol=1e-5)


def test_min_local_pads_a_loop_to_fill_a_workgroup() -> None:
    """(64, 32) @ (32, 10): the register tile leaves output loops of 11 and 5 iterations, which no amount divides;
    a renderer with 8-lane workgroups pads one of them so that its workgroups have at least 8 threads, and the
    padded threads store nothing."""
    x, w = data(64, 32), data(32, 10, seed=1)
    a, b = Tensor(x).realize(), Tensor(w).realize()
    ast, inputs = kernel_with_inputs(lambda: a @ b)
    base = before_optimize(ast)
    gpu, lavapipe = PythonRenderer("sm_90"), LavapipeLike("sm_90")
    assert threads_of(_applied(base, gpu_heuristic_opts(base, gpu))) < 8
    opts = gpu_heuristic_opts(base, lavapipe)
    assert [o.op for o in opts][-2:] == ["PADTO", "LOCAL"]
    tuned = _applied(base, opts)
    assert threads_of(tuned) >= 8 and any(r.arg[1] is AxisType.LOCAL for r in kernel_ranges(tuned))
    np.testing.assert_allclose(_run(ast, lavapipe, inputs, (64, 10)), x @ w, rtol=1e-5, atol=1e-4)


def test_beam_offers_group_only_below_the_renderers_group_max_outputs() -> None:
    """BEAM's GROUP/GROUPTOP moves follow the heuristic's rule (on lavapipe such candidates took LLVM minutes)."""
    t = Tensor(data(8, 1024)).realize()
    ast = before_optimize(kernel_with_inputs(lambda: t.sum(1))[0])
    assert {"GROUP", "GROUPTOP"} <= {o.op for o in gpu_candidates(ast, PythonRenderer("sm_90"))}
    assert not {"GROUP", "GROUPTOP"} & {o.op for o in gpu_candidates(ast, LavapipeLike("sm_90"))}
