"""16-bit float reductions accumulate in float32 and round once at the end, as torch does: sums, means, variances,
standard deviations, the softmax family and layernorm of float16/bfloat16 tensors against torch on the same 16-bit
input, on every device. Data chosen so that 16-bit accumulation would overflow (a mean of values whose sum does not
fit), underflow (the squares of small deviations) or lose the digits (a large offset)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch_compare import rng, seed_per_test  # noqa: F401 (seed_per_test: autouse fixture)

from xgrad.dtype import DType, dtypes
from xgrad.tensor import Tensor
from xgrad.testing import skip_unsupported

HALVES = [dtypes.float16, dtypes.bfloat16]
TORCH = {dtypes.float16: torch.float16, dtypes.bfloat16: torch.bfloat16}
# one ulp of the 16-bit result: float16 has 10 mantissa bits, bfloat16 7
RTOL = {dtypes.float16: 2e-3, dtypes.bfloat16: 1.6e-2}


def _pair(device: str, dtype: DType, data: np.ndarray) -> tuple[Tensor, torch.Tensor]:
    """The same 16-bit values as an xgrad tensor on `device` and a torch tensor."""
    skip_unsupported(device, dtype)
    t = torch.tensor(data, dtype=torch.float32).to(TORCH[dtype])
    x = Tensor(t.float().numpy(), device=device).cast(dtype)
    return x, t


def _close(got: Tensor, want: torch.Tensor, dtype: DType, atol: float = 0.0) -> None:
    assert got.dtype == dtype, f"result dtype {got.dtype.name}, want {dtype.name}"
    g, w = got.cast(dtypes.float32).numpy(), want.float().numpy()
    np.testing.assert_allclose(g, w, rtol=RTOL[dtype], atol=atol, equal_nan=True)


def _data(kind: str) -> np.ndarray:
    if kind == "big":  # the sum of a row leaves float16's range (65504), its mean does not
        return np.full((4, 1000), 250.0) + rng.uniform(-1, 1, (4, 1000)).round(1)
    if kind == "small":  # deviations ~1e-3: their squares lie below float16's normal range (6.1e-5)
        return rng.standard_normal((4, 64)) * 1e-3
    return 100.0 + rng.standard_normal((4, 64)) * 0.5  # "offset": the deviations are small next to the mean


STATS: dict[str, tuple[Callable[[Tensor, int | None], Tensor], Callable[[torch.Tensor, int | None], torch.Tensor]]] = {
    "mean": (lambda x, ax: x.mean(ax), lambda t, ax: t.mean() if ax is None else t.mean(ax)),
    "var": (lambda x, ax: x.var(ax), lambda t, ax: t.var() if ax is None else t.var(ax)),
    "std": (lambda x, ax: x.std(ax), lambda t, ax: t.std() if ax is None else t.std(ax)),
    "var0": (
        lambda x, ax: x.var(ax, correction=0),
        lambda t, ax: t.var(correction=0) if ax is None else t.var(ax, correction=0),
    ),
}


@pytest.mark.parametrize("dtype", HALVES, ids=lambda d: d.name)
@pytest.mark.parametrize("kind", ["big", "small", "offset"])
@pytest.mark.parametrize("name", list(STATS))
@pytest.mark.parametrize("axis", [1, None])
def test_statistics_of_16_bit_floats_match_torch(
    xgrad_device: str, dtype: DType, kind: str, name: str, axis: int | None
) -> None:
    x, t = _pair(xgrad_device, dtype, _data(kind))
    fn, torch_fn = STATS[name]
    _close(fn(x, axis), torch_fn(t, axis), dtype)


def test_mean_of_a_thousand_250s_in_float16_is_250(xgrad_device: str) -> None:
    skip_unsupported(xgrad_device, dtypes.float16)
    x = Tensor.full((1000,), 250.0, device=xgrad_device, dtype=dtypes.float16)
    assert x.mean().item() == 250.0 and x.mean().dtype == dtypes.float16
    assert x.sum().item() == float("inf")  # the sum itself does not fit float16 (torch: inf too)


@pytest.mark.parametrize("dtype", HALVES, ids=lambda d: d.name)
@pytest.mark.parametrize("kind", ["big", "small", "offset"])
def test_sum_of_16_bit_floats_matches_torch(xgrad_device: str, dtype: DType, kind: str) -> None:
    x, t = _pair(xgrad_device, dtype, _data(kind) / 16)
    _close(x.sum(1), t.sum(1), dtype)
    _close(x.sum(), t.sum(), dtype)


SOFTMAX: dict[str, tuple[Callable[[Tensor], Tensor], Callable[[torch.Tensor], torch.Tensor]]] = {
    "softmax": (lambda x: x.softmax(-1), lambda t: t.softmax(-1)),
    "log_softmax": (lambda x: x.log_softmax(-1), lambda t: t.log_softmax(-1)),
    "logsumexp": (lambda x: x.logsumexp(-1), lambda t: t.logsumexp(-1)),
    "layernorm": (lambda x: x.layernorm(-1), lambda t: torch.nn.functional.layer_norm(t, t.shape[-1:])),
}


@pytest.mark.parametrize("dtype", HALVES, ids=lambda d: d.name)
@pytest.mark.parametrize("kind", ["small", "offset", "wide"])
@pytest.mark.parametrize("name", list(SOFTMAX))
def test_softmax_family_and_layernorm_of_16_bit_floats_match_torch(
    xgrad_device: str, dtype: DType, kind: str, name: str
) -> None:
    data = rng.uniform(-8, 8, (4, 1000)) if kind == "wide" else _data(kind)
    x, t = _pair(xgrad_device, dtype, data)
    fn, torch_fn = SOFTMAX[name]
    want = torch_fn(t.float() if name == "logsumexp" and dtype == dtypes.bfloat16 else t).to(TORCH[dtype])
    _close(fn(x), want, dtype, atol=1e-6 if name == "softmax" else 2e-3)


@pytest.mark.parametrize("name", ["mean", "var", "layernorm", "softmax"])
def test_16_bit_statistics_gradients_match_torch(xgrad_device: str, name: str) -> None:
    x, t = _pair(xgrad_device, dtypes.float16, _data("offset"))
    fns: dict[str, tuple[Any, Any]] = {
        "mean": (lambda v: v.mean(1), lambda v: v.mean(1)),
        "var": (lambda v: v.var(1), lambda v: v.var(1)),
        "layernorm": (lambda v: v.layernorm(-1), lambda v: torch.nn.functional.layer_norm(v, v.shape[-1:])),
        "softmax": (lambda v: v.softmax(-1), lambda v: v.softmax(-1)),
    }
    fn, torch_fn = fns[name]
    out = fn(x)
    upstream = np.linspace(-1, 1, out.numel(), dtype=np.float32).reshape(out.shape)
    (g,) = out.gradient(x, gradient=Tensor(upstream, device=xgrad_device).cast(dtypes.float16))
    tt = t.float().requires_grad_()  # torch's half gradient: the float32 one rounded
    (want,) = torch.autograd.grad(torch_fn(tt), tt, torch.tensor(upstream))
    assert g.dtype == dtypes.float16
    np.testing.assert_allclose(g.cast(dtypes.float32).numpy(), want.half().float().numpy(), rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("scale", [300.0, 1000.0, 60000.0])
def test_rms_norm_of_float16_squares_in_float32_as_torch(xgrad_device: str, scale: float) -> None:
    # 300 ** 2 = 90000 is above float16's 65504: squaring in float16 would give inf and a result of 0
    from xgrad import nn

    skip_unsupported(xgrad_device, dtypes.float16)
    data = (rng.uniform(-1, 1, (3, 64)) * scale).astype(np.float16)
    layer = nn.RMSNorm(64, eps=1e-6)
    layer.weight = Tensor(np.linspace(0.5, 1.5, 64, dtype=np.float16), device=xgrad_device)
    x = Tensor(data, device=xgrad_device)
    out = layer(x)
    t = torch.tensor(data, requires_grad=True)
    weight = torch.tensor(layer.weight.numpy())
    want = torch.nn.functional.rms_norm(t.float(), (64,), weight.float(), eps=1e-6).half()
    assert out.dtype == dtypes.float16
    got = out.cast(dtypes.float32).numpy()
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want.float().detach().numpy(), rtol=2e-3, atol=2e-3)
    upstream = np.linspace(-1, 1, 3 * 64, dtype=np.float32).reshape(3, 64)
    (g,) = layer(x).gradient(x, gradient=Tensor(upstream, device=xgrad_device).cast(dtypes.float16))
    tt = t.detach().float().requires_grad_()
    (want_g,) = torch.autograd.grad(
        torch.nn.functional.rms_norm(tt, (64,), weight.float(), eps=1e-6), tt, torch.tensor(upstream)
    )
    assert np.isfinite(g.cast(dtypes.float32).numpy()).all()
    np.testing.assert_allclose(g.cast(dtypes.float32).numpy(), want_g.half().float().numpy(), rtol=1e-2, atol=1e-5)
