"""Convs on the tensor cores (xgrad_codegen.tc_conv): a float16 conv's forward pass and weight gradient are one WMMA
per warp and k-block on each PYTHON GPU arch (the instruction emulated lane by lane), padded where the conv's sizes
are not multiples of the instruction's; results against torch's float32 conv of the same float16 values."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kernel_helpers import data, kernel_asts

from xgrad import Tensor
from xgrad.dtype import dtypes
from xgrad.uop.ops import Ops, UOp
from xgrad_codegen.opt import kernel_ranges, range_size
from xgrad_codegen.pipeline import before_optimize, full_rewrite
from xgrad_codegen.pydevice import GPU_ARCHS, PythonRenderer
from xgrad_codegen.tc_conv import as_matmul

ARCHS = sorted(GPU_ARCHS)


def _wmmas(ast: UOp, arch: str) -> list[UOp]:
    renderer = PythonRenderer(arch)
    wmmas = [u for u in full_rewrite(ast, renderer) if u.op is Ops.WMMA]
    assert all(w.arg in renderer.tensor_cores for w in wmmas)
    return wmmas


def _torch_conv(x: np.ndarray, w: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """torch's float32 conv of the values rounded to float16, and its weight gradient for `dy`."""
    xt = torch.tensor(x).half().float()
    wt = torch.tensor(w).half().float().requires_grad_()
    out = torch.nn.functional.conv2d(xt, wt)
    out.backward(torch.tensor(dy).half().float())
    assert wt.grad is not None
    return out.detach().numpy(), wt.grad.numpy()


# (batch, cin, size) with cout 8 and 3x3 kernels: the first fits every arch's shape after padding k = cin * 9 (36 ->
# 48); the second pads every one of m = 1 * 3 * 3 = 9, n = 8 (16 on AMD) and k = 27 for the forward pass
SHAPES = [(2, 4, 6), (1, 3, 5)]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("shape", SHAPES)
def test_half_conv_and_its_weight_gradient_run_on_the_tensor_cores(arch: str, shape: tuple[int, int, int]) -> None:
    batch, cin, size = shape
    xn, wn = data(batch, cin, size, size), data(8, cin, 3, 3, seed=1)
    dyn = data(batch, 8, size - 2, size - 2, seed=2)
    dev = f"PYTHON::{arch}"
    x = Tensor(xn, device=dev).half().realize()
    w = Tensor(wn, device=dev).half().realize().requires_grad_()
    dy = Tensor(dyn, device=dev).half().realize()
    (forward,) = kernel_asts(lambda: x.conv2d(w))
    assert len(_wmmas(forward, arch)) == 1
    got = x.conv2d(w).numpy()
    want, want_dw = _torch_conv(xn, wn, dyn)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-3, atol=2e-3)  # float16's rounding of the sum

    grads = kernel_asts(lambda: (x.conv2d(w).backward(dy), w.grad)[1])
    assert sum(len(_wmmas(a, arch)) for a in grads) == 1  # the weight gradient's kernel
    assert w.grad is not None
    np.testing.assert_allclose(w.grad.numpy().astype(np.float32), want_dw, rtol=2e-3, atol=2e-3)


def test_float32_conv_and_the_input_gradient_stay_off_the_tensor_cores() -> None:
    """No declared instruction takes float32 operands; a float16 conv's input gradient is three nested sums, each
    rounded to float16 (autograd's pooled view of the window), not one sum of products: a tensor core would change
    its rounding, so it keeps the GPU heuristic."""
    x32, w32 = Tensor(data(2, 4, 6, 6)).realize(), Tensor(data(8, 4, 3, 3, seed=1)).realize()
    (ast,) = kernel_asts(lambda: x32.conv2d(w32))
    assert not _wmmas(ast, "sm_90")
    x = Tensor(data(2, 4, 6, 6)).half().realize().requires_grad_()
    w = Tensor(data(8, 4, 3, 3, seed=1)).half().realize()
    dy = Tensor(data(2, 8, 4, 4, seed=2)).half().realize()
    (dx,) = kernel_asts(lambda: (x.conv2d(w).backward(dy), x.grad)[1])
    assert sum(u.op is Ops.REDUCE for u in dx.toposort) == 3 and not _wmmas(dx, "sm_90")


def test_as_matmul_merges_and_pads_the_conv_ranges() -> None:
    """The forward conv's (batch, rows, columns), output channels and (channels, window) become one range each,
    grown to multiples of the instruction's shape; a plain matmul is left as it is."""
    x, w = Tensor(data(1, 3, 5, 5)).half().realize(), Tensor(data(8, 3, 3, 3, seed=1)).half().realize()
    (ast,) = kernel_asts(lambda: x.conv2d(w))
    tc = PythonRenderer("gfx1100").tensor_cores[0]  # 16 x 16 x 16
    base = before_optimize(ast)
    sizes = sorted(range_size(r) or 0 for r in kernel_ranges(as_matmul(base, tc)))
    assert sizes == [16, 16, 32]  # m: 9 -> 16, n: 8 -> 16, k: 27 -> 32
    a, b = Tensor(data(32, 16)).half().realize(), Tensor(data(16, 16, seed=1)).half().realize()
    (mm,) = kernel_asts(lambda: a.matmul(b, dtype=dtypes.float32))
    assert as_matmul(before_optimize(mm), tc) is before_optimize(mm)
