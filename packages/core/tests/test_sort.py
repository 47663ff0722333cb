"""Sorting (`xgrad/mixin/sort.py`): sort, argsort and topk against torch (stable sort) on every available device,
with ties, NaN and infinities, every dtype, and the gradient of the sorted values."""

from __future__ import annotations

import doctest
from typing import Any

import numpy as np
import pytest
import torch

from xgrad.dtype import DType, dtypes, to_np_dtype
from xgrad.errors import IndexingError
from xgrad.tensor import Tensor
from xgrad.testing import skip_unsupported

rng = np.random.default_rng(0)


def check_sort(device: str, a: np.ndarray, dim: int = -1, descending: bool = False, dtype: Any = None) -> None:
    values, indices = Tensor(a, device=device, dtype=dtype).sort(dim, descending)
    want, want_idx = torch.sort(torch.tensor(a), dim=dim, descending=descending, stable=True)
    assert values.shape == tuple(want.shape) and indices.shape == tuple(want_idx.shape)
    assert indices.dtype == dtypes.default_int
    np.testing.assert_array_equal(indices.numpy(), want_idx.numpy())
    np.testing.assert_array_equal(values.numpy(), want.numpy())


# ---- sort ----
SHAPES_DIMS = [((8,), -1), ((3, 7), -1), ((3, 7), 0), ((2, 3, 5), 1), ((1,), 0), ((0,), 0), ((3, 0), 0)]


@pytest.mark.parametrize("shape_dim", SHAPES_DIMS, ids=str)
@pytest.mark.parametrize("descending", [False, True], ids=["asc", "desc"])
def test_sort_matches_torch_stable(xgrad_device: str, shape_dim: tuple[tuple[int, ...], int], descending: bool) -> None:
    shape, dim = shape_dim
    a = rng.integers(-3, 4, size=shape)  # few distinct values: many ties, which must keep their order
    np_dtype = np.int32 if SHAPES_DIMS.index(shape_dim) % 2 else np.float32
    check_sort(xgrad_device, a.astype(np_dtype), dim, descending)


@pytest.mark.parametrize("descending", [False, True], ids=["asc", "desc"])
def test_sort_places_nan_and_inf_like_torch(xgrad_device: str, descending: bool) -> None:
    a = np.array([1.0, np.nan, -np.inf, 0.0, np.inf, np.nan, -0.5, np.inf, -np.inf], dtype=np.float32)
    values, indices = Tensor(a, device=xgrad_device).sort(descending=descending)
    want, want_idx = torch.sort(torch.tensor(a), descending=descending, stable=True)
    np.testing.assert_array_equal(values.numpy(), want.numpy())
    np.testing.assert_array_equal(indices.numpy(), want_idx.numpy())


@pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.uint32, dtypes.int64, dtypes.float16, dtypes.float64], ids=str)
@pytest.mark.parametrize("descending", [False, True], ids=["asc", "desc"])
def test_sort_keeps_dtype_at_its_limits(xgrad_device: str, dtype: DType, descending: bool) -> None:
    skip_unsupported(xgrad_device, dtype)
    lo, hi = dtypes.min(dtype), dtypes.max(dtype)
    if dtypes.is_float(dtype):
        lo, hi = -float("inf"), float("inf")
    np_dt = to_np_dtype(dtype)
    a = np.array([3, hi, lo, 0, hi, 1, lo], dtype=np_dt)  # the padding value of the network appears in the data
    values, indices = Tensor(a, device=xgrad_device, dtype=dtype).sort(descending=descending)
    want, want_idx = torch.sort(torch.tensor(a.astype(np.float64)), descending=descending, stable=True)
    assert values.dtype == dtype
    np.testing.assert_array_equal(values.numpy().astype(np.float64), want.numpy())
    np.testing.assert_array_equal(indices.numpy(), want_idx.numpy())


def test_sort_bool_puts_false_first(xgrad_device: str) -> None:
    a = np.array([True, False, True, False, False])
    check_sort(xgrad_device, a)
    check_sort(xgrad_device, a, descending=True)


def test_sort_0d_returns_itself_and_index_zero(xgrad_device: str) -> None:
    values, indices = Tensor(2.5, device=xgrad_device).sort()
    assert values.item() == 2.5 and indices.item() == 0 and indices.shape == ()


@pytest.mark.parametrize("descending", [False, True], ids=["asc", "desc"])
def test_sort_values_gradient_matches_torch(xgrad_device: str, descending: bool) -> None:
    a = rng.permutation(12).reshape(3, 4).astype(np.float32)  # distinct values: the gradient is well defined
    x = Tensor(a, device=xgrad_device)
    upstream = rng.uniform(-1, 1, size=(3, 4)).astype(np.float32)
    values = x.sort(0, descending)[0]
    (grad,) = values.gradient(x, gradient=Tensor(upstream, device=xgrad_device))
    t = torch.tensor(a, requires_grad=True)
    torch.sort(t, 0, descending)[0].backward(torch.tensor(upstream))
    assert t.grad is not None
    np.testing.assert_allclose(grad.numpy(), t.grad.numpy())


def test_sort_bad_dim_raises_indexing_error() -> None:
    with pytest.raises(IndexingError, match="axis 2"):
        Tensor([[1, 2]]).sort(2)


# ---- argsort / topk ----
def test_argsort_matches_torch_stable(xgrad_device: str) -> None:
    a = rng.integers(0, 3, size=(2, 6)).astype(np.int32)
    for descending in (False, True):
        got = Tensor(a, device=xgrad_device).argsort(descending=descending).numpy()
        np.testing.assert_array_equal(got, torch.argsort(torch.tensor(a), descending=descending, stable=True).numpy())


@pytest.mark.parametrize("k_dim", [(1, -1), (3, -1), (6, -1), (0, -1), (2, 0)], ids=str)
@pytest.mark.parametrize("largest", [True, False], ids=["largest", "smallest"])
def test_topk_matches_torch(xgrad_device: str, k_dim: tuple[int, int], largest: bool) -> None:
    k, dim = k_dim
    a = rng.permutation(24).reshape(4, 6).astype(np.float32)  # distinct values: torch.topk's order is defined
    values, indices = Tensor(a, device=xgrad_device).topk(k, dim, largest)
    want, want_idx = torch.topk(torch.tensor(a), k, dim, largest)
    np.testing.assert_array_equal(values.numpy(), want.numpy())
    np.testing.assert_array_equal(indices.numpy(), want_idx.numpy())


def test_topk_values_gradient_matches_torch(xgrad_device: str) -> None:
    a = rng.permutation(10).reshape(2, 5).astype(np.float32)
    x = Tensor(a, device=xgrad_device)
    (grad,) = x.topk(2)[0].sum().gradient(x)
    t = torch.tensor(a, requires_grad=True)
    torch.topk(t, 2)[0].sum().backward()
    assert t.grad is not None
    np.testing.assert_array_equal(grad.numpy(), t.grad.numpy())


def test_topk_k_out_of_range_raises_indexing_error() -> None:
    with pytest.raises(IndexingError, match="k=4"):
        Tensor([1.0, 2.0, 3.0]).topk(4)


# ---- docstrings ----
@pytest.mark.parametrize("name", ["sort", "argsort", "topk"])
def test_docstring_example_runs_for_method(name: str) -> None:
    runner = doctest.DocTestRunner()
    for test in doctest.DocTestFinder().find(getattr(Tensor, name), name, globs={"Tensor": Tensor}):
        runner.run(test)
    assert runner.failures == 0 and runner.tries > 0
