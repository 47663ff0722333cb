"""NaN through the max family, on every device, against numpy and torch: a NaN anywhere on a reduced axis makes max/min
NaN (wherever it sits), argmax/argmin point at the first NaN, maximum/minimum/relu/clamp and the activations built on
them keep NaN, and the gradients are torch's (finite data: ties and kinks; NaN data where torch defines one)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch_compare import check, seed_per_test  # noqa: F401 (seed_per_test: autouse fixture)

from xgrad.dtype import DType, dtypes
from xgrad.tensor import Tensor
from xgrad.testing import skip_unsupported

NAN, INF = np.nan, np.inf
# NaN first, in the middle, last; a row without NaN (ties, -inf); a row of NaNs and inf
X = [
    [NAN, 1.0, 2.0, 3.0, -1.0],
    [1.0, 2.0, NAN, 0.0, 5.0],
    [1.0, 2.0, 3.0, 4.0, NAN],
    [1.0, 5.0, -INF, 5.0, 2.0],
    [NAN, NAN, 1.0, INF, 0.0],
]
FLOATS = [dtypes.float32, dtypes.float16]
NP_FLOAT = {dtypes.float32: np.float32, dtypes.float16: np.float16}


def _x(device: str, dtype: DType, data: Any = X) -> tuple[Tensor, np.ndarray]:
    skip_unsupported(device, dtype)
    a = np.array(data, NP_FLOAT[dtype])
    return Tensor(a, device=device, dtype=dtype), a


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("axis", [0, 1, None])
def test_max_min_are_nan_wherever_the_nan_sits(xgrad_device: str, dtype: DType, axis: int | None) -> None:
    t, a = _x(xgrad_device, dtype)
    np.testing.assert_array_equal(t.max(axis).numpy(), a.max(axis))
    np.testing.assert_array_equal(t.min(axis).numpy(), a.min(axis))
    np.testing.assert_array_equal(t.T.max(axis).numpy(), a.T.max(axis))  # the NaN at other positions
    np.testing.assert_array_equal(t.max(axis, keepdim=True).numpy(), a.max(axis, keepdims=True))


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("axis", [0, 1, None])
def test_argmax_argmin_point_at_the_first_nan(xgrad_device: str, dtype: DType, axis: int | None) -> None:
    t, a = _x(xgrad_device, dtype)
    for data, arr in ((t, a), (t.T, a.T)):
        np.testing.assert_array_equal(data.argmax(axis).numpy(), np.argmax(arr, axis))
        np.testing.assert_array_equal(data.argmin(axis).numpy(), np.argmin(arr, axis))
        tt = torch.tensor(arr.astype(np.float32))
        want = tt.argmax() if axis is None else tt.argmax(axis, keepdim=True)
        np.testing.assert_array_equal(data.argmax(axis, keepdim=axis is not None).numpy(), want.numpy())


def test_argmax_of_a_long_axis_with_one_nan(xgrad_device: str) -> None:
    a = np.arange(1000, dtype=np.float32)
    for pos in (0, 517, 999):
        b = a.copy()
        b[pos] = NAN
        assert Tensor(b, device=xgrad_device).argmax().item() == pos
        assert Tensor(b, device=xgrad_device).argmin().item() == pos
        assert np.isnan(Tensor(b, device=xgrad_device).max().item())


V = [NAN, -2.0, -1.0, -0.0, 0.0, 0.5, 1.0, 3.0, 7.0, INF, -INF, NAN]
ELEMENTWISE: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "relu": (lambda x: x.relu(), torch.relu),
    "relu6": (lambda x: x.relu6(), torch.nn.functional.relu6),
    "hardtanh": (lambda x: x.hardtanh(), torch.nn.functional.hardtanh),
    "clamp": (lambda x: x.clamp(-1.0, 2.0), lambda x: x.clamp(-1.0, 2.0)),
    "clamp_min": (lambda x: x.clamp(min_=0.0), lambda x: x.clamp(min=0.0)),
    "clamp_max": (lambda x: x.clamp(max_=0.0), lambda x: x.clamp(max=0.0)),
    "maximum": (lambda x: x.maximum(0.0), lambda x: torch.maximum(x, torch.zeros_like(x))),
    "minimum": (lambda x: x.minimum(0.0), lambda x: torch.minimum(x, torch.zeros_like(x))),
    "rmaximum": (lambda x: Tensor.full(x.shape, 1.0, device=x.device).maximum(x), lambda x: x.clamp(min=1.0)),
    "leaky_relu": (lambda x: x.leaky_relu(), torch.nn.functional.leaky_relu),
    "hardsigmoid": (lambda x: x.hardsigmoid(), torch.nn.functional.hardsigmoid),
    "hardswish": (lambda x: x.hardswish(), torch.nn.functional.hardswish),
    "elu": (lambda x: x.elu(), torch.nn.functional.elu),
    "sign": (lambda x: x.sign(), lambda t: torch.from_numpy(np.sign(t.numpy()))),  # numpy's NaN; torch gives 0
}


@pytest.mark.parametrize("name", list(ELEMENTWISE))
def test_max_family_elementwise_keeps_nan(xgrad_device: str, name: str) -> None:
    fn, torch_fn = ELEMENTWISE[name]
    a = np.array(V, np.float32)
    if name == "hardswish":
        a = a[~np.isinf(a)]  # torch's hardswish(-inf) is -inf * 0 = NaN; xgrad's is 0
    got = fn(Tensor(a, device=xgrad_device)).numpy()
    want = torch_fn(torch.tensor(a)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, equal_nan=True)
    assert np.array_equal(np.isnan(got), np.isnan(want)), f"{name}: NaN at {np.isnan(got)}, torch {np.isnan(want)}"


def test_relu_and_maximum_keep_nan_in_float16(xgrad_device: str) -> None:
    t, a = _x(xgrad_device, dtypes.float16, [V])
    np.testing.assert_array_equal(t.relu().numpy(), np.where(np.isnan(a) | (a > 0), a, 0))
    np.testing.assert_array_equal(t.maximum(0.0).numpy(), np.maximum(a, np.float16(0)))


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "logsumexp"])
def test_softmax_family_rows_with_nan_are_nan(xgrad_device: str, name: str) -> None:
    a = np.array([[1.0, NAN, 2.0], [1.0, 2.0, 3.0], [NAN, 0.0, 0.0]], np.float32)
    got = getattr(Tensor(a, device=xgrad_device), name)(1).numpy()
    t = torch.tensor(a)
    want = t.logsumexp(1) if name == "logsumexp" else getattr(t, name)(1)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("name", ["cummax", "cummin"])
def test_cummax_cummin_with_nan_follow_torch(xgrad_device: str, name: str) -> None:
    a = np.array([[1.0, NAN, 2.0, NAN, 0.0], [NAN, 1.0, NAN, 3.0, 3.0], [2.0, 1.0, 3.0, 3.0, 0.0]], np.float32)
    values, indices = getattr(Tensor(a, device=xgrad_device), name)(1)
    want = getattr(torch.tensor(a), name)(1)
    np.testing.assert_array_equal(values.numpy(), want.values.numpy())
    np.testing.assert_array_equal(indices.numpy(), want.indices.numpy())


# ---- gradients, against torch ----
FINITE = np.array([[-1.0, 0.0, 2.0, 2.0], [3.0, -0.5, 3.0, 1.0], [0.0, 0.0, -2.0, 4.0]], np.float32)
WITH_NAN = np.array([[-1.0, NAN, 2.0, 2.0], [3.0, -0.5, 3.0, 1.0], [NAN, 0.0, -2.0, NAN]], np.float32)


@pytest.mark.parametrize("data", [FINITE, WITH_NAN], ids=["finite", "nan"])
def test_relu_gradient_matches_torch(xgrad_device: str, data: np.ndarray) -> None:
    check(xgrad_device, lambda x: x.relu(), torch.relu, data)


@pytest.mark.parametrize("data", [FINITE, WITH_NAN], ids=["finite", "nan"])
def test_maximum_minimum_gradients_match_torch(xgrad_device: str, data: np.ndarray) -> None:
    other = np.array([[0.0, 0.0, 2.0, NAN], [3.0, 1.0, -3.0, 1.0], [0.0, 5.0, -2.0, 4.0]], np.float32)
    check(xgrad_device, lambda x, y: x.maximum(y), torch.maximum, data, other)
    check(xgrad_device, lambda x, y: x.minimum(y), torch.minimum, data, other)


@pytest.mark.parametrize("data", [FINITE, WITH_NAN], ids=["finite", "nan"])
def test_full_max_min_gradients_match_torch(xgrad_device: str, data: np.ndarray) -> None:
    # torch's max() shares the gradient among the tied maxima, or among the NaNs
    check(xgrad_device, lambda x: x.max(), lambda t: t.max(), data)
    check(xgrad_device, lambda x: x.min(), lambda t: t.min(), data)


def test_max_over_an_axis_gradient_matches_torch_amax(xgrad_device: str) -> None:
    check(xgrad_device, lambda x: x.max(1), lambda t: t.amax(1), FINITE)
    check(xgrad_device, lambda x: x.min(0), lambda t: t.amin(0), FINITE)


def test_clamp_gradient_on_finite_data_matches_torch(xgrad_device: str) -> None:
    check(xgrad_device, lambda x: x.clamp(0.0, 2.0), lambda t: t.clamp(0.0, 2.0), FINITE)


CLAMPS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "clamp": (lambda x: x.clamp(0.0, 2.0), lambda t: t.clamp(0.0, 2.0)),
    "clamp_min": (lambda x: x.clamp(min_=0.0), lambda t: t.clamp(min=0.0)),
    "clamp_max": (lambda x: x.clamp(max_=2.0), lambda t: t.clamp(max=2.0)),
    "clip": (lambda x: x.clip(-1.0, 2.0), lambda t: t.clip(-1.0, 2.0)),
}  # not hardtanh/relu6: torch's gradient at NaN differs between its vectorised and scalar loops (float64 here)


@pytest.mark.parametrize("name", list(CLAMPS))
@pytest.mark.parametrize("data", [FINITE, WITH_NAN], ids=["finite", "nan"])
def test_clamp_family_gradient_matches_torch_also_at_nan(xgrad_device: str, name: str, data: np.ndarray) -> None:
    # torch's clamp: the gradient reaches x only where it lies inside the bounds, which a NaN never does (0, not 1)
    fn, torch_fn = CLAMPS[name]
    check(xgrad_device, fn, torch_fn, data)


def test_clamp_with_tensor_bounds_gives_their_gradients_as_torch(xgrad_device: str) -> None:
    lo = np.array([[0.0, 0.0, 3.0, 1.0], [NAN, 0.0, 0.0, 2.0], [-1.0, 1.0, -3.0, 0.0]], np.float32)
    hi = np.array([[2.0, 1.0, 4.0, 1.5], [4.0, NAN, 2.0, 2.5], [0.0, 2.0, -1.0, 5.0]], np.float32)
    check(xgrad_device, lambda x, a, b: x.clamp(a, b), lambda x, a, b: x.clamp(a, b), WITH_NAN, lo, hi)
