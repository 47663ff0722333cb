"""NaN and inf through comparisons, isnan/isinf, maximum/minimum and where, against numpy, on every device.

Shader languages let compilers assume floats are never NaN (WGSL does; lavapipe folded `x != x` to false), so a device
must still give IEEE answers here: NaN compares unequal to everything, and unordered."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from xgrad.dtype import dtypes
from xgrad.tensor import Tensor
from xgrad.testing import skip_unsupported

NAN, INF = np.nan, np.inf
A = [1.0, NAN, INF, -INF, NAN, 2.0, -0.0, NAN, 3.0, -INF]
B = [NAN, 1.0, INF, 0.0, NAN, 2.0, 0.0, -INF, INF, -INF]
FLOATS = [dtypes.float32, dtypes.float16]
NP_FLOAT = {dtypes.float32: np.float32, dtypes.float16: np.float16}

COMPARISONS: dict[str, Callable[[Any, Any], Any]] = {
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
}


def _pair(device: str, dtype: Any) -> tuple[Tensor, Tensor, np.ndarray, np.ndarray]:
    skip_unsupported(device, dtype)
    a, b = np.array(A, NP_FLOAT[dtype]), np.array(B, NP_FLOAT[dtype])
    return Tensor(a, device=device, dtype=dtype), Tensor(b, device=device, dtype=dtype), a, b


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("name", list(COMPARISONS))
def test_comparisons_follow_ieee_with_nan_and_inf(xgrad_device: str, dtype: Any, name: str) -> None:
    ta, tb, a, b = _pair(xgrad_device, dtype)
    fn = COMPARISONS[name]
    np.testing.assert_array_equal(fn(ta, tb).numpy(), fn(a, b))
    np.testing.assert_array_equal(fn(ta, 2.0).numpy(), fn(a, np.float32(2.0)))  # one side a constant


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_nan_is_unequal_to_itself(xgrad_device: str, dtype: Any) -> None:
    ta, _, a, _ = _pair(xgrad_device, dtype)
    np.testing.assert_array_equal((ta != ta).numpy(), a != a)  # noqa: PLR0124 (the point of the test)
    np.testing.assert_array_equal((ta == ta).numpy(), a == a)  # noqa: PLR0124


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_isnan_isinf_isfinite_match_numpy(xgrad_device: str, dtype: Any) -> None:
    ta, _, a, _ = _pair(xgrad_device, dtype)
    np.testing.assert_array_equal(ta.isnan().numpy(), np.isnan(a))
    np.testing.assert_array_equal(ta.isinf().numpy(), np.isinf(a))
    np.testing.assert_array_equal(ta.isfinite().numpy(), np.isfinite(a))


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_maximum_minimum_with_nan_and_inf(xgrad_device: str, dtype: Any) -> None:
    # a NaN in either operand propagates, as numpy.maximum and torch.maximum
    ta, tb, a, b = _pair(xgrad_device, dtype)
    np.testing.assert_array_equal(ta.maximum(tb).numpy(), np.maximum(a, b))
    np.testing.assert_array_equal(ta.minimum(tb).numpy(), np.minimum(a, b))
    np.testing.assert_array_equal(tb.maximum(ta).numpy(), np.maximum(b, a))
    np.testing.assert_array_equal(tb.minimum(ta).numpy(), np.minimum(b, a))


def test_max_and_min_reductions_with_inf(xgrad_device: str) -> None:
    x = np.array([[1.0, -INF, 3.0], [-INF, -INF, -INF], [INF, 0.0, -2.0]], np.float32)
    t = Tensor(x, device=xgrad_device)
    np.testing.assert_array_equal(t.max(1).numpy(), x.max(1))
    np.testing.assert_array_equal(t.min(1).numpy(), x.min(1))


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_where_passes_nan_and_inf_through(xgrad_device: str, dtype: Any) -> None:
    ta, tb, a, b = _pair(xgrad_device, dtype)
    np.testing.assert_array_equal(ta.isnan().where(tb, ta).numpy(), np.where(np.isnan(a), b, a))
    np.testing.assert_array_equal((ta < tb).where(ta, tb).numpy(), np.where(a < b, a, b))
