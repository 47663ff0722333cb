"""matmul and dot agree on result dtypes (as in tinygrad): the inputs' common dtype, ints accumulated wider and cast
back (wrapping like numpy), or the `dtype` asked for."""

from __future__ import annotations

import numpy as np
import pytest

from xgrad.dtype import DType, dtypes, to_np_dtype
from xgrad.tensor import Tensor
from xgrad.testing import skip_unsupported

rng = np.random.default_rng(7)


@pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32], ids=lambda d: d.name)
def test_matmul_keeps_int_dtype_and_wraps_like_numpy(xgrad_device: str, dtype: DType) -> None:
    skip_unsupported(xgrad_device, dtype)
    np_dt = to_np_dtype(dtype)
    lo, hi = (0, 200) if dtype == dtypes.uint8 else (-120, 120)
    a = rng.integers(lo, hi, size=(3, 4)).astype(np_dt)
    b = rng.integers(lo, hi, size=(4, 2)).astype(np_dt)
    x, w = Tensor(a, device=xgrad_device), Tensor(b, device=xgrad_device)
    for out in (x.matmul(w), x @ w, x.dot(w)):
        assert out.dtype == dtype
        np.testing.assert_array_equal(out.numpy(), a @ b)  # numpy also wraps in the input dtype


def test_matmul_dtype_sets_accumulation_and_result(xgrad_device: str) -> None:
    skip_unsupported(xgrad_device, dtypes.int8)
    a = np.full((2, 3), 100, dtype=np.int8)
    x = Tensor(a, device=xgrad_device)
    out = x.matmul(x.T, dtype=dtypes.int32)
    assert out.dtype == dtypes.int32
    np.testing.assert_array_equal(out.numpy(), a.astype(np.int32) @ a.T.astype(np.int32))


def test_matmul_reverse_multiplies_from_the_left(xgrad_device: str) -> None:
    a, b = rng.standard_normal((3, 2)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    out = Tensor(a, device=xgrad_device).matmul(Tensor(b, device=xgrad_device), reverse=True)
    np.testing.assert_allclose(out.numpy(), b @ a, rtol=1e-5, atol=1e-6)


def test_matmul_of_mixed_dtypes_promotes(xgrad_device: str) -> None:
    skip_unsupported(xgrad_device, dtypes.int8)
    a, b = np.array([[1, 2]], dtype=np.int8), np.array([[0.5], [0.25]], dtype=np.float32)
    out = Tensor(a, device=xgrad_device).matmul(Tensor(b, device=xgrad_device))
    assert out.dtype == dtypes.float32
    np.testing.assert_allclose(out.numpy(), a.astype(np.float32) @ b)
