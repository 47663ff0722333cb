"""Symbolic shapes: Variables bound to values in reshape, shrink, pad, arange, full and expand, elementwise ops and
reductions over symbolic axes, one compiled kernel (and one schedule) for every value, and TinyJit replays with new
values. Results are compared with numpy for several values of each variable."""

from __future__ import annotations

import numpy as np
import pytest

from xgrad import Device, TinyJit, Variable
from xgrad.engine.schedule_cache import schedule_cache_size
from xgrad.errors import JitError, ShapeError
from xgrad.tensor import Tensor
from xgrad.uop.ops import Ops, UOp

VALUES = (1, 3, 6)
rng = np.random.default_rng(11)


def data(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def compiled(device: str) -> int:
    return int(Device[device].compiled_count)


# ---- each op family, several values ----
def test_shrink_matches_numpy_for_each_value(xgrad_device):
    a = data(3, 8)
    t = Tensor(a, device=xgrad_device).realize()
    n = Variable("n", 1, 8)
    for k in VALUES:
        out = t.shrink((None, (0, n.bind(k))))
        assert out.shape == (3, n.bind(k))
        np.testing.assert_array_equal(out.numpy(), a[:, :k])


def test_shrink_with_symbolic_start_matches_numpy(xgrad_device):
    a = data(2, 10)
    t = Tensor(a, device=xgrad_device).realize()
    s = Variable("s", 0, 7)
    for k in (0, 2, 7):
        np.testing.assert_array_equal(t.shrink((None, (s.bind(k), s.bind(k) + 3))).numpy(), a[:, k : k + 3])


def test_elementwise_and_reductions_over_symbolic_axis(xgrad_device):
    a, b = data(3, 8), data(3, 8)
    ta, tb = Tensor(a, device=xgrad_device).realize(), Tensor(b, device=xgrad_device).realize()
    n = Variable("n", 1, 8)
    for k in VALUES:
        x, y = ta.shrink((None, (0, n.bind(k)))), tb.shrink((None, (0, n.bind(k))))
        np.testing.assert_allclose((x * y + 1).numpy(), a[:, :k] * b[:, :k] + 1, rtol=1e-6)
        np.testing.assert_allclose((x * y).sum(1).numpy(), (a[:, :k] * b[:, :k]).sum(1), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(x.max(1).numpy(), a[:, :k].max(1))
        np.testing.assert_allclose(x.sum(0).numpy(), a[:, :k].sum(0), rtol=1e-5, atol=1e-6)


def test_reshape_of_symbolic_shape_matches_numpy(xgrad_device):
    a = data(4, 8)
    t = Tensor(a, device=xgrad_device).realize()
    n = Variable("n", 1, 8)
    for k in VALUES:
        x = t.shrink((None, (0, n.bind(k)))).contiguous()
        np.testing.assert_array_equal(x.reshape(n.bind(k), 4).numpy(), a[:, :k].reshape(k, 4))
        np.testing.assert_array_equal(x.reshape(2, -1).numpy(), a[:, :k].reshape(2, -1))
        np.testing.assert_array_equal(x.reshape(4, 1, n.bind(k)).numpy(), a[:, :k].reshape(4, 1, k))


def test_pad_by_symbolic_amount_matches_numpy(xgrad_device):
    a = data(2, 3)
    t = Tensor(a, device=xgrad_device).realize()
    n = Variable("n", 1, 8)
    for k in VALUES:
        np.testing.assert_array_equal(t.pad(((0, 0), (1, n.bind(k)))).numpy(), np.pad(a, ((0, 0), (1, k))))
        np.testing.assert_array_equal(
            t.pad(((n.bind(k), 0), (0, 0)), value=2.0).numpy(), np.pad(a, ((k, 0), (0, 0)), constant_values=2.0)
        )


def test_pad_of_symbolic_shape_matches_numpy(xgrad_device):
    a = data(2, 8)
    t = Tensor(a, device=xgrad_device).realize()
    n = Variable("n", 1, 8)
    for k in VALUES:
        got = t.shrink((None, (0, n.bind(k)))).pad_to(None, 8)
        np.testing.assert_array_equal(got.numpy(), np.pad(a[:, :k], ((0, 0), (0, 8 - k))))


def test_symbolic_basic_index_matches_numpy(xgrad_device):
    a = data(2, 3, 6)
    t = Tensor(a, device=xgrad_device).realize()
    n, s = Variable("n", 1, 6), Variable("s", 0, 2)
    for k in VALUES:
        view = t._symbolic_index((slice(None), slice(None), slice(None, n.bind(k))))
        assert view is not None
        np.testing.assert_array_equal(view.numpy(), a[:, :, :k])
    for j in (0, 2):
        b = s.bind(j)
        got = [t._symbolic_index(ix) for ix in ((Ellipsis, slice(b, b + 4)), (1, b), (None, 0, slice(b, None)))]
        want = [a[..., j : j + 4], a[1, j], a[None, 0, j:]]
        for g, w in zip(got, want):
            assert g is not None
            np.testing.assert_array_equal(g.numpy(), w)
    assert t._symbolic_index((0, slice(1, 2))) is None  # nothing symbolic: the ordinary indexing path


def test_mean_over_symbolic_axis_with_a_size_tensor(xgrad_device):
    a = data(3, 8)
    t = Tensor(a, device=xgrad_device).realize()
    n = Variable("n", 1, 8)
    for k in VALUES:
        x = t.shrink((None, (0, n.bind(k))))
        mean = x.sum(1) / Tensor._sint_tensor(n.bind(k), device=xgrad_device, dtype="float32")
        np.testing.assert_allclose(mean.numpy(), a[:, :k].mean(1), rtol=1e-5, atol=1e-6)


def test_mean_and_division_by_a_symbolic_size_match_numpy(xgrad_device):
    a = data(3, 8)
    t = Tensor(a, device=xgrad_device).realize()
    n = Variable("n", 1, 8)
    for k in VALUES:
        x = t.shrink((None, (0, n.bind(k))))
        np.testing.assert_allclose(x.mean(1).numpy(), a[:, :k].mean(1), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose((x / n.bind(k)).numpy(), a[:, :k] / k, rtol=1e-6)


def test_arange_with_symbolic_bounds_matches_numpy(xgrad_device):
    n = Variable("n", 1, 10)
    for k in VALUES:
        np.testing.assert_array_equal(Tensor.arange(n.bind(k), device=xgrad_device).numpy(), np.arange(k))
        np.testing.assert_array_equal(Tensor.arange(n.bind(k), 12, device=xgrad_device).numpy(), np.arange(k, 12))
        np.testing.assert_array_equal(
            Tensor.arange(1, n.bind(k) + 4, 3, device=xgrad_device).numpy(), np.arange(1, k + 4, 3)
        )


def test_full_ones_zeros_and_expand_of_symbolic_shape(xgrad_device):
    n = Variable("n", 1, 8)
    col = np.arange(3, dtype=np.float32).reshape(3, 1)
    for k in VALUES:
        b = n.bind(k)
        np.testing.assert_array_equal(Tensor.full((2, b), 7.0, device=xgrad_device).numpy(), np.full((2, k), 7.0))
        np.testing.assert_array_equal(Tensor.ones(b, device=xgrad_device).numpy(), np.ones(k))
        np.testing.assert_array_equal(Tensor.zeros(b, 2, device=xgrad_device).numpy(), np.zeros((k, 2)))
        got = Tensor(col, device=xgrad_device).expand(3, b)
        np.testing.assert_array_equal(got.numpy(), np.broadcast_to(col, (3, k)))


def test_empty_of_symbolic_shape_is_allocated_at_the_max_and_assignable(xgrad_device):
    n = Variable("n", 1, 8)
    for k in VALUES:
        t = Tensor.empty(2, n.bind(k), device=xgrad_device)
        assert t.max_shape == (2, 8)
        t.assign(Tensor.full((2, n.bind(k)), 4.0, device=xgrad_device)).realize()
        np.testing.assert_array_equal(t.numpy(), np.full((2, k), 4.0))


def test_realized_symbolic_tensor_keeps_its_bound_shape(xgrad_device):
    a = data(2, 8)
    t = Tensor(a, device=xgrad_device).realize()
    n = Variable("n", 1, 8)
    for k in VALUES:
        out = (t.shrink((None, (0, n.bind(k)))) * 2).realize()
        assert out.shape == (2, n.bind(k)) and out.max_shape == (2, 8) and out.max_numel() == 16
        assert repr(out.shape) == f"(2, n={k})"
        np.testing.assert_array_equal(out.numpy(), a[:, :k] * 2)
        np.testing.assert_array_equal((out + 1).tolist(), (a[:, :k] * 2 + 1).tolist())


# ---- one kernel, one schedule for every value ----
def test_one_compiled_kernel_serves_every_value(xgrad_device):
    a = data(3, 8)
    t = Tensor(a, device=xgrad_device).realize()
    n = Variable("n_once", 1, 8)
    counts = []
    for k in (2, 5, 7, 1):
        before = compiled(xgrad_device)
        out = (t.shrink((None, (0, n.bind(k)))).exp() * 3).sum(1).realize()
        counts.append(compiled(xgrad_device) - before)
        np.testing.assert_allclose(out.numpy(), (np.exp(a[:, :k]) * 3).sum(1), rtol=1e-5)
    assert counts[0] >= 1 and counts[1:] == [0, 0, 0]


def test_kernel_ast_keeps_the_variable_and_schedule_cache_hits(xgrad_device):
    t = Tensor(data(4, 8), device=xgrad_device).realize()
    n = Variable("n_cache", 1, 8)
    (t.shrink((None, (0, n.bind(2)))) + 5).realize()
    size = schedule_cache_size()
    for k in (3, 8):
        (t.shrink((None, (0, n.bind(k)))) + 5).realize()
    assert schedule_cache_size() == size


# ---- TinyJit ----
def test_jit_replays_kv_cache_with_new_start_pos(xgrad_device):
    max_len = 8
    cache = Tensor.zeros(2, max_len, device=xgrad_device).contiguous().realize()
    ref = np.zeros((2, max_len), np.float32)

    @TinyJit
    def step(x: Tensor, start_pos: UOp) -> Tensor:
        cache.shrink((None, (start_pos, start_pos + 1))).assign(x).realize()
        return (cache.shrink((None, (0, start_pos + 1))) * 2).sum(1).realize()

    sp = Variable("start_pos", 0, max_len - 1)
    for k in range(5):
        x = data(2, 1)
        out = step(Tensor(x, device=xgrad_device).realize(), sp.bind(k))
        ref[:, k : k + 1] = x
        np.testing.assert_allclose(out.numpy(), (ref[:, : k + 1] * 2).sum(1), rtol=1e-5, atol=1e-6)
    assert step.calls == 2 and step.var_vals == {"start_pos": 4}


def test_jit_replays_symbolic_input_and_output_shapes(xgrad_device):
    a = data(2, 8)
    t = Tensor(a, device=xgrad_device).realize()
    n = Variable("n", 1, 8)
    f = TinyJit(lambda x: (x * 3).realize())
    for k in (2, 3, 5, 8):
        out = f(t.shrink((None, (0, n.bind(k)))))
        assert out.shape == (2, n.bind(k))
        np.testing.assert_allclose(out.numpy(), a[:, :k] * 3, rtol=1e-6)


def test_jit_rejects_a_variable_it_did_not_capture(xgrad_device):
    t = Tensor(data(2, 8), device=xgrad_device).realize()
    n, m = Variable("n", 1, 8), Variable("m", 1, 8)

    @TinyJit
    def f(x: Tensor, v: UOp) -> Tensor:
        return (x.shrink((None, (0, v))) + 1).realize()

    f(t, n.bind(2))
    f(t, n.bind(3))
    f(t, n.bind(4))
    with pytest.raises(JitError, match="variables"):
        f(t, m.bind(4))


def test_jit_rejects_a_variable_hidden_from_its_arguments(xgrad_device):
    t = Tensor(data(2, 8), device=xgrad_device).realize()
    n = Variable("n_hidden", 1, 8)
    f = TinyJit(lambda x: (x.shrink((None, (0, n.bind(3)))) + 1).realize())
    f(t)
    with pytest.raises(JitError, match="n_hidden"):
        f(t)


# ---- errors ----
def test_bind_outside_the_range_raises_shape_error():
    with pytest.raises(ShapeError, match="outside the range"):
        Variable("n", 1, 8).bind(9)


def test_shrink_that_can_leave_the_shape_raises_shape_error():
    t = Tensor.zeros(2, 8)
    with pytest.raises(ShapeError, match="narrow the Variable"):
        t.shrink((None, (0, Variable("n", 1, 10).bind(3))))
    with pytest.raises(ShapeError, match="out of range"):
        t.shrink((None, (Variable("s", 0, 8).bind(7), 6)))


def test_reshape_to_a_different_symbolic_count_raises_shape_error():
    x = Tensor.ones(2, Variable("n", 1, 8).bind(3))
    with pytest.raises(ShapeError, match="not equal for every value"):
        x.reshape(Variable("m", 1, 8).bind(6))
    with pytest.raises(ShapeError, match="not equal for every value"):
        x.reshape(6)


def test_different_symbolic_sizes_do_not_broadcast():
    a, b = Tensor.ones(Variable("n", 1, 8).bind(2)), Tensor.ones(Variable("m", 1, 8).bind(2))
    with pytest.raises(ShapeError, match="cannot be broadcast"):
        a + b


def test_one_variable_bound_to_two_values_raises_shape_error():
    n = Variable("n", 1, 8)
    a, b = Tensor.ones(n.bind(2)), Tensor.ones(n.bind(3))
    with pytest.raises(ShapeError, match="bound to both"):
        a.realize(b)


def test_unbind_gives_variable_and_value():
    n = Variable("n", 1, 8)
    var, value = n.bind(5).unbind()
    assert var is n and value == 5 and var.op is Ops.DEFINE_VAR and (n.vmin, n.vmax) == (1, 8)


def test_getitem_and_setitem_with_bound_variables_match_numpy(xgrad_device):
    want = np.zeros((2, 8), np.float32)
    cache = Tensor.zeros(2, 8, device=xgrad_device).contiguous().realize()
    sp = Variable("sp", 0, 7)
    for k in range(4):
        row = np.array([[k + 1.0], [10.0 * (k + 1)]], np.float32)
        cache[:, sp.bind(k) : sp.bind(k) + 1] = Tensor(row, device=xgrad_device)
        want[:, k : k + 1] = row
        np.testing.assert_array_equal(cache[:, : sp.bind(k) + 1].numpy(), want[:, : k + 1])
