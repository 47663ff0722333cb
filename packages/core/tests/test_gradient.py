"""Autograd (`xgrad.gradient`, `Tensor.gradient`, `Tensor.backward`): forward and backward of every differentiable op
against torch (CPU) as the oracle, on every available device (fixture `xgrad_device`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch_compare import run_docstring

from xgrad.device import Device
from xgrad.dtype import DType, dtypes
from xgrad.errors import DTypeError, ShapeError
from xgrad.gradient import compute_gradient
from xgrad.tensor import Tensor
from xgrad.uop.ops import Ops, UOp

rng = np.random.default_rng(0)

Fn = Callable[..., Any]


def rand(shape: tuple[int, ...], low: float = -2.0, high: float = 2.0) -> np.ndarray:
    return np.asarray(rng.uniform(low, high, size=shape), dtype=np.float32)


def away_from_zero(shape: tuple[int, ...], low: float = 0.3, high: float = 2.0) -> np.ndarray:
    """Values with |x| in [low, high] and random signs (no kinks of abs/relu/sign, no poles of 1/x)."""
    return np.asarray(rand(shape, low, high) * rng.choice([-1.0, 1.0], size=shape), dtype=np.float32)


def check(
    device: str,
    fn: Fn,
    torch_fn: Fn | None,
    *arrays: np.ndarray,
    atol: float = 1e-4,
    rtol: float = 1e-4,
) -> None:
    """Forward and backward of `fn` (on xgrad tensors) and `torch_fn` (on float64 torch tensors, default `fn`),
    with a random upstream gradient, so non-scalar outputs are covered too."""
    xs = [Tensor(a, device=device, requires_grad=True) for a in arrays]  # 0-d: a buffer, not a constant
    ts = [torch.tensor(a.astype(np.float64), requires_grad=True) for a in arrays]
    out = fn(*xs)
    want = (torch_fn or fn)(*ts)
    assert out.shape == tuple(want.shape), f"forward shape {out.shape} != torch {tuple(want.shape)}"
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), atol=atol, rtol=rtol)
    upstream = rand(out.shape)
    grads = out.gradient(*xs, gradient=Tensor(upstream, device=device))
    want_grads = torch.autograd.grad(want, ts, torch.tensor(upstream.astype(np.float64)), allow_unused=True)
    for i, (g, wg, x) in enumerate(zip(grads, want_grads, xs)):
        assert g.shape == x.shape, f"grad {i} shape {g.shape} != input shape {x.shape}"
        assert g.dtype == x.dtype, f"grad {i} dtype {g.dtype} != input dtype {x.dtype}"
        expected = np.zeros(x.shape) if wg is None else wg.numpy()
        np.testing.assert_allclose(g.numpy(), expected, atol=atol, rtol=rtol, err_msg=f"gradient of input {i}")


# ---- unary math ----
UNARY: list[tuple[str, Fn, Fn | None, Callable[[tuple[int, ...]], np.ndarray]]] = [
    ("neg", lambda x: -x, None, rand),
    ("exp", lambda x: x.exp(), None, rand),
    ("exp2", lambda x: x.exp2(), None, rand),
    ("log", lambda x: x.log(), None, lambda s: rand(s, 0.2, 3.0)),
    ("log2", lambda x: x.log2(), None, lambda s: rand(s, 0.2, 3.0)),
    ("sqrt", lambda x: x.sqrt(), None, lambda s: rand(s, 0.2, 3.0)),
    ("rsqrt", lambda x: x.rsqrt(), None, lambda s: rand(s, 0.2, 3.0)),
    ("reciprocal", lambda x: x.reciprocal(), None, away_from_zero),
    ("sin", lambda x: x.sin(), None, lambda s: rand(s, -4.0, 4.0)),
    ("cos", lambda x: x.cos(), None, lambda s: rand(s, -4.0, 4.0)),
    ("tan", lambda x: x.tan(), None, lambda s: rand(s, -1.2, 1.2)),
    ("relu", lambda x: x.relu(), None, away_from_zero),
    ("sigmoid", lambda x: x.sigmoid(), None, rand),
    ("tanh", lambda x: x.tanh(), None, rand),
    ("abs", lambda x: x.abs(), None, away_from_zero),
    ("square", lambda x: x.square(), None, rand),
    ("sign", lambda x: x.sign(), None, away_from_zero),
    ("trunc", lambda x: x.trunc(), None, lambda s: rand(s, -4.0, 4.0)),
    ("floor", lambda x: x.floor(), None, lambda s: rand(s, -4.0, 4.0)),
    ("ceil", lambda x: x.ceil(), None, lambda s: rand(s, -4.0, 4.0)),
    ("pow_scalar_3", lambda x: x**3, None, rand),
    ("pow_scalar_2", lambda x: x**2, None, rand),
    ("rpow_scalar", lambda x: 2.0**x, None, rand),
    ("mul_scalar", lambda x: x * 3.0 - 1.0, None, rand),
    ("rdiv_scalar", lambda x: 2.0 / x, None, away_from_zero),
]


@pytest.mark.parametrize("shape", [(), (5,), (2, 3)], ids=str)
@pytest.mark.parametrize("name,fn,torch_fn,make", UNARY, ids=[u[0] for u in UNARY])
def test_unary_grad_matches_torch(
    xgrad_device: str, name: str, fn: Fn, torch_fn: Fn | None, make: Callable[..., np.ndarray], shape: tuple[int, ...]
) -> None:
    check(xgrad_device, fn, torch_fn, make(shape))


def test_relu_grad_is_zero_at_zero_like_torch(xgrad_device: str) -> None:
    check(xgrad_device, lambda x: x.relu(), None, np.array([-1.0, 0.0, 2.0], dtype=np.float32))


def test_abs_grad_is_zero_at_zero_like_torch(xgrad_device: str) -> None:
    check(xgrad_device, lambda x: x.abs(), None, np.array([-1.0, 0.0, 2.0], dtype=np.float32))


# ---- binary math ----
BINARY: list[tuple[str, Fn, Fn | None]] = [
    ("add", lambda a, b: a + b, None),
    ("sub", lambda a, b: a - b, None),
    ("mul", lambda a, b: a * b, None),
    ("div", lambda a, b: a / b, None),
    ("maximum", lambda a, b: a.maximum(b), torch.maximum),
    ("minimum", lambda a, b: a.minimum(b), torch.minimum),
    ("where", lambda a, b: (a > b).where(a * 2, b), lambda a, b: torch.where(a > b, a * 2, b)),
]
BINARY_SHAPES = [((), ()), ((4,), (4,)), ((2, 3), (3,)), ((2, 1), (1, 3)), ((), (2, 3)), ((3, 1, 2), (4, 1))]


@pytest.mark.parametrize("shapes", BINARY_SHAPES, ids=str)
@pytest.mark.parametrize("name,fn,torch_fn", BINARY, ids=[b[0] for b in BINARY])
def test_binary_grad_matches_torch_with_broadcasting(
    xgrad_device: str, name: str, fn: Fn, torch_fn: Fn | None, shapes: tuple[tuple[int, ...], tuple[int, ...]]
) -> None:
    check(xgrad_device, fn, torch_fn, away_from_zero(shapes[0]), away_from_zero(shapes[1]))


@pytest.mark.parametrize("shapes", [((3,), (3,)), ((2, 3), (3,)), ((), (4,))], ids=str)
def test_pow_grad_matches_torch_for_positive_base(
    xgrad_device: str, shapes: tuple[tuple[int, ...], tuple[int, ...]]
) -> None:
    check(xgrad_device, lambda a, b: a**b, None, rand(shapes[0], 0.3, 2.0), rand(shapes[1], -2.0, 2.0))


def test_where_grad_goes_to_the_picked_branch_only(xgrad_device: str) -> None:
    cond = np.array([True, False, True])
    check(
        xgrad_device,
        lambda a, b: Tensor(cond, device=xgrad_device).where(a, b),
        lambda a, b: torch.where(torch.tensor(cond), a, b),
        rand((3,)),
        rand((3,)),
    )


# ---- reductions ----
REDUCE: list[tuple[str, Fn, Fn]] = [
    ("sum", lambda x, ax, kd: x.sum(ax, keepdim=kd), lambda x, ax, kd: x.sum(ax, keepdim=kd) if ax != () else x.sum()),
    ("max", lambda x, ax, kd: x.max(ax, keepdim=kd), lambda x, ax, kd: x.amax(ax, keepdim=kd)),
    ("min", lambda x, ax, kd: x.min(ax, keepdim=kd), lambda x, ax, kd: x.amin(ax, keepdim=kd)),
    ("mean", lambda x, ax, kd: x.mean(ax, keepdim=kd), lambda x, ax, kd: x.mean(ax, keepdim=kd)),
]


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 2)], ids=str)
@pytest.mark.parametrize("name,fn,torch_fn", REDUCE, ids=[r[0] for r in REDUCE])
def test_reduce_grad_matches_torch_over_axes(
    xgrad_device: str, name: str, fn: Fn, torch_fn: Fn, axis: int | tuple[int, ...] | None, keepdim: bool
) -> None:
    def torch_reduce(x: torch.Tensor) -> Any:
        dims = tuple(range(x.ndim)) if axis is None else axis
        return torch_fn(x, dims, keepdim)

    check(xgrad_device, lambda x: fn(x, axis, keepdim), torch_reduce, rand((2, 3, 4)))


@pytest.mark.parametrize("name,fn,torch_fn", REDUCE, ids=[r[0] for r in REDUCE])
def test_reduce_grad_matches_torch_for_0d_input(xgrad_device: str, name: str, fn: Fn, torch_fn: Fn) -> None:
    check(
        xgrad_device,
        lambda x: fn(x, None, False),
        lambda x: torch_fn(x, (), False) if name != "sum" else x.sum(),
        rand(()),
    )


def test_max_grad_splits_ties_like_torch_amax(xgrad_device: str) -> None:
    data = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]], dtype=np.float32)
    check(xgrad_device, lambda x: x.max(1), lambda x: x.amax(1), data)
    check(xgrad_device, lambda x: x.max(0, keepdim=True), lambda x: x.amax(0, keepdim=True), data)


def test_full_max_and_min_grad_split_ties_like_torch(xgrad_device: str) -> None:
    data = np.array([[1.0, 3.0, 3.0], [-2.0, 0.0, -2.0]], dtype=np.float32)
    check(xgrad_device, lambda x: x.max(), lambda x: x.max(), data)
    check(xgrad_device, lambda x: x.min(), lambda x: x.min(), data)


def test_maximum_grad_halves_ties_like_torch(xgrad_device: str) -> None:
    a = np.array([1.0, 2.0, 3.0, -1.0], dtype=np.float32)
    b = np.array([1.0, 1.0, 3.0, 0.0], dtype=np.float32)
    check(xgrad_device, lambda x, y: x.maximum(y), torch.maximum, a, b)
    check(xgrad_device, lambda x, y: x.minimum(y), torch.minimum, a, b)


@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax_grad_matches_torch(xgrad_device: str, axis: int) -> None:
    check(xgrad_device, lambda x: x.softmax(axis), lambda x: torch.softmax(x, axis), rand((3, 5)))


MATMUL_SHAPES = [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((2, 3, 4), (4, 2)), ((2, 3, 4), (2, 4, 5))]


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
def test_matmul_grad_matches_torch(xgrad_device: str, shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    check(xgrad_device, lambda a, b: a @ b, torch.matmul, rand(shapes[0]), rand(shapes[1]))


# ---- movement ----
MOVEMENT: list[tuple[str, Fn, Fn | None, tuple[int, ...]]] = [
    ("reshape", lambda x: x.reshape(6, 4), None, (2, 3, 4)),
    ("reshape_0d", lambda x: x.reshape(1, 1), None, ()),
    ("permute", lambda x: x.permute(2, 0, 1), None, (2, 3, 4)),
    ("expand", lambda x: x.expand(2, 3, 4), None, (3, 1)),
    ("expand_0d", lambda x: x.reshape(1, 1).expand(2, 3), None, ()),
    ("pad", lambda x: x.pad(((1, 2), (0, 1))), lambda x: torch.nn.functional.pad(x, (0, 1, 1, 2)), (2, 3)),
    (
        "pad_value_negative",
        lambda x: x.pad((1, -1, -1, 2), value=1.5),
        lambda x: torch.nn.functional.pad(x, (1, -1, -1, 2), value=1.5),
        (3, 4),
    ),
    ("shrink", lambda x: x.shrink(((1, 3), None, (0, 2))), lambda x: x[1:3, :, 0:2], (4, 3, 4)),
    ("flip", lambda x: x.flip(0, 2), lambda x: x.flip((0, 2)), (2, 3, 4)),
    ("transpose", lambda x: x.transpose(0, 2), None, (2, 3, 4)),
    ("T", lambda x: x.T, lambda x: x.T, (2, 3)),
    ("flatten", lambda x: x.flatten(1), None, (2, 3, 4)),
    ("squeeze", lambda x: x.squeeze(1), None, (2, 1, 4)),
    ("squeeze_all", lambda x: x.squeeze(), None, (2, 1, 4, 1)),
    ("unsqueeze", lambda x: x.unsqueeze(-1), None, (2, 3)),
    ("chain", lambda x: x.permute(1, 0).reshape(2, 6).flip(0).pad(((1, 0), (0, 0))).expand(2, 3, 6), None, (4, 3)),
]


@pytest.mark.parametrize("name,fn,torch_fn,shape", MOVEMENT, ids=[m[0] for m in MOVEMENT])
def test_movement_grad_matches_torch(
    xgrad_device: str, name: str, fn: Fn, torch_fn: Fn | None, shape: tuple[int, ...]
) -> None:
    if name.startswith("expand") and name != "expand_0d":
        torch_fn = lambda x: x.expand(2, 3, 4)  # noqa: E731
    if name == "chain":
        torch_fn = lambda x: torch.nn.functional.pad(x.permute(1, 0).reshape(2, 6).flip(0), (0, 0, 1, 0)).expand(  # noqa: E731
            2, 3, 6
        )
    check(xgrad_device, fn, torch_fn, rand(shape))


# ---- casts and structure ----
def skip_unless_device_computes(device: str, dtype: DType) -> None:
    try:
        (Tensor([1.0], device=device, dtype=dtype) + 1).numpy()
    except DTypeError as e:
        pytest.skip(f"{device} cannot compute in {dtype.name}: {e}")


def test_cast_grad_is_cast_back_to_the_source_dtype(xgrad_device: str) -> None:
    skip_unless_device_computes(xgrad_device, dtypes.float64)
    check(xgrad_device, lambda x: (x.cast(dtypes.float64) * 3).exp(), lambda x: (x * 3).exp(), rand((2, 3)))


def test_cast_from_float64_grad_is_float64(xgrad_device: str) -> None:
    skip_unless_device_computes(xgrad_device, dtypes.float64)
    x = Tensor(rand((4,)).astype(np.float64), device=xgrad_device)
    (g,) = (x.float() * 2).sum().gradient(x)
    assert g.dtype == dtypes.float64
    np.testing.assert_allclose(g.numpy(), np.full(4, 2.0))


def test_cast_through_int_gives_zero_grad(xgrad_device: str) -> None:
    x = Tensor([1.5, 2.5], device=xgrad_device)
    (g,) = (x.int().float() * x).sum().gradient(x)
    np.testing.assert_allclose(g.numpy(), [1.0, 2.0])


def test_half_grad_matches_torch(xgrad_device: str) -> None:
    skip_unless_device_computes(xgrad_device, dtypes.float16)
    data = rand((3, 4))
    x = Tensor(data, device=xgrad_device, dtype=dtypes.float16)
    (g,) = (x * x).sum().gradient(x)
    assert g.dtype == dtypes.float16
    np.testing.assert_allclose(g.numpy(), 2 * data.astype(np.float16), atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("method", ["contiguous", "contiguous_backward"])
def test_identity_grad_passes_through(xgrad_device: str, method: str) -> None:
    check(xgrad_device, lambda x: getattr(x * 2, method)().sin(), lambda x: (x * 2).sin(), rand((2, 3)))


def test_contiguous_backward_builds_contiguous_in_the_gradient(xgrad_device: str) -> None:
    x = Tensor(rand((3,)), device=xgrad_device)
    (g,) = (x.contiguous_backward() * 2).sum().gradient(x)
    assert any(u.op is Ops.CONTIGUOUS for u in g.uop.toposort)
    np.testing.assert_allclose(g.numpy(), [2.0, 2.0, 2.0])


def test_detach_stops_the_gradient(xgrad_device: str) -> None:
    check(xgrad_device, lambda x: x.detach() * x, lambda x: x.detach() * x, rand((4,)))
    x = Tensor(rand((4,)), device=xgrad_device)
    (g,) = (x.detach() * 3).sum().gradient(x)
    np.testing.assert_array_equal(g.numpy(), np.zeros(4))


def test_copy_grad_comes_back_to_the_source_device(xgrad_device: str) -> None:
    others = [d for d in Device.get_available_devices(runs_kernels_only=True) if d != xgrad_device]
    if not others:
        pytest.skip("needs a second device that runs kernels")
    data = rand((3,))
    x = Tensor(data, device=xgrad_device)
    (g,) = (x.to(others[0]) * x.to(others[0])).sum().gradient(x)
    assert g.device == xgrad_device
    np.testing.assert_allclose(g.numpy(), 2 * data, rtol=1e-6)


# ---- graph structure ----
def test_grad_sums_over_a_value_used_twice(xgrad_device: str) -> None:
    check(xgrad_device, lambda x: x * x + x.sin() * x, None, rand((3,)))
    check(xgrad_device, lambda x: (x + 1) * (x + 1), None, rand((2, 2)))


def test_grad_of_intermediate_target_matches_torch(xgrad_device: str) -> None:
    data = rand((3,))
    x = Tensor(data, device=xgrad_device)
    h = x.exp()
    dh, dx = (h * h).sum().gradient(h, x)
    np.testing.assert_allclose(dh.numpy(), 2 * np.exp(data), rtol=1e-5)
    np.testing.assert_allclose(dx.numpy(), 2 * np.exp(2 * data), rtol=1e-5)


def test_grad_of_unused_target_is_zeros(xgrad_device: str) -> None:
    x = Tensor(rand((2, 3)), device=xgrad_device)
    y = Tensor(rand((4,)), device=xgrad_device)
    (gy,) = x.sum().gradient(y)
    assert gy.shape == (4,)
    np.testing.assert_array_equal(gy.numpy(), np.zeros(4))


def test_grad_of_root_itself_is_the_upstream_gradient(xgrad_device: str) -> None:
    x = Tensor(rand((3,)), device=xgrad_device)
    y = x * 2
    (gy,) = y.gradient(y, gradient=Tensor([1.0, 2.0, 3.0], device=xgrad_device))
    np.testing.assert_array_equal(gy.numpy(), [1.0, 2.0, 3.0])


def test_gradient_is_pure_and_leaves_grad_unset(xgrad_device: str) -> None:
    x = Tensor(rand((3,)), device=xgrad_device)
    before = x.uop
    (x * x).sum().gradient(x)
    assert x.grad is None
    assert x.uop is before


def test_compute_gradient_returns_only_reached_targets(xgrad_device: str) -> None:
    a = Tensor(rand((3,)), device=xgrad_device)
    b = Tensor(rand((3,)), device=xgrad_device)
    c = Tensor(rand((3,)), device=xgrad_device)
    root = ((a * b).sum() + (c > 0).where(1.0, 0.0).sum()).uop
    grads = compute_gradient(root, UOp.const(root.dtype, 1.0, xgrad_device, ()), {a.uop, c.uop})
    assert set(grads) == {a.uop}
    assert b.uop not in grads


# ---- backward ----
def test_backward_stores_grad_and_returns_self(xgrad_device: str) -> None:
    data = rand((2, 3))
    x = Tensor(data, device=xgrad_device)
    loss = (x * x).sum()
    assert loss.backward() is loss
    assert x.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), 2 * data, rtol=1e-6)


def test_backward_accumulates_over_two_calls(xgrad_device: str) -> None:
    data = rand((3,))
    x = Tensor(data, device=xgrad_device)
    x.is_param_()
    (x * x).sum().backward()
    first = x.grad
    (x * 3).sum().backward()
    assert x.grad is first and x.grad is not None
    assert x.grad.uop.op is Ops.ASSIGN  # accumulation is an assign into the realized first gradient
    np.testing.assert_allclose(x.grad.numpy(), 2 * data + 3, rtol=1e-6)


def test_backward_with_explicit_gradient_for_non_scalar_root(xgrad_device: str) -> None:
    data = rand((3,))
    x = Tensor(data, device=xgrad_device)
    x.exp().backward(Tensor([1.0, 0.0, 2.0], device=xgrad_device))
    assert x.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), np.exp(data) * [1.0, 0.0, 2.0], rtol=1e-5)


def test_backward_skips_non_float_and_detached_tensors(xgrad_device: str) -> None:
    x = Tensor(rand((3,)), device=xgrad_device)
    i = Tensor([1, 2, 3], device=xgrad_device)
    d = Tensor(rand((3,)), device=xgrad_device)
    (x * i + d.detach()).sum().backward()
    assert x.grad is not None and i.grad is None and d.grad is None


def test_backward_skips_0d_constants_unless_requires_grad(xgrad_device: str) -> None:
    # as tinygrad: a bare constant is skipped (is_param, True for every tensor, does not change that)
    x = Tensor(rand((3,)), device=xgrad_device)
    c = Tensor(2.0, device=xgrad_device)
    p = Tensor(3.0, device=xgrad_device).is_param_()
    q = Tensor(4.0, device=xgrad_device, requires_grad=True)
    (x * c + x * p + x * q).sum().backward()
    assert c.grad is None and p.grad is None
    assert q.grad is not None
    np.testing.assert_allclose(q.grad.numpy(), x.numpy().sum(), rtol=1e-6)


def test_requires_grad_false_keeps_a_tensor_out_of_backward(xgrad_device: str) -> None:
    # tinygrad's and torch's flag: a frozen input gets no gradient, the others are as torch computes them
    a, b = rand((3, 4)), rand((4,))
    x = Tensor(a, device=xgrad_device, requires_grad=False)
    w = Tensor(b, device=xgrad_device, requires_grad=True)
    frozen = Tensor(b, device=xgrad_device).requires_grad_(False)
    (x * w * frozen).sum().backward()
    assert x.grad is None and frozen.grad is None
    tx, tw = torch.tensor(a), torch.tensor(b, requires_grad=True)
    (tx * tw * torch.tensor(b)).sum().backward()
    assert w.grad is not None and tw.grad is not None
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-5)


def test_requires_grad_true_gives_a_0d_constant_a_gradient(xgrad_device: str) -> None:
    x = Tensor(rand((3,)), device=xgrad_device)
    c = Tensor(2.0, device=xgrad_device, requires_grad=True)
    (x * c).sum().backward()
    assert c.grad is not None
    np.testing.assert_allclose(c.grad.numpy(), x.numpy().sum(), rtol=1e-6)


def test_a_frozen_input_no_longer_accumulates_a_gradient_each_step() -> None:
    # without the flag, every backward adds into the input's grad (an assign realized at the next backward)
    x = Tensor(rand((4, 3)), requires_grad=False)
    w = Tensor(rand((3,))).is_param_()
    for _ in range(2):
        w.grad = None
        (x @ w).sum().backward()
    assert x.grad is None and w.grad is not None
    np.testing.assert_allclose(w.grad.numpy(), x.numpy().sum(0), rtol=1e-5)


@pytest.mark.parametrize(
    "make",
    [
        lambda rg: Tensor([1.0, 2.0], requires_grad=rg),
        lambda rg: Tensor.empty(2, requires_grad=rg),
        lambda rg: Tensor.zeros(2, 3, requires_grad=rg),
        lambda rg: Tensor.ones(2, requires_grad=rg),
        lambda rg: Tensor.full((2,), 3.0, requires_grad=rg),
        lambda rg: Tensor.arange(4.0, requires_grad=rg),
        lambda rg: Tensor.arange(1.0, 4.0, 0.5, requires_grad=rg),
        lambda rg: Tensor.linspace(0, 1, 5, requires_grad=rg),
        lambda rg: Tensor.eye(3, requires_grad=rg),
        lambda rg: Tensor.rand(2, requires_grad=rg),
        lambda rg: Tensor.randn(2, requires_grad=rg),
        lambda rg: Tensor.normal(2, mean=1.0, requires_grad=rg),
        lambda rg: Tensor.uniform(2, low=-1.0, requires_grad=rg),
        lambda rg: Tensor.scaled_uniform(2, 2, requires_grad=rg),
        lambda rg: Tensor.glorot_uniform(2, 2, requires_grad=rg),
        lambda rg: Tensor.kaiming_uniform(2, 2, requires_grad=rg),
        lambda rg: Tensor.kaiming_normal(2, 2, requires_grad=rg),
        lambda rg: Tensor([1.0]).zeros_like(requires_grad=rg),
        lambda rg: Tensor([1.0]).ones_like(requires_grad=rg),
        lambda rg: Tensor([1.0]).full_like(2.0, requires_grad=rg),
        lambda rg: Tensor([1.0]).empty_like(requires_grad=rg),
        lambda rg: Tensor([1.0]).rand_like(requires_grad=rg),
        lambda rg: Tensor([1.0]).randn_like(requires_grad=rg),
    ],
)
@pytest.mark.parametrize("flag", [True, False])
def test_creation_methods_take_requires_grad(make: Callable[[bool], Tensor], flag: bool) -> None:
    t = make(flag)
    assert t.requires_grad is flag
    out = (t * 2).sum()
    assert out.requires_grad is None  # results of ops leave it unset
    out.backward()
    assert (t.grad is not None) is flag


def test_requires_grad_defaults_to_none() -> None:
    t = Tensor([1.0])
    assert t.requires_grad is None
    assert t.requires_grad_() is t and t.requires_grad is True


def test_like_methods_refuse_an_unknown_keyword() -> None:
    with pytest.raises(TypeError, match="colour"):
        Tensor([1.0]).zeros_like(colour="red")


def mlp_backward_against_torch(device: str, with_bias: bool) -> None:
    inputs = rand((8, 4))
    onehot = np.eye(3, dtype=np.float32)[rng.integers(0, 3, size=8)]
    params = {"w1": rand((4, 16), -0.5, 0.5), "w2": rand((16, 3), -0.5, 0.5)}
    if with_bias:
        params |= {"b1": rand((16,), -0.1, 0.1), "b2": rand((3,), -0.1, 0.1)}

    def loss_fn(x: Any, y: Any, p: dict[str, Any], log_softmax: Fn) -> Any:
        h = x @ p["w1"] + p["b1"] if with_bias else x @ p["w1"]
        logits = h.relu() @ p["w2"] + p["b2"] if with_bias else h.relu() @ p["w2"]
        per_sample = (log_softmax(logits) * y).sum(1)
        # contiguous: codegen cannot yet fuse the softmax reductions into the batch mean (linearize gets stuck)
        return -(per_sample.contiguous() if isinstance(per_sample, Tensor) else per_sample).mean()

    ps = {k: Tensor(v, device=device).is_param_() for k, v in params.items()}
    x, y = Tensor(inputs, device=device), Tensor(onehot, device=device)
    loss = loss_fn(x, y, ps, lambda z: z.softmax(1).log())
    loss.backward()

    tp = {k: torch.tensor(v.astype(np.float64), requires_grad=True) for k, v in params.items()}
    tx, ty = torch.tensor(inputs, dtype=torch.float64), torch.tensor(onehot, dtype=torch.float64)
    tloss = loss_fn(tx, ty, tp, lambda z: torch.log_softmax(z, 1))
    tloss.backward()
    np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-5)
    for k, p in ps.items():
        tgrad = tp[k].grad
        assert p.grad is not None and tgrad is not None, k
        np.testing.assert_allclose(p.grad.numpy(), tgrad.numpy(), atol=1e-5, rtol=1e-4, err_msg=k)


def test_tiny_mlp_backward_matches_torch(xgrad_device: str) -> None:
    mlp_backward_against_torch(xgrad_device, with_bias=False)


def test_tiny_mlp_with_bias_backward_matches_torch(xgrad_device: str) -> None:
    mlp_backward_against_torch(xgrad_device, with_bias=True)


# ---- errors ----
def test_gradient_raises_for_non_scalar_root_without_gradient(xgrad_device: str) -> None:
    x = Tensor(rand((2, 3)), device=xgrad_device)
    with pytest.raises(ShapeError, match=r"\(2, 3\)"):
        (x * 2).gradient(x)
    with pytest.raises(ShapeError, match=r"\(2, 3\)"):
        (x * 2).backward()


def test_gradient_raises_for_gradient_of_wrong_shape(xgrad_device: str) -> None:
    x = Tensor(rand((2, 3)), device=xgrad_device)
    with pytest.raises(ShapeError, match=r"\(3,\).*\(2, 3\)"):
        (x * 2).gradient(x, gradient=Tensor([1.0, 2.0, 3.0], device=xgrad_device))


def test_gradient_raises_for_int_tensors(xgrad_device: str) -> None:
    i = Tensor([1, 2, 3], device=xgrad_device)
    x = Tensor([1.0, 2.0, 3.0], device=xgrad_device)
    with pytest.raises(DTypeError, match="int32"):
        (i * 2).sum().gradient(i)
    with pytest.raises(DTypeError, match="int32"):
        (x * i).sum().gradient(i)
    with pytest.raises(DTypeError, match="int32"):
        i.sum().backward()


# ---- docstrings ----
@pytest.mark.parametrize("name", ["gradient", "backward", "contiguous_backward", "is_param_"])
def test_docstring_example_runs_for_method(name: str) -> None:
    run_docstring(name)


def test_reading_values_keeps_the_graph_for_gradients() -> None:
    x = Tensor([1.0, 2.0]).is_param_()
    y = (x * x).sum()
    assert y.item() == 5.0  # reading the value must not cut the graph
    (g,) = y.gradient(x)
    assert g.tolist() == [2.0, 4.0]
