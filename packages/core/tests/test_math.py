"""Elementwise math and activations (`xgrad/mixin/elementwise.py`, `bitwise.py`, `unary.py`): forward and backward
against torch on every available device, special values, dtypes and numerical stability."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch_compare import Fn, check, rand, rand_away, rng, run_docstring, seed_per_test  # noqa: F401  (autouse fixture)

from xgrad.dtype import DType, dtypes
from xgrad.errors import DTypeError, XgradError
from xgrad.tensor import Tensor
from xgrad.testing import skip_unsupported


def stacked_values(outs: list[Tensor], group: int = 6) -> np.ndarray:
    """The values of the 1-d tensors `outs`, as the rows of one array. Each group of `group` is computed by one
    kernel (the rows padded and added): far fewer kernels to compile than one per op, while every element of a
    group kernel computes only `group` ops (the padding computes all of them everywhere)."""
    rows = []
    for start in range(0, len(outs), group):
        chunk = outs[start : start + group]
        k = len(chunk)
        total = chunk[0].reshape(1, -1).pad(((0, k - 1), (0, 0)))
        for i, o in enumerate(chunk[1:], start=1):
            total = total + o.reshape(1, -1).pad(((i, k - 1 - i), (0, 0)))
        rows.append(total.numpy())
    return np.concatenate(rows)


SHAPES = [(0,), (2, 3)]  # 0-d inputs: test_unary_of_0d_inputs_matches_torch, all ops in one kernel
Make = Callable[[tuple[int, ...]], np.ndarray]


def uniform(low: float, high: float) -> Make:
    return lambda s: rand(s, low, high)


def away(*kinks: float, low: float = -4.0, high: float = 4.0) -> Make:
    return lambda s: rand_away(s, kinks, low, high)


# name, xgrad fn, torch fn (None: the same), input maker
UNARY: list[tuple[str, Fn, Fn | None, Make]] = [
    ("asin", lambda x: x.asin(), None, uniform(-0.95, 0.95)),
    ("acos", lambda x: x.acos(), None, uniform(-0.95, 0.95)),
    ("atan", lambda x: x.atan(), None, uniform(-6, 6)),
    ("sinh", lambda x: x.sinh(), None, uniform(-3, 3)),
    ("cosh", lambda x: x.cosh(), None, uniform(-3, 3)),
    ("tanh", lambda x: x.tanh(), None, uniform(-3, 3)),
    ("asinh", lambda x: x.asinh(), None, uniform(-6, 6)),
    ("acosh", lambda x: x.acosh(), None, uniform(1.05, 6)),
    ("atanh", lambda x: x.atanh(), None, uniform(-0.95, 0.95)),
    ("erf", lambda x: x.erf(), None, uniform(-3, 3)),
    ("sigmoid", lambda x: x.sigmoid(), None, uniform(-6, 6)),
    ("logsigmoid", lambda x: x.logsigmoid(), F.logsigmoid, uniform(-6, 6)),
    ("softplus", lambda x: x.softplus(), F.softplus, uniform(-6, 6)),
    ("softplus_beta", lambda x: x.softplus(beta=2.0), lambda x: F.softplus(x, beta=2.0), uniform(-6, 6)),
    ("relu6", lambda x: x.relu6(), F.relu6, away(0, 6, low=-3, high=9)),
    ("hardtanh", lambda x: x.hardtanh(-0.5, 2.0), lambda x: F.hardtanh(x, -0.5, 2.0), away(-0.5, 2.0)),
    ("hardsigmoid", lambda x: x.hardsigmoid(), F.hardsigmoid, away(-3, 3, low=-5, high=5)),
    ("hardswish", lambda x: x.hardswish(), F.hardswish, away(-3, 3, low=-5, high=5)),
    ("elu", lambda x: x.elu(), F.elu, away(0)),
    ("elu_alpha", lambda x: x.elu(0.5), lambda x: F.elu(x, 0.5), away(0)),
    ("celu", lambda x: x.celu(2.0), lambda x: F.celu(x, 2.0), away(0)),
    ("selu", lambda x: x.selu(), lambda x: 1.0507 * F.elu(x, 1.67326), away(0)),
    ("silu", lambda x: x.silu(), F.silu, uniform(-6, 6)),
    ("swish", lambda x: x.swish(), F.silu, uniform(-6, 6)),
    ("quick_gelu", lambda x: x.quick_gelu(), lambda x: x * torch.sigmoid(1.702 * x), uniform(-6, 6)),
    ("gelu_tanh", lambda x: x.gelu(), lambda x: F.gelu(x, approximate="tanh"), uniform(-6, 6)),
    ("gelu_none", lambda x: x.gelu("none"), F.gelu, uniform(-6, 6)),
    ("leaky_relu", lambda x: x.leaky_relu(0.1), lambda x: F.leaky_relu(x, 0.1), away(0)),
    ("mish", lambda x: x.mish(), F.mish, uniform(-6, 6)),
    ("softsign", lambda x: x.softsign(), F.softsign, uniform(-6, 6)),
    ("abs", lambda x: x.abs(), None, away(0)),
    ("round", lambda x: x.round(), None, uniform(-6, 6)),
    ("clamp", lambda x: x.clamp(-1.0, 1.5), lambda x: x.clamp(-1.0, 1.5), away(-1, 1.5)),
    ("clip_min_only", lambda x: x.clip(min_=0.5), lambda x: x.clip(min=0.5), away(0.5)),
]
UNARY_IDS = [u[0] for u in UNARY]


@pytest.mark.parametrize("name,fn,torch_fn,make", UNARY, ids=UNARY_IDS)
def test_unary_matches_torch_forward_and_backward(
    xgrad_device: str, name: str, fn: Fn, torch_fn: Fn | None, make: Make
) -> None:
    for shape in SHAPES:
        check(xgrad_device, fn, torch_fn, make(shape), atol=2e-6, rtol=2e-6, grad_atol=2e-5)


def test_unary_of_0d_inputs_matches_torch(xgrad_device: str) -> None:
    data = [make(()) for _, _, _, make in UNARY]
    xs = [Tensor(d, device=xgrad_device, requires_grad=True) for d in data]  # 0-d: a buffer each, for gradients
    outs = [fn(x) for (_, fn, _, _), x in zip(UNARY, xs)]
    assert all(out.shape == () for out in outs)
    upstream = [float(g) for g in rand((len(UNARY),))]
    grads = [out.gradient(x, gradient=Tensor(g, device=xgrad_device))[0] for out, x, g in zip(outs, xs, upstream)]
    got, got_grads = stacked_values(outs)[:, 0], stacked_values(grads)[:, 0]
    for (name, fn, torch_fn, _), d, g, value, grad in zip(UNARY, data, upstream, got, got_grads):
        t = torch.tensor(d.astype(np.float64), requires_grad=True)
        want = (torch_fn or fn)(t)
        (want_grad,) = torch.autograd.grad(want, t, torch.tensor(g, dtype=torch.float64))
        np.testing.assert_allclose(value, want.item(), rtol=2e-6, atol=2e-6, err_msg=name)
        np.testing.assert_allclose(grad, want_grad.item(), rtol=2e-6, atol=2e-5, err_msg=f"gradient of {name}")


SPECIAL = np.array([0.0, -0.0, 1e-7, -1e-7, 1e-3, -0.5, 0.5, 20.0, -20.0, 100.0, -100.0, np.inf, -np.inf, np.nan])
# where xgrad gives the limit and torch nan: x * f(x) with f(-inf) = 0 (torch: -inf * 0)
SPECIAL_DEVIATIONS = {
    name: [12] for name in ("hardswish", "gelu_tanh", "gelu_none", "mish", "silu", "swish", "quick_gelu")
}


def log2_keeps_nan(device: str) -> bool:
    """Whether the device's LOG2 gives nan for nan (WGSL allows implementations to ignore nan; lavapipe's log2 gives
    -inf), which the composed functions need to carry a nan through."""
    return bool(np.isnan(Tensor([math.nan], device=device).log2().numpy()).all())


def test_unary_matches_torch_at_special_values(xgrad_device: str) -> None:
    data = SPECIAL.astype(np.float32)
    keeps_nan = log2_keeps_nan(xgrad_device)
    x = Tensor(data, device=xgrad_device)
    got = stacked_values([fn(x) for _, fn, _, _ in UNARY])
    for (name, fn, torch_fn, _), row in zip(UNARY, got):
        want = (torch_fn or fn)(torch.tensor(data, dtype=torch.float64)).numpy()
        with np.errstate(over="ignore"):
            want = want.astype(np.float32)  # overflow to inf as float32 does
        for i in SPECIAL_DEVIATIONS.get(name, []):
            row[i], want[i] = 0.0, 0.0
        if not keeps_nan:  # only where torch's answer is a number
            row, want = row[~np.isnan(want)], want[~np.isnan(want)]
        np.testing.assert_allclose(row, want, rtol=2e-6, atol=1e-6, equal_nan=True, err_msg=f"{name} at {data}")


def test_unary_keeps_precision_near_zero(xgrad_device: str) -> None:
    tiny = np.array([1e-6, -3e-5, 2e-4, -1e-3], dtype=np.float32)
    x = Tensor(tiny, device=xgrad_device)
    t = torch.tensor(tiny, dtype=torch.float64)
    for name in ["sinh", "tanh", "asinh", "atanh", "asin", "atan", "erf", "elu", "expm1_via_celu"]:
        if name == "expm1_via_celu":
            got, want = x.celu(1.0).numpy(), F.celu(t, 1.0).numpy()
        else:
            got, want = getattr(x, name)().numpy(), getattr(torch, name, getattr(F, name, None))(t).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=name)


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=str)
def test_unary_narrow_floats_compute_in_float32_and_round_once(xgrad_device: str, dtype: DType) -> None:
    skip_unsupported(xgrad_device, dtype)
    torch_dt = {dtypes.float16: torch.float16, dtypes.bfloat16: torch.bfloat16}[dtype]
    data = [make((3,)) for _, _, _, make in UNARY]
    x = Tensor(np.stack(data), device=xgrad_device, dtype=dtype)  # one buffer: a kernel may bind only so many
    outs = [fn(x.shrink(((i, i + 1), (0, 3))).reshape(3)) for i, (_, fn, _, _) in enumerate(UNARY)]
    for (name, _, _, _), out in zip(UNARY, outs):
        assert out.dtype == dtype, f"{name} gives {out.dtype} for {dtype}"
    got = stacked_values(outs).astype(np.float64)
    tol = 1e-2 if dtype == dtypes.bfloat16 else 2e-3
    for (name, fn, torch_fn, _), row, d in zip(UNARY, got, data):
        t = torch.tensor(d).to(torch_dt).double()  # the same rounded inputs
        want = (torch_fn or fn)(t).to(torch_dt).double().numpy()
        np.testing.assert_allclose(row, want, rtol=tol, atol=tol, err_msg=name)


def test_unary_float64_matches_torch(xgrad_device: str) -> None:
    skip_unsupported(xgrad_device, dtypes.float64)
    data = rand((6,), -0.9, 0.9).astype(np.float64)
    x = Tensor(data, device=xgrad_device)
    t = torch.tensor(data)
    exact = {"asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "atanh", "sigmoid", "softplus", "silu"}
    outs = [fn(x) for _, fn, _, _ in UNARY]
    assert all(out.dtype == dtypes.float64 for out in outs)
    for (name, fn, torch_fn, _), row in zip(UNARY, stacked_values(outs)):
        tol = 1e-12 if name in exact else 1e-7
        np.testing.assert_allclose(row, (torch_fn or fn)(t).numpy(), rtol=tol, atol=tol, err_msg=name)


def test_unary_math_of_int_input_is_float32(xgrad_device: str) -> None:
    names = ["atan", "cosh", "erf", "sigmoid", "softplus", "gelu", "elu"]
    x = Tensor([-2, 0, 1, 3], device=xgrad_device)
    xf = Tensor([-2.0, 0.0, 1.0, 3.0], device=xgrad_device)
    outs = [getattr(x, name)() for name in names]
    assert all(out.dtype == dtypes.float32 for out in outs)
    got = stacked_values(outs + [getattr(xf, name)() for name in names])
    np.testing.assert_array_equal(got[: len(names)], got[len(names) :])


def test_piecewise_linear_activations_keep_int_dtype(xgrad_device: str) -> None:
    x = Tensor([-8, -1, 0, 2, 9], device=xgrad_device)
    assert x.relu6().dtype == dtypes.int32 and x.relu6().tolist() == [0, 0, 0, 2, 6]
    assert x.hardtanh().tolist() == [-1, -1, 0, 1, 1]
    assert x.clamp(-2, 3).tolist() == [-2, -1, 0, 2, 3]
    assert x.abs().tolist() == [8, 1, 0, 2, 9]
    assert x.round().tolist() == [-8, -1, 0, 2, 9]


def test_activations_stay_finite_for_huge_inputs(xgrad_device: str) -> None:
    data = np.array([-1e4, -200.0, 200.0, 1e4], dtype=np.float32)
    for name, want in [
        ("softplus", F.softplus),
        ("logsigmoid", F.logsigmoid),
        ("sigmoid", torch.sigmoid),
        ("tanh", torch.tanh),
        ("silu", F.silu),
        ("mish", F.mish),
        ("elu", F.elu),
    ]:
        check(xgrad_device, lambda x, n=name: getattr(x, n)(), want, data, atol=1e-5, rtol=1e-6)


def test_gelu_rejects_unknown_approximation(xgrad_device: str) -> None:
    with pytest.raises(XgradError, match="tanh"):
        Tensor([1.0], device=xgrad_device).gelu("fast")


def test_gradients_at_kinks_match_torch(xgrad_device: str) -> None:
    cases: list[tuple[Fn, Fn, list[float]]] = [
        (lambda x: x.relu6(), F.relu6, [0.0, 6.0]),
        (lambda x: x.hardtanh(), F.hardtanh, [-1.0, 1.0]),
        (lambda x: x.hardsigmoid(), F.hardsigmoid, [-3.0, 3.0]),
        (lambda x: x.hardswish(), F.hardswish, [-3.0, 3.0]),
        (lambda x: x.leaky_relu(), F.leaky_relu, [0.0]),
        (lambda x: x.elu(0.5), lambda x: F.elu(x, 0.5), [0.0]),
        (lambda x: x.clamp(-1.0, 1.0), lambda x: x.clamp(-1.0, 1.0), [-1.0, 1.0]),
        (lambda x: x.abs(), torch.abs, [0.0]),
        (lambda x: x.softplus(), F.softplus, [0.0]),
        (lambda x: x.asinh(), torch.asinh, [0.0]),
        (lambda x: x.atan(), torch.atan, [0.0]),
        (lambda x: x.erf(), torch.erf, [0.0]),
        (lambda x: x.softsign(), F.softsign, [0.0]),
    ]
    for fn, torch_fn, points in cases:
        check(xgrad_device, fn, torch_fn, np.array(points, dtype=np.float32))


# ---- rounding and predicates ----
def test_round_is_half_to_even(xgrad_device: str) -> None:
    data = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 0.49999997, -3.7, 1e8 + 1, 2.0**23 + 1], dtype=np.float32)
    got = Tensor(data, device=xgrad_device).round().numpy()
    np.testing.assert_array_equal(got, torch.round(torch.tensor(data)).numpy())


def test_round_keeps_inf_and_nan(xgrad_device: str) -> None:
    got = Tensor([math.inf, -math.inf, math.nan], device=xgrad_device).round().numpy()
    np.testing.assert_array_equal(got, [math.inf, -math.inf, math.nan])


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16, dtypes.int32, dtypes.bool], ids=str)
def test_isinf_isnan_isfinite_match_torch(xgrad_device: str, dtype: DType) -> None:
    skip_unsupported(xgrad_device, dtype)
    data = [1.0, math.inf, -math.inf, math.nan, 0.0] if dtypes.is_float(dtype) else [1, 0, 1]
    x = Tensor(data, device=xgrad_device, dtype=dtype)
    t = torch.tensor(data)
    for out, want in [
        (x.isinf(), torch.isinf(t)),
        (x.isinf(detect_negative=False), torch.isposinf(t)),
        (x.isinf(detect_positive=False), torch.isneginf(t)),
        (x.isinf(False, False), torch.zeros_like(t, dtype=torch.bool)),
        (x.isnan(), torch.isnan(t)),
        (x.isfinite(), torch.isfinite(t)),
    ]:
        assert out.dtype == dtypes.bool
        assert out.tolist() == want.tolist()


def test_clamp_with_tensor_bounds_matches_torch(xgrad_device: str) -> None:
    lo, hi = rand((3, 1), -1.0, 0.0), rand((4,), 0.2, 1.0)
    check(xgrad_device, lambda x, a, b: x.clamp(a, b), lambda x, a, b: torch.clamp(x, a, b), rand((3, 4)), lo, hi)


def test_clamp_with_min_above_max_gives_max_like_torch(xgrad_device: str) -> None:
    assert Tensor([-5.0, 0.0, 5.0], device=xgrad_device).clamp(2.0, 1.0).tolist() == [1.0, 1.0, 1.0]


def test_clamp_without_bounds_raises(xgrad_device: str) -> None:
    with pytest.raises(XgradError, match="min_ or max_"):
        Tensor([1.0], device=xgrad_device).clamp()


# ---- binary ----
BINARY_SHAPES = [((), ()), ((2, 3), (3,)), ((2, 1), (1, 3)), ((0, 3), (3,))]
BINARY: list[tuple[str, Fn, Fn, tuple[float, float], tuple[float, float]]] = [
    ("logaddexp", lambda a, b: a.logaddexp(b), torch.logaddexp, (-5, 5), (-5, 5)),
    ("copysign", lambda a, b: a.copysign(b), torch.copysign, (-3, 3), (-3, 3)),
    ("fmod", lambda a, b: a.fmod(b), torch.fmod, (-7, 7), (0.7, 3)),
    (
        "div_trunc",
        lambda a, b: a.div(b, rounding_mode="trunc"),
        lambda a, b: torch.div(a, b, rounding_mode="trunc"),
        (-7, 7),
        (0.7, 3),
    ),  # noqa: E501
    (
        "div_floor",
        lambda a, b: a.div(b, rounding_mode="floor"),
        lambda a, b: torch.div(a, b, rounding_mode="floor"),
        (-7, 7),
        (0.7, 3),
    ),  # noqa: E501
    ("pow", lambda a, b: a.pow(b), torch.pow, (0.2, 3), (-2, 2)),
    ("lerp", lambda a, b: a.lerp(b, 0.3), lambda a, b: torch.lerp(a, b, 0.3), (-3, 3), (-3, 3)),
]


@pytest.mark.parametrize("name,fn,torch_fn,range_a,range_b", BINARY, ids=[b[0] for b in BINARY])
def test_binary_matches_torch_with_broadcasting(
    xgrad_device: str,
    name: str,
    fn: Fn,
    torch_fn: Fn,
    range_a: tuple[float, float],
    range_b: tuple[float, float],
) -> None:
    for sa, sb in BINARY_SHAPES:
        a, b = rand(sa, *range_a), rand(sb, *range_b)
        while name in ("fmod", "div_trunc", "div_floor") and (np.abs((a / b) - np.round(a / b)) < 0.05).any():
            a, b = rand(sa, *range_a), rand(sb, *range_b)  # a/b near an integer: the result jumps there
        check(xgrad_device, fn, torch_fn, a, b, atol=1e-5, rtol=1e-5)


def test_lerp_with_tensor_weight_matches_torch(xgrad_device: str) -> None:
    check(xgrad_device, lambda a, b, w: a.lerp(b, w), torch.lerp, rand((2, 3)), rand((3,)), rand((2, 1), 0, 1))


def test_logaddexp_is_stable_for_large_and_infinite_inputs(xgrad_device: str) -> None:
    a = np.array([1e4, -1e4, -np.inf, np.inf, -np.inf, 3.0], dtype=np.float32)
    b = np.array([1e4, -1e4, -np.inf, np.inf, 2.0, np.inf], dtype=np.float32)
    got = Tensor(a, device=xgrad_device).logaddexp(Tensor(b, device=xgrad_device)).numpy()
    np.testing.assert_allclose(got, torch.logaddexp(torch.tensor(a), torch.tensor(b)).numpy(), rtol=1e-6)
    check(xgrad_device, lambda x, y: x.logaddexp(y), torch.logaddexp, a[:2], b[:2])


def test_copysign_uses_the_sign_bit_and_keeps_int_dtype(xgrad_device: str) -> None:
    a = np.array([1.0, 2.0, -3.0, 4.0, 0.0], dtype=np.float32)
    b = np.array([-0.0, 0.0, 1.0, -np.inf, -1.0], dtype=np.float32)
    got = Tensor(a, device=xgrad_device).copysign(Tensor(b, device=xgrad_device)).numpy()
    want = np.copysign(a, b)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got[:4]), np.signbit(want[:4]))
    out = Tensor([3, -4, 5], device=xgrad_device).copysign(Tensor([-1, 2, 0], device=xgrad_device))
    assert out.dtype == dtypes.int32 and out.tolist() == [-3, 4, 5]


@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.int8, dtypes.uint8], ids=str)
def test_int_division_rounding_modes_match_torch(xgrad_device: str, dtype: DType) -> None:
    skip_unsupported(xgrad_device, dtype)
    signed = not dtypes.is_unsigned(dtype)
    a = [-7, 7, -8, 9, 0, 5] if signed else [7, 8, 9, 0, 5, 200]
    b = [2, -2, 3, -4, 3, 5] if signed else [2, 3, 4, 3, 5, 7]
    torch_dt = {dtypes.int32: torch.int32, dtypes.int8: torch.int8, dtypes.uint8: torch.uint8}[dtype]
    x, y = Tensor(a, device=xgrad_device, dtype=dtype), Tensor(b, device=xgrad_device, dtype=dtype)
    ta, tb = torch.tensor(a, dtype=torch_dt), torch.tensor(b, dtype=torch_dt)
    for mode in ("trunc", "floor"):
        out = x.div(y, rounding_mode=mode)
        assert out.dtype == dtype and out.tolist() == torch.div(ta, tb, rounding_mode=mode).tolist(), mode
    true_div = x.div(y)
    assert true_div.dtype == dtypes.float32
    np.testing.assert_allclose(true_div.numpy(), (ta / tb).numpy(), rtol=1e-6)
    fm = x.fmod(y)
    assert fm.dtype == dtype and fm.tolist() == torch.fmod(ta, tb).tolist()


def test_fmod_by_zero_is_nan_for_floats(xgrad_device: str) -> None:
    got = Tensor([1.0, -2.0], device=xgrad_device).fmod(0.0).numpy()
    assert np.isnan(got).all()


def test_div_rejects_unknown_rounding_mode(xgrad_device: str) -> None:
    with pytest.raises(XgradError, match="trunc"):
        Tensor([1.0], device=xgrad_device).div(2.0, rounding_mode="round")


# ---- pow ----
POW_CORNERS = [
    (0.0, 0.0),
    (0.0, -1.0),
    (0.0, 2.5),
    (-2.0, 3.0),
    (-2.0, 2.0),
    (-2.0, 0.5),
    (-2.0, -3.0),
    (math.nan, 0.0),
    (1.0, math.nan),
    (-1.0, math.inf),
    (2.0, math.inf),
    (0.5, math.inf),
    (2.0, -math.inf),
    (math.inf, -1.0),
    (-math.inf, 3.0),
    (-math.inf, 2.0),
    (3.0, 0.0),
    (-0.5, -1.0),
]


def test_pow_corner_cases_match_torch(xgrad_device: str) -> None:
    a = np.array([p[0] for p in POW_CORNERS], dtype=np.float32)
    b = np.array([p[1] for p in POW_CORNERS], dtype=np.float32)
    got = Tensor(a, device=xgrad_device).pow(Tensor(b, device=xgrad_device)).numpy()
    np.testing.assert_allclose(got, torch.pow(torch.tensor(a), torch.tensor(b)).numpy(), rtol=1e-6, equal_nan=True)


@pytest.mark.parametrize("exponent", [0, 1, 2, 3, 5, -1, -2, 0.5, 2.0, 1.5, -0.5], ids=str)
def test_pow_scalar_exponent_matches_torch_including_negative_base(xgrad_device: str, exponent: float) -> None:
    data = np.array([-2.0, -0.7, 0.3, 1.5, 3.0], dtype=np.float32)
    if exponent != int(exponent):
        data = np.abs(data)
    check(xgrad_device, lambda x: x**exponent, lambda x: x**exponent, data, atol=1e-5, rtol=2e-6)


def test_pow_scalar_exponent_gradient_at_zero_matches_torch(xgrad_device: str) -> None:
    for exponent in (2, 3, 0.5):
        check(xgrad_device, lambda x, e=exponent: x**e, lambda x, e=exponent: x**e, np.array([0.0, 1.0], np.float32))


def test_rpow_matches_torch(xgrad_device: str) -> None:
    check(xgrad_device, lambda x: 2.5**x, lambda x: 2.5**x, rand((2, 3)))
    check(xgrad_device, lambda x: (-2.0) ** x.round(), lambda x: (-2.0) ** torch.round(x), rand((4,)), grad=False)


@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.int8, dtypes.uint8, dtypes.int64], ids=str)
def test_int_pow_is_exact(xgrad_device: str, dtype: DType) -> None:
    skip_unsupported(xgrad_device, dtype)
    torch_dt = {
        dtypes.int32: torch.int32,
        dtypes.int8: torch.int8,
        dtypes.uint8: torch.uint8,
        dtypes.int64: torch.int64,
    }
    signed = not dtypes.is_unsigned(dtype)
    base = [3, -3, 2, 0, 1, -1] if signed else [3, 2, 0, 1, 5, 7]
    exp = [19, 3, 6, 0, 5, 7] if dtype in (dtypes.int32, dtypes.int64) else [2, 3, 4, 0, 3, 2]
    x = Tensor(base, device=xgrad_device, dtype=dtype)
    out = x.pow(Tensor(exp, device=xgrad_device, dtype=dtype))
    want = torch.tensor(base, dtype=torch_dt[dtype]) ** torch.tensor(exp, dtype=torch_dt[dtype])
    assert out.dtype == dtype and out.tolist() == want.tolist()
    assert (x**3).tolist() == (torch.tensor(base, dtype=torch_dt[dtype]) ** 3).tolist()


def test_int_pow_with_negative_exponent(xgrad_device: str) -> None:
    x = Tensor([2, 1, -1, -1, 0], device=xgrad_device)
    assert x.pow(Tensor([-1, -3, -1, -2, -2], device=xgrad_device)).tolist() == [0, 1, -1, 1, 0]
    with pytest.raises(DTypeError, match="negative integer power"):
        x**-1
    assert (x**-1.5).dtype == dtypes.float32


def test_int_pow_float_exponent_promotes(xgrad_device: str) -> None:
    out = Tensor([2, 3], device=xgrad_device) ** 2.0
    assert out.dtype == dtypes.float32 and out.tolist() == [4.0, 9.0]


# ---- isclose / allclose ----
def test_isclose_matches_torch(xgrad_device: str) -> None:
    a = np.array([1.0, 1.0, np.inf, np.inf, -np.inf, np.nan, 0.0, 1e-9, 100.0], dtype=np.float32)
    b = np.array([1.0 + 1e-6, 1.1, np.inf, -np.inf, -np.inf, np.nan, 1e-9, 0.0, 100.001], dtype=np.float32)
    x, y = Tensor(a, device=xgrad_device), Tensor(b, device=xgrad_device)
    ta, tb = torch.tensor(a), torch.tensor(b)
    for kw in ({}, {"equal_nan": True}, {"rtol": 0.0, "atol": 0.0}, {"rtol": 1e-3}):
        out = x.isclose(y, **kw)  # type: ignore[arg-type]
        assert out.dtype == dtypes.bool
        assert out.tolist() == torch.isclose(ta, tb, **kw).tolist(), kw  # type: ignore[arg-type]
    assert x.isclose(1.0).tolist() == torch.isclose(ta, torch.tensor(1.0)).tolist()


def test_allclose_returns_a_python_bool(xgrad_device: str) -> None:
    x = Tensor([1.0, 2.0], device=xgrad_device)
    assert x.allclose(Tensor([1.0, 2.0 + 1e-6], device=xgrad_device)) is True
    assert x.allclose(Tensor([1.0, 2.1], device=xgrad_device)) is False
    assert Tensor([1, 2], device=xgrad_device).allclose(Tensor([1, 2], device=xgrad_device)) is True


# ---- docstrings ----
DOC_NAMES = [
    *["asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "round", "isinf", "isnan"],
    *["isfinite", "clamp", "clip", "abs", "sigmoid", "logsigmoid", "softplus", "hardtanh", "relu6", "hardsigmoid"],
    *["hardswish", "elu", "celu", "selu", "silu", "swish", "quick_gelu", "gelu", "leaky_relu", "mish", "softsign"],
    *["logaddexp", "copysign", "lerp", "isclose", "allclose", "div", "fmod", "pow"],
]


@pytest.mark.parametrize("name", DOC_NAMES)
def test_docstring_example_runs_for_method(name: str) -> None:
    run_docstring(name)
