"""tinygrad compatibility, symbolic shapes: a bound Variable stands where tinygrad takes one (creation shapes, `cat`
along a symbolic axis where `i+j` and `j+i` are one size, reshape between permuted symbolic dims, attention with a
symbolic position, bitcast across item sizes), `Tensor.linear_with_vars` / `Tensor.schedule_linear`, assigns into
views that reading the base tensor sees, and bindings kept on realized tensors. Values are checked against numpy
computing the same thing at the bound values."""

from __future__ import annotations

import numpy as np
import pytest

from xgrad import Tensor, Variable, dtypes
from xgrad.engine.realize import Linear, run_linear
from xgrad.uop.symshape import sym_equal


def _bind(name: str, value: int, hi: int = 10) -> object:
    return Variable(name, 1, hi).bind(value)


# ---- creation ----
@pytest.mark.parametrize("make", ["ones", "zeros", "empty", "rand", "randn"])
def test_creation_with_a_bound_variable(make: str) -> None:
    v = _bind("v", 4)
    t = getattr(Tensor, make)(3, v)
    assert t.shape[0] == 3 and not isinstance(t.shape[1], int)
    assert t.max_shape == (3, 10)
    if make != "empty":
        assert t.numpy().shape == (3, 4)
    if make == "ones":
        np.testing.assert_array_equal(t.numpy(), np.ones((3, 4)))


def test_full_and_arange_with_a_bound_variable() -> None:
    v = _bind("v", 3)
    np.testing.assert_array_equal(Tensor.full((v, 2), 7).numpy(), np.full((3, 2), 7))
    assert Tensor.arange(v).tolist() == [0, 1, 2]


# ---- cat and reshape ----
def test_cat_along_a_symbolic_axis_gives_one_size_in_either_order() -> None:
    i, j = _bind("i", 2), _bind("j", 3)
    a_np, b_np = np.arange(8, dtype=np.float32).reshape(2, 4), -np.arange(12, dtype=np.float32).reshape(3, 4)
    a = Tensor(np.pad(a_np, ((0, 8), (0, 0))))[:i]
    b = Tensor(np.pad(b_np, ((0, 7), (0, 0))))[:j]
    ab, ba = a.cat(b), b.cat(a)
    assert ab.shape[0] is ba.shape[0]  # i+j and j+i are the same size node
    np.testing.assert_array_equal(ab.numpy(), np.concatenate([a_np, b_np]))
    np.testing.assert_array_equal((ab + ba).numpy(), np.concatenate([a_np, b_np]) + np.concatenate([b_np, a_np]))
    np.testing.assert_array_equal(a.cat(b, a).numpy(), np.concatenate([a_np, b_np, a_np]))


def test_binary_ops_accept_equal_sizes_written_differently() -> None:
    i, j = _bind("i", 2), _bind("j", 3)
    x = Tensor.ones(20, 10).contiguous()[: i + j]  # (i+j, 10)
    y = Tensor.ones(20, 10).contiguous()[: j + i] * 2  # (j+i, 10)
    assert sym_equal(x.shape[0], y.shape[0])
    np.testing.assert_array_equal((x + y).numpy(), np.full((5, 10), 3.0))


def test_reshape_between_permuted_symbolic_dims() -> None:
    i, j = _bind("i", 2), _bind("j", 3)
    src = np.arange(100, dtype=np.float32).reshape(10, 10)
    x = Tensor(src)[:i, :j]  # (i, j)
    y = x.contiguous().reshape(j, i)
    assert y.shape == (j, i)
    np.testing.assert_array_equal(y.numpy(), src[:2, :3].reshape(3, 2))
    np.testing.assert_array_equal(y.reshape(i * j).numpy(), src[:2, :3].reshape(6))
    with pytest.raises(ValueError):
        x.reshape(j, j)


# ---- linear_with_vars / schedule_linear ----
def test_linear_with_vars_returns_the_steps_and_the_values() -> None:
    v = _bind("v", 4)
    t = (Tensor.arange(10).contiguous()[:v] * 3).contiguous()
    linear, var_vals = t.linear_with_vars()
    assert isinstance(linear, Linear) and len(linear.src) >= 1 and var_vals == {"v": 4}
    run_linear(linear, var_vals)
    assert t.tolist() == [0, 3, 6, 9]


def test_schedule_linear_without_variables() -> None:
    a = Tensor([1.0, 2.0, 3.0]).contiguous() + 1
    b = a * 2
    linear = b.schedule_linear(a)
    assert len(linear.src) >= 1 and all(not item.is_copy for item in linear.src)
    run_linear(linear)
    assert a.tolist() == [2.0, 3.0, 4.0] and b.tolist() == [4.0, 6.0, 8.0]
    with pytest.raises(ValueError, match="linear_with_vars"):
        Tensor.ones(_bind("w", 3)).contiguous().schedule_linear()


# ---- attention with a symbolic position ----
def _np_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], dtype=bool)), s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def test_attention_over_a_cache_up_to_a_symbolic_position() -> None:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in [(1, 2, 1, 8), (1, 2, 16, 8), (1, 2, 16, 8)])
    pos = Variable("pos", 1, 16)
    for p in (3, 9):
        start = pos.bind(p)
        got = Tensor(q).scaled_dot_product_attention(Tensor(k)[:, :, :start], Tensor(v)[:, :, :start])
        np.testing.assert_allclose(got.numpy(), _np_attention(q, k[:, :, :p], v[:, :, :p], False), rtol=1e-5, atol=1e-5)


