"""Integer division and remainder at the edges, on every device: a zero divisor and the minimum divided by -1.

C leaves both undefined and x86's idiv traps (SIGFPE kills the process), so xgrad defines them (core README): an int
divided by 0 is 0 and its remainder is the dividend (so a == (a // b) * b + a % b still holds), the minimum divided
by -1 wraps to the minimum with remainder 0. Every backend and constant folding give these; elsewhere the results are
numpy's (floor division, remainder with the divisor's sign; trunc division and fmod with the dividend's)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from xgrad.dtype import DType, dtypes
from xgrad.tensor import Tensor
from xgrad.testing import skip_unsupported

SIGNED = [dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64]
UNSIGNED = [dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64]
INTS = SIGNED + UNSIGNED


def _np(dtype: DType) -> Any:
    return np.dtype(dtype.name)


def _operands(dtype: DType) -> tuple[np.ndarray, np.ndarray]:
    """Every pairing of interesting dividends (0, +-1, +-7, the extremes) with divisors that include 0 and -1."""
    info = np.iinfo(_np(dtype))
    values = sorted(v for v in {0, 1, 7, info.max, info.max - 1, info.min, info.min + 1, -1, -7} if v >= info.min)
    divisors = sorted(v for v in {0, 1, 2, 3, -1, -2, -3, info.max, info.min} if v >= info.min)
    a, b = np.meshgrid(np.array(values, _np(dtype)), np.array(divisors, _np(dtype)), indexing="ij")
    return a.reshape(-1), b.reshape(-1)


def _expected(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """numpy's result where it is defined, xgrad's definition at b == 0; numpy already wraps MIN // -1."""
    safe = np.where(b == 0, 1, b).astype(a.dtype)
    with np.errstate(all="ignore"):
        if op == "floordiv":
            return np.where(b == 0, 0, np.floor_divide(a, safe)).astype(a.dtype)
        if op == "mod":
            return np.where(b == 0, a, np.remainder(a, safe)).astype(a.dtype)
        if op == "trunc":
            q = np.floor_divide(a, safe)
            q = np.where((np.remainder(a, safe) != 0) & ((a < 0) != (safe < 0)), q + 1, q)
            return np.where(b == 0, 0, q).astype(a.dtype)
        return np.where(b == 0, a, np.fmod(a, safe)).astype(a.dtype)  # fmod


OPS: dict[str, Callable[[Any, Any], Any]] = {
    "floordiv": lambda a, b: a // b,
    "mod": lambda a, b: a % b,
    "trunc": lambda a, b: a.div(b, rounding_mode="trunc"),
    "fmod": lambda a, b: a.fmod(b),
}


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", INTS, ids=lambda d: d.name)
def test_int_division_by_tensor_with_zeros_and_minus_one(xgrad_device: str, dtype: DType, op: str) -> None:
    skip_unsupported(xgrad_device, dtype)
    a, b = _operands(dtype)
    out = OPS[op](Tensor(a, device=xgrad_device, dtype=dtype), Tensor(b, device=xgrad_device, dtype=dtype))
    assert out.dtype == dtype
    np.testing.assert_array_equal(out.numpy(), _expected(op, a, b))


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint32], ids=str)
@pytest.mark.parametrize("divisor", [0, -1, 3, "min"])
def test_int_division_by_constant(xgrad_device: str, dtype: DType, op: str, divisor: int | str) -> None:
    """A Python number as the divisor: constant folding and the kernels' plain division agree with the tensor case.
    The dtype's minimum as divisor: the simplifier's x // -c -> -(x // c) must not apply (-MIN wraps to MIN)."""
    skip_unsupported(xgrad_device, dtype)
    if divisor == "min":
        divisor = int(np.iinfo(_np(dtype)).min)
    assert isinstance(divisor, int)
    if divisor <= 0 and dtypes.is_unsigned(dtype):
        pytest.skip("a negative divisor does not fit an unsigned dtype (its minimum is 0: see the zero divisor)")
    a, _ = _operands(dtype)
    b = np.full_like(a, divisor)
    out = OPS[op](Tensor(a, device=xgrad_device, dtype=dtype), divisor)
    np.testing.assert_array_equal(out.numpy(), _expected(op, a, b))


@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.uint8], ids=str)
def test_int_constant_divided_by_tensor_with_zeros(xgrad_device: str, dtype: DType) -> None:
    skip_unsupported(xgrad_device, dtype)
    b = np.array([0, 1, 2, 3, 0], _np(dtype))
    t = Tensor(b, device=xgrad_device, dtype=dtype)
    a = np.full_like(b, 7)
    np.testing.assert_array_equal((7 // t).numpy(), _expected("floordiv", a, b))
    np.testing.assert_array_equal((7 % t).numpy(), _expected("mod", a, b))


def test_int_division_of_constants_folds_to_the_defined_results(xgrad_device: str) -> None:
    lo = Tensor([-(2**31)], device=xgrad_device, dtype=dtypes.int32)
    zero = Tensor([0], device=xgrad_device, dtype=dtypes.int32)
    assert (Tensor([5], device=xgrad_device) // zero).tolist() == [0]
    assert (Tensor([-5], device=xgrad_device) % zero).tolist() == [-5]
    assert (lo // -1).tolist() == [-(2**31)] and (lo % -1).tolist() == [0]


def test_int_division_by_zero_keeps_the_division_identity(xgrad_device: str) -> None:
    a = Tensor([9, -9, 0, 5, -(2**31)], device=xgrad_device, dtype=dtypes.int32)
    b = Tensor([0, 0, 0, -1, -1], device=xgrad_device, dtype=dtypes.int32)
    assert ((a // b) * b + a % b).tolist() == a.tolist()


def test_int_division_by_zero_in_a_reduction(xgrad_device: str) -> None:
    """The guarded division inside a fused reduction kernel (the divisor is loaded data)."""
    a = np.arange(-6, 6, dtype=np.int32).reshape(3, 4)
    b = np.array([[0, 1, -1, 2]] * 3, np.int32)
    out = (Tensor(a, device=xgrad_device) // Tensor(b, device=xgrad_device)).sum(1)
    np.testing.assert_array_equal(out.numpy(), _expected("floordiv", a, b).sum(1))
