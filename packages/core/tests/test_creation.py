"""Creation (`xgrad.mixin.creation`): eye, linspace, full/zeros/ones/empty and the *_like forms against torch, on every
available device (fixture `xgrad_device`), forward and, where a tensor flows through, backward."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from xgrad.dtype import DType, dtypes
from xgrad.errors import DTypeError, ShapeError
from xgrad.tensor import Tensor
from xgrad.testing import skip_unsupported

TORCH_DTYPES: dict[DType, torch.dtype] = {
    dtypes.bool: torch.bool,
    dtypes.int8: torch.int8,
    dtypes.uint8: torch.uint8,
    dtypes.int16: torch.int16,
    dtypes.int32: torch.int32,
    dtypes.int64: torch.int64,
    dtypes.float16: torch.float16,
    dtypes.bfloat16: torch.bfloat16,
    dtypes.float32: torch.float32,
    dtypes.float64: torch.float64,
}
TOL = {dtypes.float16: 1e-3, dtypes.bfloat16: 1e-2}
SHAPES = [(), (0,), (3,), (2, 0, 3), (2, 3)]


def assert_like_torch(got: Tensor, want: torch.Tensor, dtype: DType) -> None:
    assert got.dtype == dtype, f"dtype {got.dtype} != {dtype}"
    assert got.shape == tuple(want.shape), f"shape {got.shape} != torch {tuple(want.shape)}"
    tol = TOL.get(dtype, 1e-6)
    np.testing.assert_allclose(got.numpy().astype(np.float64), want.double().numpy(), rtol=tol, atol=tol)


# ---- eye ----
@pytest.mark.parametrize("n,m", [(0, None), (1, None), (3, None), (2, 4), (4, 2), (3, 0)])
def test_eye_matches_torch_for_sizes(xgrad_device: str, n: int, m: int | None) -> None:
    got = Tensor.eye(n, m, device=xgrad_device)
    want = torch.eye(n, m if m is not None else n)
    assert_like_torch(got, want, dtypes.float32)
    assert got.device == xgrad_device


@pytest.mark.parametrize("dtype", [dtypes.bool, dtypes.int32, dtypes.int64, dtypes.float16, dtypes.float64])
def test_eye_matches_torch_for_dtype(xgrad_device: str, dtype: DType) -> None:
    skip_unsupported(xgrad_device, dtype)
    assert_like_torch(
        Tensor.eye(3, 2, device=xgrad_device, dtype=dtype), torch.eye(3, 2, dtype=TORCH_DTYPES[dtype]), dtype
    )


def test_eye_raises_for_negative_size(xgrad_device: str) -> None:
    with pytest.raises(ShapeError, match="-1"):
        Tensor.eye(-1, device=xgrad_device)


def test_eye_gradient_masks_the_diagonal(xgrad_device: str) -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    x = Tensor(a, device=xgrad_device)
    out = x * Tensor.eye(3, 4, device=xgrad_device) * 2
    t = torch.tensor(a, requires_grad=True)
    want = t * torch.eye(3, 4) * 2
    (g,) = out.sum().gradient(x)  # before reading out (that realizes it)
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=1e-6)
    (wg,) = torch.autograd.grad(want.sum(), [t])
    np.testing.assert_allclose(g.numpy(), wg.numpy(), rtol=1e-6)


# ---- linspace ----
LINSPACE_CASES = [(0, 1, 5), (-3, 7.5, 7), (2, 5, 1), (2, 5, 0), (5, -5, 4), (0.1, 0.7, 2), (1e3, 1e3 + 1, 6)]


@pytest.mark.parametrize("start,stop,steps", LINSPACE_CASES)
def test_linspace_matches_torch_for_range(xgrad_device: str, start: float, stop: float, steps: int) -> None:
    got = Tensor.linspace(start, stop, steps, device=xgrad_device)
    assert_like_torch(got, torch.linspace(start, stop, steps), dtypes.float32)


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16, dtypes.float64, dtypes.int32, dtypes.int64])
def test_linspace_matches_torch_for_dtype(xgrad_device: str, dtype: DType) -> None:
    skip_unsupported(xgrad_device, dtype)
    got = Tensor.linspace(-4, 10, 8, device=xgrad_device, dtype=dtype)
    assert_like_torch(got, torch.linspace(-4, 10, 8, dtype=TORCH_DTYPES[dtype]), dtype)


def test_linspace_ends_are_exact_for_float32(xgrad_device: str) -> None:
    got = Tensor.linspace(0.1, 0.7, 11, device=xgrad_device).numpy()
    assert got[0] == np.float32(0.1) and got[-1] == np.float32(0.7)


def test_linspace_raises_for_bad_arguments(xgrad_device: str) -> None:
    with pytest.raises(ShapeError, match="steps >= 0"):
        Tensor.linspace(0, 1, -1, device=xgrad_device)
    with pytest.raises(DTypeError, match="bool"):
        Tensor.linspace(0, 1, 3, device=xgrad_device, dtype=dtypes.bool)


def test_linspace_gradient_of_a_product(xgrad_device: str) -> None:
    x = Tensor([1.0, -2.0, 3.0, 0.5], device=xgrad_device)
    (g,) = (x * Tensor.linspace(-1, 2, 4, device=xgrad_device)).sum().gradient(x)
    t = torch.tensor([1.0, -2.0, 3.0, 0.5], requires_grad=True)
    (wg,) = torch.autograd.grad((t * torch.linspace(-1, 2, 4)).sum(), [t])
    np.testing.assert_allclose(g.numpy(), wg.numpy(), rtol=1e-6)


# ---- full / zeros / ones / empty ----
@pytest.mark.parametrize("shape", SHAPES)
def test_full_zeros_ones_match_torch_for_shape(xgrad_device: str, shape: tuple[int, ...]) -> None:
    assert_like_torch(Tensor.full(shape, 2.5, device=xgrad_device), torch.full(shape, 2.5), dtypes.float32)
    assert_like_torch(Tensor.full(shape, 7, device=xgrad_device), torch.full(shape, 7, dtype=torch.int32), dtypes.int32)
    assert_like_torch(Tensor.zeros(shape, device=xgrad_device), torch.zeros(shape), dtypes.float32)
    assert_like_torch(Tensor.ones(*shape, device=xgrad_device), torch.ones(shape), dtypes.float32)
    assert Tensor.empty(shape, device=xgrad_device).shape == shape


@pytest.mark.parametrize(
    "dtype", [dtypes.bool, dtypes.uint8, dtypes.int16, dtypes.int64, dtypes.float16, dtypes.float64]
)
def test_full_matches_torch_for_dtype(xgrad_device: str, dtype: DType) -> None:
    skip_unsupported(xgrad_device, dtype)
    value = True if dtype == dtypes.bool else 3
    got = Tensor.full((2, 3), value, device=xgrad_device, dtype=dtype)
    assert_like_torch(got, torch.full((2, 3), value, dtype=TORCH_DTYPES[dtype]), dtype)
    assert Tensor.empty(2, device=xgrad_device, dtype=dtype).dtype == dtype


def test_creation_raises_for_negative_shape(xgrad_device: str) -> None:
    for make in (lambda: Tensor.zeros(2, -1), lambda: Tensor.full((-3,), 1), lambda: Tensor.empty(-2)):
        with pytest.raises(ShapeError, match="negative dimension"):
            make()


# ---- *_like ----
LIKE: list[tuple[str, Any, Any]] = [
    ("zeros_like", lambda x, **kw: x.zeros_like(**kw), lambda t, **kw: torch.zeros_like(t, **kw)),
    ("ones_like", lambda x, **kw: x.ones_like(**kw), lambda t, **kw: torch.ones_like(t, **kw)),
    ("full_like", lambda x, **kw: x.full_like(4, **kw), lambda t, **kw: torch.full_like(t, 4, **kw)),
    ("const_like", lambda x, **kw: x.const_like(-2, **kw), lambda t, **kw: torch.full_like(t, -2, **kw)),
]


@pytest.mark.parametrize("name,fn,torch_fn", LIKE, ids=[c[0] for c in LIKE])
@pytest.mark.parametrize("shape", SHAPES)
def test_like_matches_torch_for_shape(xgrad_device: str, name: str, fn: Any, torch_fn: Any, shape: Any) -> None:
    a = np.full(shape, 1.5, dtype=np.float32)
    got = fn(Tensor(a, device=xgrad_device))
    assert_like_torch(got, torch_fn(torch.tensor(a)), dtypes.float32)
    assert got.device == xgrad_device


@pytest.mark.parametrize("name,fn,torch_fn", LIKE, ids=[c[0] for c in LIKE])
@pytest.mark.parametrize("src,dst", [(dtypes.float32, dtypes.int32), (dtypes.int32, dtypes.float16)])
def test_like_keeps_or_overrides_dtype(
    xgrad_device: str, name: str, fn: Any, torch_fn: Any, src: Any, dst: Any
) -> None:
    skip_unsupported(xgrad_device, src, dst)
    x = Tensor.ones(2, 3, device=xgrad_device, dtype=src)
    t = torch.ones(2, 3, dtype=TORCH_DTYPES[src])
    assert_like_torch(fn(x), torch_fn(t), src)
    assert_like_torch(fn(x, dtype=dst), torch_fn(t, dtype=TORCH_DTYPES[dst]), dst)


def test_like_accepts_dtype_name(xgrad_device: str) -> None:
    x = Tensor([1.0, 2.0], device=xgrad_device)
    assert x.zeros_like(dtype="int16").dtype == dtypes.int16
    assert x.const_like(1, dtype="half").dtype == dtypes.float16


@pytest.mark.parametrize("shape", SHAPES)
def test_empty_like_has_shape_dtype_device(xgrad_device: str, shape: tuple[int, ...]) -> None:
    x = Tensor(np.zeros(shape, dtype=np.int32), device=xgrad_device)
    e = x.empty_like()
    assert (e.shape, e.dtype, e.device) == (shape, dtypes.int32, xgrad_device)
    assert x.empty_like(dtype=dtypes.float32).dtype == dtypes.float32
    assert e.realize().numpy().shape == shape


def test_empty_like_is_writable(xgrad_device: str) -> None:
    x = Tensor([1.0, 2.0, 3.0], device=xgrad_device)
    e = x.empty_like().assign(x * 2)
    assert e.tolist() == [2.0, 4.0, 6.0]
    assert Tensor.invalids(2, device=xgrad_device).assign(Tensor([5.0, 6.0], device=xgrad_device)).tolist() == [
        5.0,
        6.0,
    ]


def test_like_gradient_does_not_reach_the_source(xgrad_device: str) -> None:
    a = np.array([[1.0, -2.0], [0.5, 3.0]], dtype=np.float32)
    x = Tensor(a, device=xgrad_device)
    out = (x * x.full_like(3.0) + x.ones_like() + x.const_like(2.0)).sum()
    (g,) = out.gradient(x)
    t = torch.tensor(a, requires_grad=True)
    want = (t * torch.full_like(t, 3.0) + torch.ones_like(t) + torch.full_like(t, 2.0)).sum()
    (wg,) = torch.autograd.grad(want, [t])
    assert out.item() == pytest.approx(want.item())
    np.testing.assert_allclose(g.numpy(), wg.numpy())
    (g0,) = x.zeros_like().sum().gradient(x)
    assert g0.tolist() == [[0.0, 0.0], [0.0, 0.0]]


def test_clone_has_its_own_buffer_like_torch_clone(xgrad_device: str) -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = Tensor(a, device=xgrad_device).realize()
    t.grad = Tensor(a * 2, device=xgrad_device)
    c = t.clone()
    tt = torch.tensor(a)
    tc = tt.clone()
    t.assign(t + 10).realize()
    tt += 10
    np.testing.assert_array_equal(c.numpy(), tc.numpy())
    np.testing.assert_array_equal(t.numpy(), tt.numpy())
    assert c.grad is not None and c.grad is not t.grad
    np.testing.assert_array_equal(c.grad.numpy(), a * 2)
    lazy = (t * 2).clone()  # a graph: computed into the clone's own buffer
    np.testing.assert_array_equal(lazy.numpy(), (a + 10) * 2)


def test_clone_to_another_device() -> None:
    c = Tensor([1.0, 2.0], device="CPU").clone("CPU:1")
    assert c.device == "CPU:1" and c.tolist() == [1.0, 2.0]


def test_replace_swaps_the_graph_in_place_and_checks_the_shape() -> None:
    t = Tensor([1.0, 2.0])
    x = Tensor([3.0, 4.0]) * 2
    assert t.replace(x) is t and t.tolist() == [6.0, 8.0]
    with pytest.raises(ShapeError, match="same shape"):
        t.replace(Tensor([1.0, 2.0, 3.0]))
