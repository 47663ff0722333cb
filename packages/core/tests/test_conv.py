"""Convolution, pooling and resampling (`xgrad/mixin/conv.py`): forward and backward against torch.nn.functional on
every available device, over 1-d, 2-d and 3-d inputs with groups, stride, dilation and padding."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch_compare import run_docstring

from xgrad.dtype import dtypes
from xgrad.errors import ShapeError, XgradError
from xgrad.tensor import Tensor
from xgrad.testing import skip_unsupported

rng = np.random.default_rng(0)
TORCH_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
TORCH_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
TORCH_AVG = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
TORCH_MAX = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
TORCH_UNPOOL = {1: F.max_unpool1d, 2: F.max_unpool2d, 3: F.max_unpool3d}
TORCH_LINEAR = {1: "linear", 2: "bilinear", 3: "trilinear"}


def rand(*shape: int) -> np.ndarray:
    return np.asarray(rng.uniform(-2.0, 2.0, size=shape), dtype=np.float32)


def check(
    device: str,
    fn: Callable[..., Any],
    torch_fn: Callable[..., Any],
    *arrays: np.ndarray,
    atol: float = 1e-4,
) -> None:
    """Forward and the gradients of every input, with a random upstream gradient, against torch in float64."""
    xs = [Tensor(a, device=device, requires_grad=True) for a in arrays]  # a 0-d one: a buffer, not a constant
    ts = [torch.tensor(a.astype(np.float64), requires_grad=True) for a in arrays]
    out = fn(*xs)
    want = torch_fn(*ts)
    assert out.shape == tuple(want.shape), f"forward shape {out.shape} != torch {tuple(want.shape)}"
    upstream = rand(*out.shape)
    grads = out.gradient(*xs, gradient=Tensor(upstream, device=device))
    out.realize(*grads)  # one schedule for the forward and every gradient
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), atol=atol, rtol=atol)
    want_grads = torch.autograd.grad(want, ts, torch.tensor(upstream.astype(np.float64)), allow_unused=True)
    for i, (g, wg, x) in enumerate(zip(grads, want_grads, xs)):
        assert g.shape == x.shape, f"grad {i} shape {g.shape} != input shape {x.shape}"
        expected = np.zeros(x.shape) if wg is None else wg.numpy()
        np.testing.assert_allclose(g.numpy(), expected, atol=atol, rtol=atol, err_msg=f"gradient of input {i}")


def spatial(n: int) -> tuple[int, ...]:
    return {1: (7,), 2: (4, 5), 3: (3, 4, 3)}[n]


def batch(n: int) -> int:
    return 2 if n == 1 else 1


# ---- conv2d ----
CONV_CASES = [
    # (spatial dims, c_in, c_out, kernel, groups, stride, dilation, padding)
    (1, 3, 2, (3,), 1, 1, 1, 0),
    (1, 4, 6, (2,), 2, 2, 2, 1),
    (2, 3, 2, (3, 3), 1, 1, 1, 0),
    (2, 2, 2, (2, 3), 1, (2, 1), (1, 2), (1, 2)),
    (2, 4, 4, (3, 2), 4, 2, 1, 1),
    (2, 2, 3, (1, 1), 1, 3, 1, 0),
    (3, 2, 2, (2, 2, 2), 1, 1, 1, 1),
    (3, 4, 2, (2, 3, 1), 2, (1, 2, 1), (2, 1, 1), 0),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"{c[0]}d-k{c[3]}-g{c[4]}-s{c[5]}-d{c[6]}-p{c[7]}")
def test_conv2d_matches_torch_forward_and_backward(xgrad_device: str, case: tuple[Any, ...]) -> None:
    n, cin, cout, k, groups, stride, dilation, padding = case
    x, w = rand(batch(n), cin, *spatial(n)), rand(cout, cin // groups, *k)
    arrays = (x, w, rand(cout)) if CONV_CASES.index(case) % 2 == 0 else (x, w)
    check(
        xgrad_device,
        lambda x, w, b=None: x.conv2d(w, b, groups=groups, stride=stride, dilation=dilation, padding=padding),
        lambda x, w, b=None: TORCH_CONV[n](x, w, b, groups=groups, stride=stride, dilation=dilation, padding=padding),
        *arrays,
    )


def test_conv2d_per_side_padding_matches_torch_pad(xgrad_device: str) -> None:
    # flat padding in F.pad order: (left, right, top, bottom)
    pads = (1, 0, 2, 1)
    check(
        xgrad_device,
        lambda x, w: x.conv2d(w, padding=pads),
        lambda x, w: F.conv2d(F.pad(x, pads), w),
        rand(1, 2, 4, 5),
        rand(3, 2, 2, 2),
    )


def test_conv2d_dtype_accumulates_and_returns_it(xgrad_device: str) -> None:
    skip_unsupported(xgrad_device, dtypes.float16)
    x, w = rand(1, 2, 4, 4), rand(2, 2, 3, 3)
    out = Tensor(x, device=xgrad_device, dtype=dtypes.float16).conv2d(
        Tensor(w, device=xgrad_device, dtype=dtypes.float16), dtype=dtypes.float32
    )
    assert out.dtype == dtypes.float32
    want = F.conv2d(torch.tensor(x).half().float(), torch.tensor(w).half().float()).numpy()
    np.testing.assert_allclose(out.numpy(), want, atol=1e-2, rtol=1e-2)  # products are float16


def test_conv2d_int_inputs_stay_int(xgrad_device: str) -> None:
    x = rng.integers(-3, 4, size=(1, 2, 4, 5)).astype(np.int32)
    w = rng.integers(-3, 4, size=(3, 2, 2, 2)).astype(np.int32)
    out = Tensor(x, device=xgrad_device).conv2d(Tensor(w, device=xgrad_device), padding=1)
    want = F.conv2d(torch.tensor(x).double(), torch.tensor(w).double(), padding=1).numpy()
    assert dtypes.is_int(out.dtype)
    np.testing.assert_array_equal(out.numpy(), want.astype(np.int64))


def test_conv2d_zero_batch_gives_empty_output(xgrad_device: str) -> None:
    out = Tensor(rand(0, 2, 4, 4), device=xgrad_device).conv2d(Tensor(rand(3, 2, 2, 2), device=xgrad_device))
    assert out.shape == (0, 3, 3, 3)
    assert out.numpy().shape == (0, 3, 3, 3)


def test_conv2d_bad_shapes_raise_shape_error() -> None:
    x = Tensor(rand(1, 3, 4, 4))
    with pytest.raises(ShapeError, match=r"\(1, 3, 4, 4\)"):
        x.conv2d(Tensor(rand(2, 2, 3, 3)))
    with pytest.raises(ShapeError, match="groups"):
        x.conv2d(Tensor(rand(2, 1, 3, 3)), groups=2)
    with pytest.raises(ShapeError, match="does not fit"):
        x.conv2d(Tensor(rand(2, 3, 5, 5)))
    with pytest.raises(ShapeError, match="spatial"):
        x.conv2d(Tensor(rand(2, 3, 3)))


# ---- conv_transpose2d ----
CONV_T_CASES = [
    # (spatial dims, c_in, c_out, kernel, groups, stride, dilation, padding, output_padding)
    (1, 2, 3, (3,), 1, 1, 1, 0, 0),
    (1, 4, 2, (2,), 2, 3, 1, 1, 2),
    (2, 2, 3, (3, 3), 1, 2, 1, 1, 1),
    (2, 2, 2, (2, 3), 2, (1, 2), (2, 1), (0, 1), (0, 1)),
    (3, 2, 2, (2, 2, 2), 1, 2, 1, 0, (1, 0, 1)),
]


@pytest.mark.parametrize("case", CONV_T_CASES, ids=lambda c: f"{c[0]}d-k{c[3]}-g{c[4]}-s{c[5]}-d{c[6]}-p{c[7]}")
def test_conv_transpose2d_matches_torch_forward_and_backward(xgrad_device: str, case: tuple[Any, ...]) -> None:
    n, cin, cout, k, groups, stride, dilation, padding, out_pad = case
    small = tuple(max(2, s - 2) for s in spatial(n))
    check(
        xgrad_device,
        lambda x, w, b: x.conv_transpose2d(w, b, groups, stride, dilation, padding, out_pad),
        lambda x, w, b: TORCH_CONV_T[n](x, w, b, stride, padding, out_pad, groups, dilation),
        rand(batch(n), cin, *small),
        rand(cin, cout // groups, *k),
        rand(cout),
    )


# ---- pooling ----
AVG_CASES = [
    # (spatial dims, kernel, stride, padding, ceil_mode, count_include_pad)
    (1, (3,), None, 0, False, True),
    (1, (2,), 1, 1, True, False),
    (2, (2, 2), None, 0, False, True),
    (2, (3, 2), (2, 1), (1, 1), False, False),
    (2, (3, 3), 2, 1, True, True),
    (2, (2, 3), 2, (1, 0), True, False),
    (3, (2, 2, 2), None, 0, True, True),
    (3, (3, 2, 2), (2, 1, 2), 1, False, False),
]


@pytest.mark.parametrize("case", AVG_CASES, ids=lambda c: f"{c[0]}d-k{c[1]}-s{c[2]}-p{c[3]}-ceil{c[4]}-inc{c[5]}")
def test_avg_pool2d_matches_torch_forward_and_backward(xgrad_device: str, case: tuple[Any, ...]) -> None:
    n, k, stride, padding, ceil_mode, include = case
    check(
        xgrad_device,
        lambda x: x.avg_pool2d(k, stride, 1, padding, ceil_mode, include),
        lambda x: TORCH_AVG[n](x, k, stride, padding, ceil_mode, include),
        rand(batch(n), 2, *spatial(n)),
    )


def test_avg_pool2d_dilation_matches_strided_conv(xgrad_device: str) -> None:
    # torch's avg_pool has no dilation: compare with a depthwise conv of an all-ones kernel
    check(
        xgrad_device,
        lambda x: x.avg_pool2d((2, 3), 1, (2, 1), 0),
        lambda x: F.conv2d(x, torch.ones(2, 1, 2, 3, dtype=x.dtype), stride=1, dilation=(2, 1), groups=2) / 6,
        rand(1, 2, 5, 6),
    )


def test_avg_pool2d_int_input_gives_float(xgrad_device: str) -> None:
    out = Tensor([[[[1, 2], [3, 5]]]], device=xgrad_device).avg_pool2d()
    assert dtypes.is_float(out.dtype)
    assert out.tolist() == [[[[2.75]]]]


MAX_CASES = [
    # (spatial dims, kernel, stride, dilation, padding, ceil_mode)
    (1, (3,), None, 1, 0, False),
    (1, (2,), 1, 2, 1, True),
    (2, (2, 2), None, 1, 0, False),
    (2, (3, 2), (2, 1), 1, 1, True),
    (2, (2, 2), 1, (2, 1), (1, 0), False),
    (2, (3, 3), 2, 1, 1, True),
    (3, (2, 2, 2), None, 1, 0, True),
    (3, (2, 3, 2), (1, 2, 1), (1, 1, 2), 1, False),
]


@pytest.mark.parametrize("case", MAX_CASES, ids=lambda c: f"{c[0]}d-k{c[1]}-s{c[2]}-d{c[3]}-p{c[4]}-ceil{c[5]}")
def test_max_pool2d_matches_torch_forward_backward_and_indices(xgrad_device: str, case: tuple[Any, ...]) -> None:
    n, k, stride, dilation, padding, ceil_mode = case
    x = rand(batch(n), 2, *spatial(n))
    check(
        xgrad_device,
        lambda x: x.max_pool2d(k, stride, dilation, padding, ceil_mode),
        lambda x: TORCH_MAX[n](x, k, stride, padding, dilation, ceil_mode),
        x,
    )
    values, indices = Tensor(x, device=xgrad_device).max_pool2d(k, stride, dilation, padding, ceil_mode, True)
    want, want_idx = TORCH_MAX[n](torch.tensor(x), k, stride, padding, dilation, ceil_mode, return_indices=True)
    np.testing.assert_array_equal(indices.numpy(), want_idx.numpy())
    np.testing.assert_allclose(values.numpy(), want.numpy())


def test_max_pool2d_ties_pick_first_index(xgrad_device: str) -> None:
    x = Tensor([[[[1.0, 1.0, 2.0, 2.0], [1.0, 0.0, 2.0, 2.0]]]], device=xgrad_device)
    values, indices = x.max_pool2d(return_indices=True)
    assert values.tolist() == [[[[1.0, 2.0]]]]
    assert indices.tolist() == [[[[0, 2]]]]


@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.uint8, dtypes.float16], ids=lambda d: d.name)
def test_max_pool2d_keeps_dtype_with_padding(xgrad_device: str, dtype: Any) -> None:
    skip_unsupported(xgrad_device, dtype)
    x = rng.integers(0, 100, size=(1, 2, 4, 5))
    out = Tensor(x, device=xgrad_device, dtype=dtype).max_pool2d(3, 2, padding=1)
    want = F.max_pool2d(torch.tensor(x).double(), 3, 2, padding=1).numpy()
    assert out.dtype == dtype
    np.testing.assert_array_equal(out.numpy(), want)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_max_unpool2d_inverts_torch_max_pool(xgrad_device: str, n: int) -> None:
    k = (2,) * n
    x = torch.tensor(rand(batch(n), 2, *(4,) * n).astype(np.float64))
    pooled, idx = TORCH_MAX[n](x, k, return_indices=True)
    want = TORCH_UNPOOL[n](pooled, idx, k, output_size=(5,) * n)
    got = Tensor(pooled.numpy().astype(np.float32), device=xgrad_device).max_unpool2d(
        Tensor(idx.numpy().astype(np.int32), device=xgrad_device), k, output_size=(5,) * n
    )
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-6)
    pooled_x = Tensor(pooled.numpy().astype(np.float32), device=xgrad_device)
    default = pooled_x.max_unpool2d(Tensor(idx.numpy().astype(np.int32), device=xgrad_device), k)
    assert default.shape == tuple(TORCH_UNPOOL[n](pooled, idx, k).shape)


def test_max_unpool2d_padding_sets_default_output_size(xgrad_device: str) -> None:
    x = Tensor([[[[1.0, 2.0], [3.0, 4.0]]]], device=xgrad_device)
    out = x.max_unpool2d(Tensor([[[[0, 1], [2, 3]]]], device=xgrad_device), (2, 2), 2, padding=(0, 1))
    assert out.shape == tuple(
        F.max_unpool2d(torch.ones(1, 1, 2, 2), torch.zeros(1, 1, 2, 2).long(), 2, 2, (0, 1)).shape
    )
    assert out.tolist() == [[[[1.0, 2.0], [3.0, 4.0], [0.0, 0.0], [0.0, 0.0]]]]


def test_max_unpool2d_backward_matches_torch(xgrad_device: str) -> None:
    x = torch.tensor(rand(1, 2, 4, 4).astype(np.float64))
    _, idx = F.max_pool2d(x, 2, return_indices=True)
    idx_x = Tensor(idx.numpy().astype(np.int32), device=xgrad_device)
    check(
        xgrad_device,
        lambda v: v.max_unpool2d(idx_x, (2, 2), 2, output_size=(5, 5)),
        lambda v: F.max_unpool2d(v, idx, 2, 2, output_size=(5, 5)),
        rand(1, 2, 2, 2),
    )


def test_pool_kernel_larger_than_input_raises_shape_error() -> None:
    with pytest.raises(ShapeError, match="pad the input"):
        Tensor(rand(1, 1, 2, 2)).max_pool2d(3)
    with pytest.raises(ShapeError, match="stride"):
        Tensor(rand(1, 1, 4, 4)).avg_pool2d((2, 2), (1, 1, 1))


# ---- interpolate ----
INTERP_CASES = [
    # (input spatial, output size)
    ((5,), (8,)),
    ((6,), (4,)),
    ((4, 5), (7, 3)),
    ((3, 4), (3, 6)),
    ((3, 2, 4), (4, 3, 2)),
]


@pytest.mark.parametrize("sizes", INTERP_CASES, ids=lambda c: f"{c[0]}->{c[1]}")
@pytest.mark.parametrize("align_corners", [False, True], ids=["edges", "corners"])
def test_interpolate_linear_matches_torch(xgrad_device: str, sizes: tuple[Any, ...], align_corners: bool) -> None:
    src, dst = sizes
    check(
        xgrad_device,
        lambda x: x.interpolate(dst, "linear", align_corners),
        lambda x: F.interpolate(x, dst, mode=TORCH_LINEAR[len(dst)], align_corners=align_corners),
        rand(1, 2, *src),
    )


@pytest.mark.parametrize("sizes", INTERP_CASES[1:4], ids=lambda c: f"{c[0]}->{c[1]}")
@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
def test_interpolate_nearest_matches_torch(xgrad_device: str, sizes: tuple[Any, ...], mode: str) -> None:
    src, dst = sizes
    check(
        xgrad_device,
        lambda x: x.interpolate(dst, mode),
        lambda x: F.interpolate(x, dst, mode=mode),
        rand(1, 2, *src),
    )


@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.bool, dtypes.uint8], ids=lambda d: d.name)
def test_interpolate_nearest_keeps_dtype(xgrad_device: str, dtype: Any) -> None:
    x = rng.integers(0, 2 if dtype == dtypes.bool else 50, size=(1, 1, 3, 4))
    out = Tensor(x, device=xgrad_device, dtype=dtype).interpolate((5, 2), "nearest")
    want = F.interpolate(torch.tensor(x).double(), (5, 2), mode="nearest").numpy()
    assert out.dtype == dtype
    np.testing.assert_array_equal(out.numpy().astype(np.float64), want)


def test_interpolate_nearest_ignores_inf_in_rows_not_picked(xgrad_device: str) -> None:
    x = Tensor([[1.0, float("inf"), 3.0, 4.0]], device=xgrad_device)
    assert x.interpolate((2,), "nearest").tolist() == [[1.0, 3.0]]


def test_interpolate_bad_arguments_raise() -> None:
    with pytest.raises(XgradError, match="bicubic"):
        Tensor(rand(1, 1, 4)).interpolate((3,), "bicubic")
    with pytest.raises(ShapeError, match="trailing"):
        Tensor(rand(4)).interpolate((3, 3))


# ---- docstrings ----
@pytest.mark.parametrize(
    "name", ["conv2d", "conv_transpose2d", "avg_pool2d", "max_pool2d", "max_unpool2d", "interpolate"]
)
def test_docstring_example_runs_for_method(name: str) -> None:
    run_docstring(name)
