"""Linear algebra (`xgrad/mixin/linalg.py`): dot, linear, einsum, tril/triu, normalize, qr, svd and newton_schulz,
forward and backward against torch on every available device."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch_compare import run_docstring

from xgrad.dtype import DType, dtypes
from xgrad.errors import ShapeError, XgradError
from xgrad.tensor import Tensor
from xgrad.testing import skip_unsupported

rng = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray:
    return np.asarray(rng.uniform(-2.0, 2.0, size=shape), dtype=np.float32)


def check(
    device: str,
    fn: Callable[..., Any],
    torch_fn: Callable[..., Any] | None,
    *arrays: np.ndarray,
    atol: float = 1e-4,
    dtype: DType = dtypes.float32,
) -> None:
    """Forward and the gradient of every input (random upstream gradient) against torch in float64."""
    xs = [Tensor(a, device=device, dtype=dtype, requires_grad=True) for a in arrays]  # 0-d: a buffer
    ts = [torch.tensor(a.astype(np.float64), requires_grad=True) for a in arrays]
    out = fn(*xs)
    want = (torch_fn or fn)(*ts)
    assert out.shape == tuple(want.shape), f"forward shape {out.shape} != torch {tuple(want.shape)}"
    upstream = rand(*out.shape)
    grads = out.gradient(*xs, gradient=Tensor(upstream, device=device))
    out.realize(*grads)
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), atol=atol, rtol=atol)
    want_grads = torch.autograd.grad(want, ts, torch.tensor(upstream.astype(np.float64)), allow_unused=True)
    for i, (g, wg, x) in enumerate(zip(grads, want_grads, xs)):
        assert g.shape == x.shape and g.dtype == x.dtype, f"grad {i}: {g.shape} {g.dtype} for {x.shape} {x.dtype}"
        expected = np.zeros(x.shape) if wg is None else wg.numpy()
        np.testing.assert_allclose(g.numpy(), expected, atol=atol, rtol=atol, err_msg=f"gradient of input {i}")


# ---- dot / matmul / linear ----
DOT_SHAPES = [
    ((3,), (3,)),
    ((2, 3), (3,)),
    ((3,), (3, 4)),
    ((2, 3), (3, 4)),
    ((2, 1, 2, 3), (3, 3, 2)),
    ((0, 3), (3, 2)),
]


@pytest.mark.parametrize("shapes", DOT_SHAPES, ids=str)
def test_dot_matches_torch_matmul(xgrad_device: str, shapes: tuple[tuple[int, ...], ...]) -> None:
    a, b = shapes
    check(xgrad_device, lambda x, w: x.dot(w), torch.matmul, rand(*a), rand(*b))


def test_dot_dtype_sets_accumulation_and_result(xgrad_device: str) -> None:
    skip_unsupported(xgrad_device, dtypes.float16)
    a, b = rand(2, 3), rand(3, 2)
    x, w = Tensor(a, device=xgrad_device, dtype=dtypes.float16), Tensor(b, device=xgrad_device, dtype=dtypes.float16)
    out = x.dot(w, dtype=dtypes.float32)
    assert out.dtype == dtypes.float32
    want = torch.tensor(a).half().float() @ torch.tensor(b).half().float()
    np.testing.assert_allclose(out.numpy(), want.numpy(), atol=1e-5, rtol=1e-5)
    assert x.dot(w).dtype == dtypes.float16


@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.int8, dtypes.float16], ids=lambda d: d.name)
def test_dot_keeps_input_dtype(xgrad_device: str, dtype: DType) -> None:
    skip_unsupported(xgrad_device, dtype)
    a, b = rng.integers(-3, 4, size=(2, 3)), rng.integers(-3, 4, size=(3, 2))
    out = Tensor(a, device=xgrad_device, dtype=dtype).dot(Tensor(b, device=xgrad_device, dtype=dtype))
    assert out.dtype == dtype
    np.testing.assert_array_equal(out.numpy(), a @ b)


def test_linear_uses_in_out_weight_and_bias(xgrad_device: str) -> None:
    check(xgrad_device, lambda x, w, b: x.linear(w, b), lambda x, w, b: x @ w + b, rand(2, 3), rand(3, 4), rand(4))
    check(xgrad_device, lambda x, w: x.linear(w), lambda x, w: x * w, rand(2, 3), rand(3))


def test_dot_shape_mismatch_names_both_shapes() -> None:
    with pytest.raises(ShapeError, match=r"\(2, 3\).*\(4, 2\)"):
        Tensor(rand(2, 3)).dot(Tensor(rand(4, 2)))


# ---- einsum ----
EINSUM_CASES = [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("ij,jk", [(2, 3), (3, 4)]),
    ("ij->ji", [(2, 3)]),
    ("ba", [(2, 3)]),
    ("ii->i", [(3, 3)]),
    ("ii", [(3, 3)]),
    ("iij->ji", [(2, 2, 3)]),
    ("bij,bjk->bik", [(2, 2, 3), (2, 3, 2)]),
    ("...ij,...jk->...ik", [(2, 2, 3), (3, 2)]),
    ("i...,i->...", [(3, 2, 2), (3,)]),
    ("...i,...i", [(2, 3), (1, 3)]),
    ("i,j->ij", [(2,), (3,)]),
    ("ijk->", [(2, 3, 2)]),
    ("ij,ij->ij", [(2, 3), (2, 3)]),
    ("ij,jk,kl->il", [(2, 2), (2, 3), (3, 2)]),
    (",i->i", [(), (3,)]),
    ("i j , j k -> i k", [(2, 3), (3, 2)]),
    ("Ab,bA->A", [(2, 3), (3, 2)]),
]


@pytest.mark.parametrize("case", EINSUM_CASES, ids=lambda c: c[0].replace(" ", ""))
def test_einsum_matches_torch(xgrad_device: str, case: tuple[str, list[tuple[int, ...]]]) -> None:
    formula, shapes = case
    check(
        xgrad_device,
        lambda *xs: Tensor.einsum(formula, *xs),
        lambda *xs: torch.einsum(formula, *xs),
        *(rand(*s) for s in shapes),
    )


def test_einsum_accepts_a_list_and_dtype(xgrad_device: str) -> None:
    a, b = Tensor([[1, 2], [3, 4]], device=xgrad_device), Tensor([1, 1], device=xgrad_device)
    assert Tensor.einsum("ij,j->i", [a, b]).tolist() == [3, 7]
    out = Tensor.einsum("ij,j->i", a.cast(dtypes.int8), b.cast(dtypes.int8), dtype=dtypes.int32)
    assert out.dtype == dtypes.int32 and out.tolist() == [3, 7]


def test_einsum_bad_formulas_raise() -> None:
    x = Tensor(rand(2, 3))
    with pytest.raises(XgradError, match="2 operands"):
        Tensor.einsum("ij,jk->ik", x)
    with pytest.raises(ShapeError, match="sizes 3 and 2"):
        Tensor.einsum("ij,ij->i", x, Tensor(rand(2, 2)))
    with pytest.raises(ShapeError, match="3 indices but 2 dimensions"):
        Tensor.einsum("ijk->i", x)
    with pytest.raises(XgradError, match="appear in an input"):
        Tensor.einsum("ij->k", x)
    with pytest.raises(ShapeError, match="repeated index"):
        Tensor.einsum("ii->i", x)


# ---- tril / triu ----
@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 3), (0, 2)], ids=str)
@pytest.mark.parametrize("diagonal", [-1, 2])
def test_tril_triu_match_torch(xgrad_device: str, shape: tuple[int, ...], diagonal: int) -> None:
    check(xgrad_device, lambda x: x.tril(diagonal), lambda x: torch.tril(x, diagonal), rand(*shape))
    check(xgrad_device, lambda x: x.triu(diagonal), lambda x: torch.triu(x, diagonal), rand(*shape))


@pytest.mark.parametrize("dtype", [dtypes.bool, dtypes.int32, dtypes.uint8], ids=lambda d: d.name)
def test_tril_triu_keep_dtype(xgrad_device: str, dtype: DType) -> None:
    a = rng.integers(0, 2 if dtype == dtypes.bool else 9, size=(3, 4))
    x = Tensor(a, device=xgrad_device, dtype=dtype)
    assert x.tril().dtype == dtype and x.triu(1).dtype == dtype
    np.testing.assert_array_equal(x.tril().numpy(), np.tril(a).astype(x.numpy().dtype))
    np.testing.assert_array_equal(x.triu(1).numpy(), np.triu(a, 1).astype(x.numpy().dtype))


def test_tril_of_vector_raises_shape_error() -> None:
    with pytest.raises(ShapeError, match=r"\(3,\)"):
        Tensor([1, 2, 3]).tril()


# ---- normalize ----
@pytest.mark.parametrize("p_dim", [(2.0, 1), (1.0, -1), (3.0, 0), (float("inf"), 1)], ids=str)
def test_normalize_matches_torch(xgrad_device: str, p_dim: tuple[float, int]) -> None:
    p, dim = p_dim
    check(
        xgrad_device,
        lambda x: x.normalize(p, dim),
        lambda x: torch.nn.functional.normalize(x, p, dim),
        rand(2, 3, 2),
    )


def test_normalize_zero_row_stays_zero(xgrad_device: str) -> None:
    assert Tensor([[0.0, 0.0], [0.0, 5.0]], device=xgrad_device).normalize().tolist() == [[0.0, 0.0], [0.0, 1.0]]


# ---- qr ----
@pytest.mark.parametrize("shape", [(3, 3), (4, 2), (2, 4), (2, 3, 3), (1, 1)], ids=str)
def test_qr_matches_torch_complete_mode(xgrad_device: str, shape: tuple[int, ...]) -> None:
    a = rand(*shape)
    q, r = Tensor(a, device=xgrad_device).qr()
    want_q, want_r = torch.linalg.qr(torch.tensor(a.astype(np.float64)), mode="complete")
    assert q.shape == tuple(want_q.shape) and r.shape == tuple(want_r.shape)
    np.testing.assert_allclose(r.numpy(), want_r.numpy(), atol=1e-5)
    k = min(shape[-2:])  # Q's columns past min(m, n) are any orthonormal completion
    np.testing.assert_allclose(q.numpy()[..., :k], want_q.numpy()[..., :k], atol=1e-5)
    np.testing.assert_allclose(q.numpy() @ r.numpy(), a, atol=1e-5)
    eye = np.eye(shape[-2])
    np.testing.assert_allclose(np.swapaxes(q.numpy(), -1, -2) @ q.numpy(), np.broadcast_to(eye, q.shape), atol=1e-5)


def test_qr_gradient_matches_torch_for_square_matrix(xgrad_device: str) -> None:
    check(xgrad_device, lambda x: x.qr()[0], lambda x: torch.linalg.qr(x)[0], rand(3, 3), atol=1e-3)
    check(xgrad_device, lambda x: x.qr()[1], lambda x: torch.linalg.qr(x)[1], rand(3, 3), atol=1e-3)


def test_qr_keeps_column_with_zeros_below_diagonal(xgrad_device: str) -> None:
    q, r = Tensor([[-2.0, 1.0], [0.0, 3.0]], device=xgrad_device).qr()
    assert r.tolist() == [[-2.0, 1.0], [0.0, 3.0]]
    assert q.tolist() == [[1.0, 0.0], [0.0, 1.0]]


def test_qr_of_int_matrix_is_float64_exact(xgrad_device: str) -> None:
    skip_unsupported(xgrad_device, dtypes.float64)
    q, r = Tensor([[3, 1], [4, 2]], device=xgrad_device).cast(dtypes.float64).qr()
    assert q.dtype == dtypes.float64
    np.testing.assert_allclose(r.numpy(), [[-5.0, -2.2], [0.0, 0.4]], atol=1e-12)


# ---- svd ----
def assert_orthonormal_columns(m: np.ndarray) -> None:
    gram = np.swapaxes(m, -1, -2) @ m
    np.testing.assert_allclose(gram, np.broadcast_to(np.eye(m.shape[-1]), gram.shape), atol=1e-5)


SVD_CASES = [((3, 3), True), ((3, 3), False), ((4, 2), True), ((2, 3), False), ((2, 3, 2), True), ((1, 3), False)]


@pytest.mark.parametrize("case", SVD_CASES, ids=lambda c: f"{c[0]}-{'full' if c[1] else 'reduced'}")
def test_svd_matches_torch(xgrad_device: str, case: tuple[tuple[int, ...], bool]) -> None:
    shape, full = case
    a = rand(*shape)
    u, s, v = Tensor(a, device=xgrad_device).svd(full_matrices=full)
    u.realize(s, v)
    want_u, want_s, want_vh = torch.linalg.svd(torch.tensor(a.astype(np.float64)), full_matrices=full)
    assert u.shape == tuple(want_u.shape) and s.shape == tuple(want_s.shape)
    assert v.shape == tuple(want_vh.transpose(-1, -2).shape)
    un, sn, vn = u.numpy(), s.numpy(), v.numpy()
    np.testing.assert_allclose(sn, want_s.numpy(), atol=1e-5)
    k = sn.shape[-1]
    np.testing.assert_allclose((un[..., :k] * sn[..., None, :]) @ np.swapaxes(vn[..., :k], -1, -2), a, atol=1e-5)
    assert_orthonormal_columns(un)
    assert_orthonormal_columns(vn)
    # singular vectors agree with torch up to the sign of each pair
    want_v = want_vh.transpose(-1, -2).numpy()
    signs = np.sign(np.sum(un[..., :k] * want_u.numpy()[..., :k], axis=-2, keepdims=True))
    np.testing.assert_allclose(un[..., :k], want_u.numpy()[..., :k] * signs, atol=1e-4)
    np.testing.assert_allclose(vn[..., :k], want_v[..., :k] * signs, atol=1e-4)


def test_svd_singular_values_gradient_matches_torch(xgrad_device: str) -> None:
    check(xgrad_device, lambda x: x.svd()[1], lambda x: torch.linalg.svdvals(x), rand(3, 2), atol=1e-3)


def test_svd_rank_deficient_gives_zero_singular_value(xgrad_device: str) -> None:
    _, s, _ = Tensor([[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]], device=xgrad_device).svd()
    np.testing.assert_allclose(s.numpy(), [np.sqrt(70.0), 0.0], atol=1e-5)


# ---- newton_schulz ----
def newton_schulz_reference(x: torch.Tensor, steps: int, params: tuple[float, ...], eps: float) -> torch.Tensor:
    if x.shape[-2] > x.shape[-1]:
        return newton_schulz_reference(x.transpose(-1, -2), steps, params, eps).transpose(-1, -2)
    g = x / (x.square().sum((-2, -1), keepdim=True).sqrt() + eps)
    for _ in range(steps):
        gram = g @ g.transpose(-1, -2)
        out, power = params[0] * g, g
        for p in params[1:]:
            power = gram @ power
            out = out + p * power
        g = out
    return g


MUON = (3.4445, -4.7750, 2.0315)


@pytest.mark.parametrize("shape", [(3, 4), (4, 2), (2, 2, 3)], ids=str)
def test_newton_schulz_matches_reference(xgrad_device: str, shape: tuple[int, ...]) -> None:
    check(
        xgrad_device,
        lambda x: x.newton_schulz(3, MUON),
        lambda x: newton_schulz_reference(x, 3, MUON, 1e-7),
        rand(*shape),
        atol=1e-3,
    )


def test_newton_schulz_converges_to_orthogonal(xgrad_device: str) -> None:
    x = Tensor([[2.0, 1.0], [0.5, 3.0]], device=xgrad_device).newton_schulz(8, (1.5, -0.5))
    np.testing.assert_allclose(x.numpy() @ x.numpy().T, np.eye(2), atol=1e-4)


def test_factorizations_of_vectors_raise_shape_error() -> None:
    for name in ("qr", "svd"):
        with pytest.raises(ShapeError, match=r"\(3,\)"):
            getattr(Tensor([1.0, 2.0, 3.0]), name)()
    with pytest.raises(ShapeError, match=r"\(3,\)"):
        Tensor([1.0, 2.0, 3.0]).newton_schulz(1, (1.0,))


# ---- docstrings ----
@pytest.mark.parametrize("name", ["dot", "linear", "einsum", "tril", "triu", "normalize", "qr", "svd", "newton_schulz"])
def test_docstring_example_runs_for_method(name: str) -> None:
    run_docstring(name)
