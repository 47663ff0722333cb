"""`Tensor.custom_kernel` as tinygrad's: kernels written in UOps over the tensors' buffers (one or several outputs,
written in place), their backward through `grad_fxn`, a TinyJit capturing them. Values against numpy, gradients
against torch (CPU, float64) computing the same function with ordinary ops."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from xgrad import Tensor, TinyJit, dtypes
from xgrad.custom_kernel import CustomKernelError, KernelArg
from xgrad.errors import DeviceMismatchError
from xgrad.uop.ops import AxisType, KernelInfo, Ops, UOp

rng = np.random.default_rng(21)


def data(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# ---- kernels, written the way tinygrad's custom kernels are ----
def add_kernel(c: KernelArg, a: KernelArg, b: KernelArg) -> UOp:
    c, a, b = c.flatten(), a.flatten(), b.flatten()
    i = UOp.range(c.numel(), 0)
    return c[i].store(a[i] + b[i]).end(i).sink(arg=KernelInfo(name=f"custom_add_{c.numel()}")).simplify()


def add_one_kernel(b: KernelArg, a: KernelArg) -> UOp:
    a, b = a.flatten(), b.flatten()
    i = UOp.range(a.numel(), 0)
    return b[i].store(a[i] + 1).end(i).sink(arg=KernelInfo(name="add_one"))


def addmul_kernel(c: KernelArg, d: KernelArg, a: KernelArg, b: KernelArg) -> UOp:
    c, d, a, b = c.flatten(), d.flatten(), a.flatten(), b.flatten()
    i = UOp.range(c.numel(), 0)
    return UOp.group(c[i].store(a[i] + b[i]), d[i].store(a[i] * b[i])).end(i).sink(arg=KernelInfo(name="addmul"))


def eye_kernel(c: KernelArg) -> UOp:
    i, j = UOp.range(c.shape[0], 0), UOp.range(c.shape[1], 1)
    return c[i, j].store(i.eq(j).cast(c.dtype)).end(i, j).sink(arg=KernelInfo(name="eye"))


def gemm_kernel(c: KernelArg, a: KernelArg, b: KernelArg) -> UOp:
    i, j = UOp.range(c.shape[0], 0), UOp.range(c.shape[1], 1)
    k = UOp.range(a.shape[1], 2, AxisType.REDUCE)
    acc = UOp(Ops.REDUCE, c.dtype, (a[i, k] * b[k, j], k), Ops.ADD)
    return c[i, j].store(acc).sink(arg=KernelInfo(name="gemm"))


def sum_kernel(out: KernelArg, a: KernelArg) -> UOp:
    r = UOp.range(a.numel(), 0, AxisType.REDUCE)
    return out[0].store(UOp(Ops.REDUCE, out.dtype, (a.flatten()[r], r), Ops.ADD)).sink(arg=KernelInfo(name="sum"))


# ---- backward callbacks ----
def backward_gemm(gradient: UOp, kernel: UOp) -> tuple[UOp | None, ...]:
    _, a, b = kernel.src[1:]
    return (None, (Tensor(gradient) @ Tensor(b).T).uop, (Tensor(a).T @ Tensor(gradient)).uop)


def backward_gemm_custom(gradient: UOp, kernel: UOp) -> tuple[UOp | None, ...]:
    # the backward is itself two custom kernels
    _, a, b = kernel.src[1:]
    ta, tb, tg = Tensor(a), Tensor(b), Tensor(gradient)
    grad_a = Tensor.empty(*ta.shape, device=ta.device).custom_kernel(tg, tb.T, fxn=gemm_kernel)[0]
    grad_b = Tensor.empty(*tb.shape, device=tb.device).custom_kernel(ta.T, tg, fxn=gemm_kernel)[0]
    return (None, grad_a.uop, grad_b.uop)


def backward_addmul(grad_c: UOp, grad_d: UOp, call: UOp) -> tuple[UOp | None, ...]:
    _, _, a, b = call.src[1:]
    grad_a = (Tensor(grad_c) + Tensor(grad_d) * Tensor(b)).uop
    grad_b = (Tensor(grad_c) + Tensor(grad_d) * Tensor(a)).uop
    return (None, None, grad_a, grad_b)


# ---- forward ----
def test_elementwise_kernel_writes_its_output() -> None:
    a_np, b_np = data(16, 16), data(16, 16)
    c = Tensor.custom_kernel(Tensor.empty(16, 16), Tensor(a_np), Tensor(b_np), fxn=add_kernel)[0]
    np.testing.assert_allclose(c.numpy(), a_np + b_np, rtol=1e-6)


def test_multi_output_kernel(xgrad_device: str) -> None:
    a_np, b_np = data(8, 4), data(8, 4)
    empty = [Tensor.empty(8, 4, device=xgrad_device) for _ in range(2)]
    a_in, b_in = Tensor(a_np, device=xgrad_device), Tensor(b_np, device=xgrad_device)
    c, d, a, b = Tensor.custom_kernel(*empty, a_in, b_in, fxn=addmul_kernel)
    np.testing.assert_allclose(c.numpy(), a_np + b_np, rtol=1e-6)
    np.testing.assert_allclose(d.numpy(), a_np * b_np, rtol=1e-6)
    np.testing.assert_array_equal(a.numpy(), a_np)  # the inputs after the kernel: unchanged
    np.testing.assert_array_equal(b.numpy(), b_np)


def test_two_dimensional_indexing_and_reduce_ranges() -> None:
    np.testing.assert_array_equal(Tensor.empty(5, 5).custom_kernel(fxn=eye_kernel)[0].numpy(), np.eye(5))
    a_np, b_np = data(4, 8), data(8, 3)
    c = Tensor.custom_kernel(Tensor.empty(4, 3), Tensor(a_np), Tensor(b_np), fxn=gemm_kernel)[0]
    np.testing.assert_allclose(c.numpy(), a_np @ b_np, rtol=1e-5, atol=1e-5)
    s = Tensor.custom_kernel(Tensor.empty(1, dtype=dtypes.int32), Tensor([1, 2, 3, 4, 5]), fxn=sum_kernel)[0]
    assert s.item() == 15


def test_in_place_on_a_duplicate_argument_and_a_lazy_input() -> None:
    x = Tensor.arange(4).clone().realize()
    assert Tensor.custom_kernel(x, x, fxn=add_one_kernel)[0].tolist() == [1, 2, 3, 4]
    a = Tensor.ones(4, 4).contiguous()
    out = Tensor.custom_kernel(Tensor.empty(4, 4), a + 1, fxn=add_one_kernel)[0]  # a computed input is realized
    np.testing.assert_array_equal(out.numpy(), np.full((4, 4), 3.0))


# ---- backward ----
@pytest.mark.parametrize("grad_fxn", [backward_gemm, backward_gemm_custom])
def test_gemm_backward_matches_torch(grad_fxn: object, xgrad_device: str) -> None:
    a_np, b_np = data(4, 8), data(8, 4)
    a, b = Tensor(a_np, device=xgrad_device), Tensor(b_np, device=xgrad_device)
    c = Tensor.empty(4, 4, device=xgrad_device)
    out = Tensor.custom_kernel(c, a, b, fxn=gemm_kernel, grad_fxn=grad_fxn)[0]
    (out * out).sum().backward()
    ta, tb = torch.tensor(a_np, dtype=torch.float64, requires_grad=True), torch.tensor(b_np, dtype=torch.float64)
    tb.requires_grad_()
    ((ta @ tb) ** 2).sum().backward()
    assert a.grad is not None and b.grad is not None and ta.grad is not None and tb.grad is not None
    np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(b.grad.numpy(), tb.grad.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("loss", "torch_loss"),
    [
        (lambda c, d: c.sum() + d.sum(), lambda a, b: (a + b).sum() + (a * b).sum()),
        (lambda c, d: (c * d).sum(), lambda a, b: ((a + b) * (a * b)).sum()),
    ],
    ids=["separate", "interacting"],
)
def test_multi_output_backward_matches_torch(loss: object, torch_loss: object) -> None:
    a_np, b_np = data(4, 4), data(4, 4)
    a, b = Tensor(a_np), Tensor(b_np)
    c, d, _, _ = Tensor.custom_kernel(
        Tensor.empty(4, 4), Tensor.empty(4, 4), a, b, fxn=addmul_kernel, grad_fxn=backward_addmul
    )
    loss(c, d).backward()  # type: ignore[operator]
    ta = torch.tensor(a_np, dtype=torch.float64, requires_grad=True)
    tb = torch.tensor(b_np, dtype=torch.float64, requires_grad=True)
    torch_loss(ta, tb).backward()  # type: ignore[operator]
    assert a.grad is not None and b.grad is not None and ta.grad is not None and tb.grad is not None
    np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.grad.numpy(), tb.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_gradient_reaches_through_a_computed_input() -> None:
    a_np, b_np = data(3, 5), data(5, 2)
    a, b = Tensor(a_np), Tensor(b_np)
    out = Tensor.custom_kernel(Tensor.empty(3, 2), a * 2, b, fxn=gemm_kernel, grad_fxn=backward_gemm)[0]
    (da,) = out.sum().gradient(a)
    np.testing.assert_allclose(da.numpy(), 2 * np.ones((3, 2)) @ b_np.T, rtol=1e-5, atol=1e-5)


def test_backward_without_grad_fxn_raises() -> None:
    a = Tensor(data(4))
    out = Tensor.custom_kernel(Tensor.empty(4), a, fxn=add_one_kernel)[0]
    with pytest.raises(RuntimeError, match="grad_fxn"):
        out.sum().backward()


# ---- the JIT and errors ----
def test_tinyjit_captures_and_replays_a_custom_kernel() -> None:
    @TinyJit
    def f(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        c, d, _, _ = Tensor.custom_kernel(Tensor.empty(6), Tensor.empty(6), a, b, fxn=addmul_kernel)
        return (c * 2).realize(), (d + 1).realize()

    for _ in range(4):
        a_np, b_np = data(6), data(6)
        c, d = f(Tensor(a_np).realize(), Tensor(b_np).realize())
        np.testing.assert_allclose(c.numpy(), (a_np + b_np) * 2, rtol=1e-6)
        np.testing.assert_allclose(d.numpy(), a_np * b_np + 1, rtol=1e-6)


def test_kernel_that_is_not_a_sink_or_reads_a_missing_argument_raises() -> None:
    with pytest.raises(CustomKernelError, match="SINK"):
        Tensor.empty(2).custom_kernel(fxn=lambda c: c[0])
    with pytest.raises(CustomKernelError, match="argument 1"):
        other = UOp(Ops.PARAM, dtypes.float32, (), 1).index(UOp.const(dtypes.index, 0))
        Tensor.empty(2).custom_kernel(fxn=lambda c: c[0].store(other).sink())


def test_arguments_on_different_devices_raise() -> None:
    with pytest.raises(DeviceMismatchError):
        Tensor.empty(2).custom_kernel(Tensor([1.0, 2.0], device="PYTHON"), fxn=add_one_kernel)
