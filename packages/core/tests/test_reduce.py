"""Reductions, statistics, arg-reductions, the softmax family and the scans (`xgrad/mixin/reduce.py`): forward and
backward against torch on every available device, over axes, keepdim, 0-d and 0-size inputs and dtypes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch_compare import Fn, check, rand, rand_away, rng, run_docstring, seed_per_test  # noqa: F401  (autouse fixture)

import xgrad.mixin.reduce as reduce_module
from xgrad.dtype import DType, dtypes
from xgrad.errors import ShapeError
from xgrad.tensor import Tensor
from xgrad.testing import skip_unsupported


def stack_rows(outs: list[Tensor]) -> Tensor:
    """The 1-d tensors `outs` as the rows of one (len(outs), n) tensor, made of pads and adds: one kernel computes
    them all (a test of many ops then compiles one kernel, not one per op)."""
    k = len(outs)
    rows = [o.reshape(1, -1).pad(((i, k - 1 - i), (0, 0))) for i, o in enumerate(outs)]
    total = rows[0]
    for r in rows[1:]:
        total = total + r
    return total


AXES: list[tuple[int | tuple[int, ...] | None, bool]] = [(None, False), (1, False), (-1, True), ((0, 2), False)]


def torch_dims(axis: int | tuple[int, ...] | None, ndim: int) -> tuple[int, ...]:
    return tuple(range(ndim)) if axis is None else (axis,) if isinstance(axis, int) else axis


def with_zeros(shape: tuple[int, ...]) -> np.ndarray:
    """Random values with some exact zeros: a row with one zero and a row with two."""
    x = rand(shape, 0.5, 1.5) * rng.choice([-1.0, 1.0], size=shape)
    flat = x.reshape(-1, shape[-1]) if shape else x.reshape(1, 1)
    flat[0, 0] = 0.0
    if flat.shape[0] > 1 and flat.shape[1] > 1:
        flat[1, :2] = 0.0
    return flat.reshape(shape).astype(np.float32)


# ---- prod ----
@pytest.mark.parametrize("axis,keepdim", AXES, ids=str)
def test_prod_matches_torch_with_zeros_in_the_input(
    xgrad_device: str, axis: int | tuple[int, ...] | None, keepdim: bool
) -> None:
    def torch_prod(x: torch.Tensor) -> torch.Tensor:
        dims = sorted({d % x.ndim for d in torch_dims(axis, x.ndim)})
        for d in dims:
            x = x.prod(d, keepdim=True)
        return x if keepdim else x.squeeze(dims)

    check(xgrad_device, lambda x: x.prod(axis, keepdim=keepdim), torch_prod, with_zeros((2, 3, 4)))


def test_prod_of_0d_and_empty_inputs(xgrad_device: str) -> None:
    check(xgrad_device, lambda x: x.prod(), lambda x: x.prod(), rand(()))
    empty = Tensor.zeros(2, 0, device=xgrad_device)
    assert empty.prod(1).tolist() == [1.0, 1.0] and empty.prod().item() == 1.0


@pytest.mark.parametrize(
    "dtype,want", [(dtypes.int8, dtypes.int32), (dtypes.uint8, dtypes.uint32), (dtypes.bool, dtypes.int32)], ids=str
)
def test_prod_and_sum_of_small_ints_accumulate_in_32_bits(xgrad_device: str, dtype: DType, want: DType) -> None:
    skip_unsupported(xgrad_device, dtype)
    data = np.array([[3, 5, 7, 2], [1, 1, 0, 4]]) if dtype != dtypes.bool else np.array([[1, 1, 1, 1], [1, 0, 1, 1]])
    x = Tensor(data, device=xgrad_device, dtype=dtype)
    for out, np_out in [(x.prod(1), data.prod(1)), (x.sum(1), data.sum(1)), (x.cumsum(1), data.cumsum(1))]:
        assert out.dtype == want
        assert out.tolist() == np_out.tolist()
    assert x.prod(1, dtype=dtypes.int16).dtype == dtypes.int16


def test_prod_of_half_accumulates_in_float32_and_returns_half(xgrad_device: str) -> None:
    skip_unsupported(xgrad_device, dtypes.float16)
    data = np.full((2, 40), 1.01, dtype=np.float16)
    out = Tensor(data, device=xgrad_device).prod(1)
    assert out.dtype == dtypes.float16
    np.testing.assert_allclose(out.numpy(), np.prod(data.astype(np.float32), 1).astype(np.float16), rtol=1e-3)


# ---- any / all ----
@pytest.mark.parametrize("dtype", [dtypes.bool, dtypes.int32, dtypes.float32], ids=str)
def test_any_all_match_torch(xgrad_device: str, dtype: DType) -> None:
    data = np.array([[0, 0, 0], [0, 2, 0], [1, 1, 1], [3, 0, 1]])
    x = Tensor(data, device=xgrad_device, dtype=dtype)
    t = torch.tensor(data).to(torch.bool if dtype == dtypes.bool else torch.float32)
    for axis, keepdim in [(None, False), (0, False), (1, True), (-1, False)]:
        kw = {} if axis is None else {"dim": axis, "keepdim": keepdim}
        for name in ("any", "all"):
            out = getattr(x, name)(axis, keepdim)
            assert out.dtype == dtypes.bool
            assert out.tolist() == getattr(torch, name)(t, **kw).tolist(), (name, axis, keepdim)


def test_any_all_over_empty_axes_are_false_and_true(xgrad_device: str) -> None:
    x = Tensor.zeros(0, 3, device=xgrad_device)
    assert x.any(0).tolist() == [False] * 3 and x.all(0).tolist() == [True] * 3
    assert x.any().item() is False and x.all().item() is True
    assert x.any(0, keepdim=True).shape == (1, 3)


def test_any_counts_nan_as_true(xgrad_device: str) -> None:
    assert Tensor([0.0, math.nan], device=xgrad_device).any().item() is True


# ---- argmax / argmin ----
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.int32, dtypes.uint8, dtypes.int8, dtypes.bool], ids=str)
def test_argmax_argmin_pick_the_first_tie_like_torch(xgrad_device: str, dtype: DType) -> None:
    skip_unsupported(xgrad_device, dtype)
    if dtype == dtypes.bool:
        data = np.array([[0, 1, 1], [0, 0, 0], [1, 0, 1]])
    elif dtype == dtypes.int8:
        data = np.array([[-128, 127, 127], [5, -128, -128], [0, 0, 0]])
    else:
        data = np.array([[1, 3, 3], [4, 0, 4], [2, 2, 2]])
    x = Tensor(data, device=xgrad_device, dtype=dtype)
    t = torch.tensor(data).float()
    for axis, keepdim in [(None, False), (0, False), (1, True), (-1, False), (None, True)]:
        for name in ("argmax", "argmin"):
            out = getattr(x, name)(axis, keepdim)
            want = getattr(torch, name)(t, dim=axis, keepdim=keepdim)
            assert out.dtype == dtypes.int32
            assert out.shape == tuple(want.shape) and out.tolist() == want.tolist(), (name, axis, keepdim)


@pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint32], ids=str)
def test_min_and_minimum_at_the_int_extremes(xgrad_device: str, dtype: DType) -> None:
    """min as the negated max of the negation wrapped at the minimum (int32.min gave 0): the order is reversed
    without negating (bitwise not), found by test_fuzz_ops."""
    skip_unsupported(xgrad_device, dtype)
    info = np.iinfo(dtype.name)
    a = np.array([[0, info.min, info.max, 1], [info.max, 5, info.min + 1, 0]], dtype.name)
    b = np.array([[info.min, 0, 1, info.max], [info.min, info.max, info.min, 0]], dtype.name)
    t, u = Tensor(a, device=xgrad_device, dtype=dtype), Tensor(b, device=xgrad_device, dtype=dtype)
    np.testing.assert_array_equal(t.min(1).numpy(), a.min(1))
    np.testing.assert_array_equal(t.min().numpy(), a.min())
    np.testing.assert_array_equal(t.max(0).numpy(), a.max(0))
    np.testing.assert_array_equal(t.minimum(u).numpy(), np.minimum(a, b))
    np.testing.assert_array_equal(t.argmin(1).numpy(), a.argmin(1))


def test_argmax_of_0d_is_0_and_of_an_empty_axis_raises(xgrad_device: str) -> None:
    assert Tensor(3.5, device=xgrad_device).argmax().item() == 0
    with pytest.raises(ShapeError, match="size 0"):
        Tensor.zeros(2, 0, device=xgrad_device).argmax(1)


# ---- statistics ----
@pytest.mark.parametrize("correction", [0, 1, 2])
def test_var_std_match_torch(xgrad_device: str, correction: int) -> None:
    for name, (axis, keepdim) in [("var", (None, False)), ("var", (-1, True)), ("std", ((0, 2), False))]:
        check(
            xgrad_device,
            lambda x, n=name, a=axis, k=keepdim: getattr(x, n)(a, k, correction),
            lambda x, n=name, a=axis, k=keepdim: getattr(torch, n)(
                x, torch_dims(a, x.ndim), correction=correction, keepdim=k
            ),
            rand((2, 3, 4)),
        )


def test_var_mean_and_std_mean_match_torch(xgrad_device: str) -> None:
    for name in ("var_mean", "std_mean"):
        x = Tensor(data := rand((3, 4)), device=xgrad_device)
        for got, want in zip(getattr(x, name)(1), getattr(torch, name)(torch.tensor(data), 1)):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
        check(
            xgrad_device,
            lambda x, n=name: sum(getattr(x, n)(0, True, 0)),
            lambda x, n=name: sum(getattr(torch, n)(x, 0, correction=0, keepdim=True)),
            rand((3, 4)),
        )  # noqa: E501


def test_var_with_too_few_elements_is_inf_or_nan_like_torch(xgrad_device: str) -> None:
    got = Tensor([[1.0], [2.0]], device=xgrad_device).var(1).numpy()
    assert np.isnan(got).all()
    got = Tensor([1.0, 2.0], device=xgrad_device).var(correction=2).numpy()
    assert np.isinf(got)


def test_var_of_ints_is_float(xgrad_device: str) -> None:
    out = Tensor([1, 2, 3, 4], device=xgrad_device).var()
    assert out.dtype == dtypes.float32 and out.item() == pytest.approx(5 / 3)


# ---- logsumexp and the softmax family ----
@pytest.mark.parametrize("axis,keepdim", AXES, ids=str)
def test_logsumexp_matches_torch(xgrad_device: str, axis: int | tuple[int, ...] | None, keepdim: bool) -> None:
    check(
        xgrad_device,
        lambda x: x.logsumexp(axis, keepdim),
        lambda x: torch.logsumexp(x, torch_dims(axis, x.ndim), keepdim),
        rand((2, 3, 4), -5, 5),
    )


def test_logsumexp_is_stable_for_large_and_infinite_inputs(xgrad_device: str) -> None:
    data = np.array([[1e4, 1e4 - 1, -1e4], [-1e4, -1e4, -1e4], [-np.inf, -np.inf, -np.inf], [-np.inf, 0.0, 1.0]])
    check(xgrad_device, lambda x: x.logsumexp(1), lambda x: torch.logsumexp(x, 1), data[:2].astype(np.float32))
    got = Tensor(data.astype(np.float32), device=xgrad_device).logsumexp(1).numpy()
    np.testing.assert_allclose(got, torch.logsumexp(torch.tensor(data), 1).numpy(), rtol=1e-6)


def test_logsumexp_of_empty_axis_is_minus_inf(xgrad_device: str) -> None:
    assert Tensor.zeros(2, 0, device=xgrad_device).logsumexp(1).tolist() == [-math.inf, -math.inf]


SOFTMAX: list[tuple[str, Fn]] = [
    ("softmax", torch.softmax),
    ("log_softmax", torch.log_softmax),
    ("softmin", lambda x, axis: torch.softmax(-x, axis)),
]


@pytest.mark.parametrize("name,torch_fn", SOFTMAX, ids=[s[0] for s in SOFTMAX])
def test_softmax_family_matches_torch(xgrad_device: str, name: str, torch_fn: Fn) -> None:
    for axis in (0, -1):
        check(
            xgrad_device, lambda x, a=axis: getattr(x, name)(a), lambda x, a=axis: torch_fn(x, a), rand((3, 4), -4, 4)
        )
    check(xgrad_device, lambda x: getattr(x, name)(), lambda x: torch_fn(x, -1), rand(()))
    big = np.array([[1e4, 1e4 + 1.0, -1e4], [-1e4, -1e4 - 2.0, -1e4]], dtype=np.float32)
    check(xgrad_device, lambda x: getattr(x, name)(1), lambda x: torch_fn(x, 1), big)


def test_softmax_dtype_argument_casts_first(xgrad_device: str) -> None:
    x = Tensor([[1, 2, 3]], device=xgrad_device)
    assert x.softmax().dtype == dtypes.float32
    skip_unsupported(xgrad_device, dtypes.float16)
    h = Tensor([[1.0, 2.0, 3.0]], device=xgrad_device, dtype=dtypes.float16)
    assert h.log_softmax(dtype=dtypes.float32).dtype == dtypes.float32
    assert h.softmax().dtype == dtypes.float16
    np.testing.assert_allclose(h.softmin(dtype="float32").numpy(), torch.softmax(-torch.tensor([[1.0, 2, 3]]), -1))


# ---- scans ----
SCANS: list[tuple[str, Fn, Fn]] = [
    ("cumsum", lambda x, a: x.cumsum(a), lambda x, a: torch.cumsum(x, a)),
    ("cumprod", lambda x, a: x.cumprod(a), lambda x, a: torch.cumprod(x, a)),
    ("cummax", lambda x, a: x.cummax(a)[0], lambda x, a: torch.cummax(x, a).values),
    ("cummin", lambda x, a: x.cummin(a)[0], lambda x, a: torch.cummin(x, a).values),
    ("logcumsumexp", lambda x, a: x.logcumsumexp(a), lambda x, a: torch.logcumsumexp(x, a)),
]


@pytest.mark.parametrize("name,fn,torch_fn", SCANS, ids=[s[0] for s in SCANS])
def test_scan_matches_torch(xgrad_device: str, name: str, fn: Fn, torch_fn: Fn) -> None:
    for axis in (0, -1):
        check(xgrad_device, lambda x, a=axis: fn(x, a), lambda x, a=axis: torch_fn(x, a), with_zeros((3, 4)))
    check(xgrad_device, lambda x: fn(x, 0), lambda x: torch_fn(x, 0), rand(()))
    check(xgrad_device, lambda x: fn(x, 1), lambda x: torch_fn(x, 1), rand((2, 0)))


@pytest.mark.parametrize("name,fn,torch_fn", SCANS[:2] + SCANS[4:], ids=["cumsum", "cumprod", "logcumsumexp"])
def test_scan_over_a_long_axis_goes_by_blocks(
    xgrad_device: str, monkeypatch: pytest.MonkeyPatch, name: str, fn: Fn, torch_fn: Fn
) -> None:
    monkeypatch.setattr(reduce_module, "_SCAN_BLOCK", 3)  # 13 elements: 5 blocks, whose totals need blocks too
    data = rand((2, 13), 0.8, 1.25) if name == "cumprod" else rand((2, 13), -3, 3)
    check(xgrad_device, lambda x: fn(x, 1), lambda x: torch_fn(x, 1), data, rtol=2e-5)


def test_cummax_cummin_indices_are_the_latest_tie_like_torch(xgrad_device: str) -> None:
    data = np.array([[1.0, 3.0, 3.0, 2.0, 3.0, 5.0], [4.0, 4.0, 1.0, 4.0, 0.0, 0.0]], dtype=np.float32)
    x, t = Tensor(data, device=xgrad_device), torch.tensor(data)
    for name in ("cummax", "cummin"):
        for axis in (0, 1):
            values, indices = getattr(x, name)(axis)
            want = getattr(torch, name)(t, axis)
            assert indices.dtype == dtypes.int32
            assert indices.tolist() == want.indices.tolist() and values.tolist() == want.values.tolist(), name
    # the gradient goes to the index returned, as torch's
    check(xgrad_device, lambda x: x.cummax(1)[0], lambda x: torch.cummax(x, 1).values, data)
    check(xgrad_device, lambda x: x.cummin(1)[0], lambda x: torch.cummin(x, 1).values, data)


def test_cummax_of_a_long_axis_matches_torch(xgrad_device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reduce_module, "_SCAN_BLOCK", 4)
    monkeypatch.setattr(reduce_module, "_SELECT_MAX_N", 8)  # past it, the gradient goes through the max scan
    data = np.round(rand((2, 19), -3, 3), 1)
    x, t = Tensor(data, device=xgrad_device), torch.tensor(data)
    values, indices = x.cummax(1)
    want = torch.cummax(t, 1)
    assert indices.tolist() == want.indices.tolist()
    np.testing.assert_array_equal(values.numpy(), want.values.numpy())
    distinct = rng.permutation(38).reshape(2, 19).astype(np.float32)
    check(xgrad_device, lambda x: x.cummax(1)[0], lambda x: torch.cummax(x, 1).values, distinct)


@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.uint8, dtypes.int8, dtypes.bool], ids=str)
def test_int_scans_match_torch(xgrad_device: str, dtype: DType) -> None:
    skip_unsupported(xgrad_device, dtype)
    data = np.array([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]]) if dtype != dtypes.bool else np.array([[0, 1, 1, 0, 1]] * 2)
    if dtype == dtypes.int8:
        data = data - 5
    x = Tensor(data, device=xgrad_device, dtype=dtype)
    t = torch.tensor(
        data,
        dtype={dtypes.int32: torch.int32, dtypes.uint8: torch.uint8, dtypes.int8: torch.int8, dtypes.bool: torch.bool}[
            dtype
        ],
    )  # noqa: E501
    assert x.cumsum(1).tolist() == torch.cumsum(t, 1).tolist()
    assert x.cumprod(1).tolist() == torch.cumprod(t, 1).tolist()
    for name in ("cummax", "cummin"):
        values, indices = getattr(x, name)(1)
        want = getattr(torch, name)(t, 1)
        assert values.dtype == dtype
        assert values.tolist() == want.values.tolist() and indices.tolist() == want.indices.tolist(), name


def test_logcumsumexp_is_stable_for_large_and_small_inputs(xgrad_device: str) -> None:
    data = np.array([[-1e4, 0.0, 1e4, 1e4], [1e4, -1e4, -np.inf, 3.0]], dtype=np.float32)
    got = Tensor(data, device=xgrad_device).logcumsumexp(1).numpy()
    np.testing.assert_allclose(got, torch.logcumsumexp(torch.tensor(data, dtype=torch.float64), 1).numpy(), rtol=1e-6)


# ---- docstrings ----
DOC_NAMES = [
    *["sum", "prod", "max", "min", "any", "all", "mean", "var", "std", "var_mean", "std_mean", "logsumexp"],
    *["argmax", "argmin", "softmax", "log_softmax", "softmin", "cumsum", "cumprod", "cummax", "cummin"],
    "logcumsumexp",
]


@pytest.mark.parametrize("name", DOC_NAMES)
def test_docstring_example_runs_for_method(name: str) -> None:
    run_docstring(name)
