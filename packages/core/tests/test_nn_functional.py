"""NN functions and losses (`xgrad/mixin/nn.py`): sequential, layernorm, batchnorm, scaled dot-product attention
and the losses, forward and backward against torch.nn.functional on every available device."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch_compare import Fn, check, rand, rand_away, rng, run_docstring, seed_per_test  # noqa: F401  (autouse fixture)

from xgrad.dtype import dtypes
from xgrad.errors import DTypeError, ShapeError, XgradError
from xgrad.helpers import Context
from xgrad.tensor import Tensor
from xgrad.testing import skip_unsupported

REDUCTIONS = ["mean", "sum", "none"]


def labels(shape: tuple[int, ...], classes: int) -> np.ndarray:
    return rng.integers(0, classes, size=shape).astype(np.int32)


def test_sequential_applies_functions_in_order(xgrad_device: str) -> None:
    x = Tensor([1.0, -2.0, 3.0], device=xgrad_device)
    assert x.sequential([lambda t: t * 2, Tensor.relu, lambda t: t - 1]).tolist() == [1.0, -1.0, 5.0]
    assert x.sequential([]).tolist() == [1.0, -2.0, 3.0]


# ---- normalization ----
@pytest.mark.parametrize("axis", [-1, (1, 2)], ids=str)
def test_layernorm_matches_torch(xgrad_device: str, axis: int | tuple[int, ...]) -> None:
    n = 1 if isinstance(axis, int) else len(axis)
    check(
        xgrad_device,
        lambda x: x.layernorm(axis, eps=1e-5),
        lambda x: F.layer_norm(x, x.shape[-n:], eps=1e-5),
        rand((2, 3, 4)),
    )


def test_layernorm_of_half_stays_half(xgrad_device: str) -> None:
    skip_unsupported(xgrad_device, dtypes.float16)
    data = rand((2, 8))
    out = Tensor(data, device=xgrad_device, dtype=dtypes.float16).layernorm()
    assert out.dtype == dtypes.float16
    np.testing.assert_allclose(out.numpy(), F.layer_norm(torch.tensor(data), (8,)).numpy(), atol=5e-3, rtol=5e-3)


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 2, 2)], ids=str)
@pytest.mark.parametrize("affine", [True, False])
def test_batchnorm_matches_torch(xgrad_device: str, shape: tuple[int, ...], affine: bool) -> None:
    c = shape[1]
    x, mean, var = rand(shape), rand((c,)), rand((c,), 0.5, 2.0)
    invstd = (1 / np.sqrt(var + 1e-5)).astype(np.float32)
    weight, bias = rand((c,)), rand((c,))
    laid = (1, c) + (1,) * (len(shape) - 2)
    # torch's own batch_norm for the values; the same formula in torch for the gradient of every input
    want = F.batch_norm(
        torch.tensor(x),
        torch.tensor(mean),
        torch.tensor(var),
        torch.tensor(weight) if affine else None,
        torch.tensor(bias) if affine else None,
        training=False,
        eps=1e-5,
    )
    if affine:
        check(
            xgrad_device,
            lambda x, m, s, w, b: x.batchnorm(w, b, m, s),
            lambda x, m, s, w, b: (x - m.reshape(laid)) * w.reshape(laid) * s.reshape(laid) + b.reshape(laid),
            x,
            mean,
            invstd,
            weight,
            bias,
        )
        got = Tensor(x, device=xgrad_device).batchnorm(
            *(Tensor(a, device=xgrad_device) for a in (weight, bias, mean, invstd))
        )  # noqa: E501
    else:
        check(
            xgrad_device,
            lambda x, m, s: x.batchnorm(None, None, m, s),
            lambda x, m, s: (x - m.reshape(laid)) * s.reshape(laid),
            x,
            mean,
            invstd,
        )
        got = Tensor(x, device=xgrad_device).batchnorm(
            None, None, *(Tensor(a, device=xgrad_device) for a in (mean, invstd))
        )  # noqa: E501
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5, rtol=1e-5)


def test_batchnorm_on_another_axis_and_bad_shapes(xgrad_device: str) -> None:
    x = Tensor(rand((2, 3)), device=xgrad_device)
    out = x.batchnorm(
        None, None, Tensor([1.0, 2.0], device=xgrad_device), Tensor([2.0, 2.0], device=xgrad_device), axis=0
    )  # noqa: E501
    np.testing.assert_allclose(out.numpy(), (x.numpy() - [[1.0], [2.0]]) * 2, rtol=1e-6)
    with pytest.raises(ShapeError, match="does not fit axis"):
        x.batchnorm(None, None, Tensor([1.0, 2.0], device=xgrad_device), Tensor([1.0, 1.0], device=xgrad_device))


# ---- attention ----
SDPA_CASES: list[tuple[str, tuple[int, ...], tuple[int, ...], tuple[int, ...], dict[str, Any]]] = [
    ("plain", (2, 3, 4), (2, 5, 4), (2, 5, 3), {}),
    ("causal_square", (1, 2, 4, 4), (1, 2, 4, 4), (1, 2, 4, 2), {"is_causal": True}),
    ("causal_more_keys", (2, 3, 4), (2, 5, 4), (2, 5, 4), {"is_causal": True}),
    ("gqa", (1, 4, 3, 2), (1, 2, 5, 2), (1, 2, 5, 3), {"enable_gqa": True}),
    ("2d", (3, 4), (5, 4), (5, 2), {}),
]


@pytest.mark.parametrize("name,sq,sk,sv,kw", SDPA_CASES, ids=[c[0] for c in SDPA_CASES])
def test_scaled_dot_product_attention_matches_torch(
    xgrad_device: str, name: str, sq: tuple[int, ...], sk: tuple[int, ...], sv: tuple[int, ...], kw: dict[str, Any]
) -> None:
    check(
        xgrad_device,
        lambda q, k, v: q.scaled_dot_product_attention(k, v, **kw),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw),
        rand(sq),
        rand(sk),
        rand(sv),
    )


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_scaled_dot_product_attention_with_mask_matches_torch(xgrad_device: str, kind: str) -> None:
    mask_np = rng.random((3, 5)) > 0.4
    mask_np[:, 0] = True  # every query sees a key
    mask = torch.tensor(mask_np) if kind == "bool" else torch.tensor(rand((3, 5)).astype(np.float64))
    xmask = (
        Tensor(mask_np, device=xgrad_device) if kind == "bool" else Tensor(mask.float().numpy(), device=xgrad_device)
    )  # noqa: E501
    check(
        xgrad_device,
        lambda q, k, v: q.scaled_dot_product_attention(k, v, attn_mask=xmask),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        rand((2, 3, 4)),
        rand((2, 5, 4)),
        rand((2, 5, 3)),
    )


def test_scaled_dot_product_attention_rejects_bad_arguments(xgrad_device: str) -> None:
    q = Tensor(rand((1, 4, 3, 2)), device=xgrad_device)
    k = Tensor(rand((1, 3, 3, 2)), device=xgrad_device)
    with pytest.raises(ShapeError, match="multiple"):
        q.scaled_dot_product_attention(k, k, enable_gqa=True)
    with pytest.raises(XgradError, match="not both"):
        q.scaled_dot_product_attention(q, q, attn_mask=Tensor([[True]], device=xgrad_device), is_causal=True)
    with pytest.raises(ShapeError, match="at least 2 dims"):
        Tensor([1.0], device=xgrad_device).scaled_dot_product_attention(q, q)


def test_scaled_dot_product_attention_dropout_only_in_training(xgrad_device: str) -> None:
    if not hasattr(Tensor, "dropout"):
        pytest.skip("Tensor.dropout (the random layer) is not there yet")
    q, k, v = (Tensor(rand(s), device=xgrad_device) for s in [(2, 3, 4), (2, 5, 4), (2, 5, 3)])
    plain = q.scaled_dot_product_attention(k, v).numpy()
    np.testing.assert_allclose(q.scaled_dot_product_attention(k, v, dropout_p=0.5).numpy(), plain, rtol=1e-6)
    with Context(TRAINING=1):
        dropped = q.scaled_dot_product_attention(k, v, dropout_p=1.0).numpy()
    np.testing.assert_array_equal(dropped, np.zeros_like(plain))


def test_scaled_dot_product_attention_of_half_is_half(xgrad_device: str) -> None:
    skip_unsupported(xgrad_device, dtypes.float16)
    arrays = [rand((2, 3, 4)), rand((2, 5, 4)), rand((2, 5, 3))]
    q, k, v = (Tensor(a, device=xgrad_device, dtype=dtypes.float16) for a in arrays)
    out = q.scaled_dot_product_attention(k, v)
    assert out.dtype == dtypes.float16
    want = F.scaled_dot_product_attention(*(torch.tensor(a) for a in arrays))
    np.testing.assert_allclose(out.numpy(), want.numpy(), atol=5e-3, rtol=5e-3)


# ---- losses ----
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_crossentropy_matches_torch(xgrad_device: str, reduction: str) -> None:
    y = (rng.random((3, 4)) > 0.5).astype(np.float32)
    check(
        xgrad_device,
        lambda p, t: p.binary_crossentropy(t, reduction),
        lambda p, t: F.binary_cross_entropy(p, t, reduction=reduction),
        rand((3, 4), 0.05, 0.95),
        y,
    )


def test_binary_crossentropy_clamps_the_log_at_minus_100_like_torch(xgrad_device: str) -> None:
    p, y = np.array([0.0, 1.0, 0.5], dtype=np.float32), np.array([1.0, 0.0, 1.0], dtype=np.float32)
    got = Tensor(p, device=xgrad_device).binary_crossentropy(Tensor(y, device=xgrad_device), "none").numpy()
    np.testing.assert_allclose(got, F.binary_cross_entropy(torch.tensor(p), torch.tensor(y), reduction="none"))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_crossentropy_logits_matches_torch(xgrad_device: str, reduction: str) -> None:
    y = rand((3, 4), 0.0, 1.0)  # soft targets too
    check(
        xgrad_device,
        lambda x, t: x.binary_crossentropy_logits(t, reduction),
        lambda x, t: F.binary_cross_entropy_with_logits(x, t, reduction=reduction),
        rand((3, 4), -5, 5),
        y,
    )
    w = rand((4,), 0.5, 3.0)  # torch does not differentiate pos_weight: a constant on both sides
    check(
        xgrad_device,
        lambda x, t: x.binary_crossentropy_logits(t, reduction, pos_weight=Tensor(w, device=xgrad_device)),
        lambda x, t: F.binary_cross_entropy_with_logits(x, t, reduction=reduction, pos_weight=torch.tensor(w)),
        rand((3, 4), -5, 5),
        y,
    )


def test_binary_crossentropy_logits_is_stable_for_huge_logits(xgrad_device: str) -> None:
    x = np.array([-1e4, -100.0, 100.0, 1e4], dtype=np.float32)
    y = np.array([1.0, 0.0, 1.0, 0.0], dtype=np.float32)
    check(
        xgrad_device,
        lambda a, b: a.binary_crossentropy_logits(b, "none"),
        lambda a, b: F.binary_cross_entropy_with_logits(a, b, reduction="none"),
        x,
        y,
        rtol=1e-6,
    )


REDUCTION_SMOOTHING = [("mean", 0.0), ("sum", 0.2), ("none", 0.1)]


@pytest.mark.parametrize("reduction,label_smoothing", REDUCTION_SMOOTHING, ids=str)
def test_sparse_categorical_crossentropy_matches_torch(
    xgrad_device: str, reduction: str, label_smoothing: float
) -> None:  # noqa: E501
    y = labels((2, 3), 5)
    y[0, 1] = -1  # ignored
    yt = torch.tensor(y).long()
    check(
        xgrad_device,
        lambda x: x.sparse_categorical_crossentropy(Tensor(y, device=xgrad_device), -1, label_smoothing, reduction),
        lambda x: F.cross_entropy(
            x.permute(0, 2, 1), yt, ignore_index=-1, label_smoothing=label_smoothing, reduction=reduction
        ),
        rand((2, 3, 5), -3, 3),
    )


def test_sparse_categorical_crossentropy_with_another_ignore_index(xgrad_device: str) -> None:
    y = np.array([0, 3, 2, 3], dtype=np.int32)
    check(
        xgrad_device,
        lambda x: x.sparse_categorical_crossentropy(Tensor(y, device=xgrad_device), ignore_index=3),
        lambda x: F.cross_entropy(x, torch.tensor(y).long(), ignore_index=3),
        rand((4, 4), -3, 3),
    )


@pytest.mark.parametrize("reduction,label_smoothing", REDUCTION_SMOOTHING, ids=str)
@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 2, 2), (3,)], ids=str)
def test_cross_entropy_with_class_indices_matches_torch(
    xgrad_device: str, shape: tuple[int, ...], reduction: str, label_smoothing: float
) -> None:
    c = shape[1] if len(shape) > 1 else shape[0]
    y = labels(shape[:1] + shape[2:] if len(shape) > 1 else (), c)
    check(
        xgrad_device,
        lambda x: x.cross_entropy(Tensor(y, device=xgrad_device), reduction, label_smoothing),
        lambda x: F.cross_entropy(x, torch.tensor(y).long(), reduction=reduction, label_smoothing=label_smoothing),
        rand(shape, -3, 3),
    )


@pytest.mark.parametrize("reduction,label_smoothing", REDUCTION_SMOOTHING, ids=str)
def test_cross_entropy_with_class_probabilities_matches_torch(
    xgrad_device: str, reduction: str, label_smoothing: float
) -> None:
    probs = rng.dirichlet(np.ones(3), size=(2, 4)).transpose(0, 2, 1).astype(np.float32)  # (N=2, C=3, 4)
    check(
        xgrad_device,
        lambda x, p: x.cross_entropy(p, reduction, label_smoothing),
        lambda x, p: F.cross_entropy(x, p, reduction=reduction, label_smoothing=label_smoothing),
        rand((2, 3, 4), -3, 3),
        probs,
    )


def test_cross_entropy_is_stable_for_huge_logits(xgrad_device: str) -> None:
    x = np.array([[1e4, 0.0, -1e4], [-1e4, -1e4, -1e4 + 5]], dtype=np.float32)
    y = np.array([1, 2], dtype=np.int32)
    check(
        xgrad_device,
        lambda a: a.cross_entropy(Tensor(y, device=xgrad_device), "none"),
        lambda a: F.cross_entropy(a, torch.tensor(y).long(), reduction="none"),
        x,
        rtol=1e-6,
    )


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 2), (3,)], ids=str)
def test_nll_loss_matches_torch(xgrad_device: str, shape: tuple[int, ...]) -> None:
    c = shape[1] if len(shape) > 1 else shape[0]
    y = labels(shape[:1] + shape[2:] if len(shape) > 1 else (), c)
    yt = torch.tensor(y).long()
    logp = np.log(rng.dirichlet(np.ones(c), size=shape[:1] + shape[2:] if len(shape) > 1 else ())).astype(np.float32)
    logp = np.moveaxis(logp, -1, 1) if len(shape) > 1 else logp
    ignore = int(y.reshape(-1)[-1]) if len(shape) > 1 else -100  # a 1-d input has one label: ignore nothing
    w = rand((c,), 0.5, 2.0)  # torch does not differentiate the weight: a constant on both sides
    for reduction, weighted in [("mean", False), ("mean", True), ("sum", True), ("none", False)]:
        xw, tw = (Tensor(w, device=xgrad_device), torch.tensor(w).double()) if weighted else (None, None)
        xi, ti = (ignore, ignore) if weighted else (None, -100)
        check(
            xgrad_device,
            lambda x, r=reduction, xw=xw, xi=xi: x.nll_loss(Tensor(y, device=xgrad_device), xw, xi, r),
            lambda x, r=reduction, tw=tw, ti=ti: F.nll_loss(x, yt, tw, ignore_index=ti, reduction=r),
            logp,
        )


def test_nll_loss_with_every_label_ignored_is_nan_with_zero_gradient(xgrad_device: str) -> None:
    check(
        xgrad_device,
        lambda x: x.nll_loss(Tensor([1, 1], device=xgrad_device), ignore_index=1),
        lambda x: F.nll_loss(x, torch.tensor([1, 1]), ignore_index=1),
        rand((2, 3), -3, -0.1),
    )


def test_losses_reject_bad_arguments(xgrad_device: str) -> None:
    x = Tensor(rand((2, 3)), device=xgrad_device)
    y = Tensor([0, 1], device=xgrad_device)
    with pytest.raises(XgradError, match="reduction"):
        x.cross_entropy(y, reduction="avg")
    with pytest.raises(XgradError, match="reduction"):
        x.binary_crossentropy_logits(x, reduction="max")
    with pytest.raises(XgradError, match="label_smoothing"):
        x.cross_entropy(y, label_smoothing=1.5)
    with pytest.raises(DTypeError, match="int tensor"):
        x.sparse_categorical_crossentropy(Tensor([0.0, 1.0], device=xgrad_device))
    with pytest.raises(ShapeError, match="do not fit"):
        x.cross_entropy(Tensor([0, 1, 2], device=xgrad_device))
    with pytest.raises(ShapeError, match="match the logits"):
        x.cross_entropy(Tensor(rand((2, 4)), device=xgrad_device))
    with pytest.raises(ShapeError, match="classes last"):
        x.sparse_categorical_crossentropy(Tensor([[0, 1]], device=xgrad_device))


# ---- docstrings ----
DOC_NAMES = [
    *["sequential", "layernorm", "batchnorm", "scaled_dot_product_attention", "binary_crossentropy"],
    *["binary_crossentropy_logits", "sparse_categorical_crossentropy", "cross_entropy", "nll_loss"],
]


@pytest.mark.parametrize("name", DOC_NAMES)
def test_docstring_example_runs_for_method(name: str) -> None:
    run_docstring(name)