def test_causal_attention_with_a_symbolic_length() -> None:
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, 16, 8)).astype(np.float32) for _ in range(3))
    n = _bind("n", 5, 16)
    qt, kt, vt = (Tensor(x)[:, :, :n] for x in (q, k, v))
    got = qt.scaled_dot_product_attention(kt, vt, is_causal=True)
    want = _np_attention(q[:, :, :5], k[:, :, :5], v[:, :, :5], True)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


# ---- assigns into views, bindings ----
def test_slice_assign_is_seen_by_the_base_tensor() -> None:
    x = Tensor.zeros(5).contiguous().realize()
    x[1:3].assign(Tensor([1.0, 2.0]))  # not realized: reading x runs it, as in tinygrad
    assert x.tolist() == [0.0, 1.0, 2.0, 0.0, 0.0]
    y = Tensor.zeros(3, 4).contiguous().realize()
    y[:, 1].assign(Tensor([5.0, 6.0, 7.0]))
    y[2:, 2:].assign(Tensor([[8.0, 9.0]]))  # a second assign into the same buffer runs after the first
    want = np.zeros((3, 4), dtype=np.float32)
    want[:, 1], want[2:, 2:] = [5, 6, 7], [[8, 9]]
    np.testing.assert_array_equal((y * 1).numpy(), want)  # a computation reading y sees both writes


def test_slice_assign_with_a_symbolic_bound() -> None:
    cache = Tensor.zeros(8).contiguous().realize()
    at = Variable("at", 0, 7)
    for p in range(3):
        s = at.bind(p)
        cache[s : s + 1].assign(Tensor([float(p + 1)]))
    assert cache.tolist() == [1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_realized_tensor_keeps_its_binding() -> None:
    v = _bind("v", 4)
    t = (Tensor.ones(v) * 2).contiguous().realize()
    assert t.shape[0] is not None and not isinstance(t.shape[0], int)
    assert str(t.shape[0]) == str(v) and t.tolist() == [2.0] * 4
    assert (t + 1).tolist() == [3.0] * 4


# ---- bitcast across item sizes ----
@pytest.mark.parametrize(
    ("src_np", "dtype", "np_dtype"),
    [
        (np.float32, dtypes.uint16, np.uint16),
        (np.float32, dtypes.uint8, np.uint8),
        (np.float32, dtypes.float16, np.float16),
        (np.int64, dtypes.int32, np.int32),
        (np.uint16, dtypes.int8, np.int8),
        (np.uint8, dtypes.float32, np.float32),
        (np.int16, dtypes.int64, np.int64),
        (np.uint8, dtypes.uint16, np.uint16),
    ],
)
def test_bitcast_across_item_sizes_like_numpy_view(src_np: type, dtype: object, np_dtype: type) -> None:
    rng = np.random.default_rng(3)
    a = rng.integers(0, 255, size=(3, 16), dtype=np.uint8).view(src_np)  # every bit pattern, as numpy views it
    if src_np is np.float32:
        a = rng.standard_normal(a.shape).astype(np.float32)
    want = a.view(np_dtype)
    got = Tensor(a).bitcast(dtype)
    assert got.dtype == dtype and got.shape == want.shape
    assert got.numpy().view(np.uint8).tobytes() == want.view(np.uint8).tobytes()


def test_bitcast_across_item_sizes_on_a_symbolic_last_axis() -> None:
    a = np.arange(40, dtype=np.float32).reshape(4, 10) * 1.25
    v = _bind("v", 3)
    wide = Tensor(a)[:, :v].bitcast(dtypes.uint16)
    assert sym_equal(wide.shape[1], v * 2)
    np.testing.assert_array_equal(wide.numpy(), a[:, :3].view(np.uint16))
    raw = np.arange(48, dtype=np.uint8).reshape(2, 24)
    w = _bind("w", 2, 6)
    narrow = Tensor(raw)[:, : w * 4].bitcast(dtypes.float32)
    assert sym_equal(narrow.shape[1], w)
    np.testing.assert_array_equal(narrow.numpy().view(np.uint8), raw[:, :8])


def test_bitcast_errors() -> None:
    with pytest.raises(ValueError, match="multiple of 4"):
        Tensor.ones(2, 3, dtype=dtypes.uint8).bitcast(dtypes.float32)
    with pytest.raises(ValueError, match="0-d"):
        Tensor(1.0).bitcast(dtypes.uint16)


def test_basic_indexing_of_a_symbolic_shape() -> None:
    n = _bind("n", 3)
    src = np.arange(40).reshape(10, 4)
    x = Tensor(src)[:n]
    np.testing.assert_array_equal(x[..., 0].numpy(), src[:3, 0])
    np.testing.assert_array_equal(x[:, 1:3].numpy(), src[:3, 1:3])
    np.testing.assert_array_equal(x[:, -1].numpy(), src[:3, -1])
    np.testing.assert_array_equal(x[0].numpy(), src[0])
    assert x[None, :, 2].shape[0] == 1
