"""Low-precision floats (float16, bfloat16, the four fp8 formats) on every device, against ml_dtypes/numpy.

The oracle rounds exactly like the spec: compute in float32 from the stored values, round the result to the
target format once. xgrad stores bfloat16/fp8 as their bits and, where the device lacks them, computes in float32.
"""

from __future__ import annotations

import numpy as np
import pytest

from xgrad.dtype import dtypes
from xgrad.tensor import Tensor
from xgrad.testing import skip_unsupported

ml_dtypes = pytest.importorskip("ml_dtypes")

FORMATS = {
    dtypes.float16: np.float16,
    dtypes.bfloat16: ml_dtypes.bfloat16,
    dtypes.fp8e4m3: ml_dtypes.float8_e4m3fn,
    dtypes.fp8e5m2: ml_dtypes.float8_e5m2,
    dtypes.fp8e4m3fnuz: ml_dtypes.float8_e4m3fnuz,
    dtypes.fp8e5m2fnuz: ml_dtypes.float8_e5m2fnuz,
}
LOW = list(FORMATS)
rng = np.random.default_rng(3)


def stored(values: np.ndarray, dtype) -> np.ndarray:
    """What a tensor of `dtype` holds for `values`: rounded to the format (saturating, as xgrad converts)."""
    fmt = FORMATS[dtype]
    hi = float(ml_dtypes.finfo(fmt).max) if dtype != dtypes.float16 else 65504.0
    return np.clip(values, -hi, hi).astype(fmt).astype(np.float32)


def rounded(values: np.ndarray, dtype) -> np.ndarray:
    return stored(values.astype(np.float32), dtype)


def ulp_close(got: np.ndarray, want: np.ndarray, dtype, ulps: int = 1) -> None:
    """Equal within `ulps` steps of the format (exact for single rounding, 1 step for transcendentals)."""
    fmt = FORMATS[dtype]
    eps = float(ml_dtypes.finfo(fmt).eps) if dtype != dtypes.float16 else float(np.finfo(np.float16).eps)
    tiny = float(ml_dtypes.finfo(fmt).smallest_subnormal) if dtype != dtypes.float16 else 6e-8
    np.testing.assert_allclose(got, want, rtol=eps * ulps, atol=tiny * ulps)


@pytest.mark.parametrize("dtype", LOW, ids=[d.name for d in LOW])
def test_low_precision_round_trip_matches_ml_dtypes(xgrad_device, dtype):
    skip_unsupported(xgrad_device, dtype)  # float16 needs shader-f16 on WebGPU
    vals = rng.uniform(-8, 8, 64).astype(np.float32)
    t = Tensor(vals, device=xgrad_device, dtype=dtype)
    np.testing.assert_array_equal(t.numpy(), stored(vals, dtype))


@pytest.mark.parametrize("dtype", LOW, ids=[d.name for d in LOW])
@pytest.mark.parametrize("op", ["add", "mul", "sub", "div", "max"])
def test_low_precision_binary_rounds_once(xgrad_device, dtype, op):
    skip_unsupported(xgrad_device, dtype)  # float16 needs shader-f16 on WebGPU
    a = stored(rng.uniform(-4, 4, 48).astype(np.float32), dtype)
    b = stored(rng.uniform(0.5, 4, 48).astype(np.float32), dtype)
    fn = {"add": np.add, "mul": np.multiply, "sub": np.subtract, "div": np.divide, "max": np.maximum}[op]
    ta, tb = Tensor(a, device=xgrad_device, dtype=dtype), Tensor(b, device=xgrad_device, dtype=dtype)
    got = {"add": ta + tb, "mul": ta * tb, "sub": ta - tb, "div": ta / tb, "max": ta.maximum(tb)}[op]
    assert got.dtype == dtype
    ulp_close(got.numpy(), rounded(fn(a, b), dtype), dtype, ulps=1 if op != "div" else 2)


@pytest.mark.parametrize("dtype", LOW, ids=[d.name for d in LOW])
def test_low_precision_math_and_casts(xgrad_device, dtype):
    skip_unsupported(xgrad_device, dtype)  # float16 needs shader-f16 on WebGPU
    a = stored(rng.uniform(0.25, 3, 32).astype(np.float32), dtype)
    t = Tensor(a, device=xgrad_device, dtype=dtype)
    ulp_close(t.exp().numpy(), rounded(np.exp(a), dtype), dtype, ulps=2)
    ulp_close(t.sqrt().numpy(), rounded(np.sqrt(a), dtype), dtype, ulps=1)
    np.testing.assert_array_equal(t.cast(dtypes.float32).numpy(), a)
    np.testing.assert_array_equal(Tensor(a * 3, device=xgrad_device).cast(dtype).numpy(), rounded(a * 3, dtype))
    assert t.cast(dtypes.int32).tolist() == np.trunc(a).astype(np.int32).tolist()


@pytest.mark.parametrize("dtype", LOW, ids=[d.name for d in LOW])
def test_low_precision_sum_accumulates_in_float32(xgrad_device, dtype):
    skip_unsupported(xgrad_device, dtype)  # float16 needs shader-f16 on WebGPU
    a = stored(rng.uniform(0, 2, (16, 24)).astype(np.float32), dtype)
    got = Tensor(a, device=xgrad_device, dtype=dtype).sum(1)
    assert got.dtype == dtype
    ulp_close(got.numpy(), rounded(a.sum(1, dtype=np.float32), dtype), dtype, ulps=1)


def test_fp8_saturates_and_keeps_nan(xgrad_device):
    t = Tensor([1000.0, -1000.0, float("nan")], device=xgrad_device).cast(dtypes.fp8e4m3)
    out = t.numpy()
    assert out[0] == 448.0 and out[1] == -448.0 and np.isnan(out[2])
