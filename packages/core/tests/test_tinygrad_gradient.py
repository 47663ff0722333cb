"""tinygrad's gradient semantics on xgrad: gradients of broadcast operands (explicit or implicit in the graph) have
the operand's shape, a constant target raises, gradients flow through `clone` of a detached tensor, and the error
types are tinygrad's builtins. Values are checked against torch (CPU, float64) or by hand where they are exact."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from xgrad import Tensor, dtypes
from xgrad.uop.ops import Ops

rng = np.random.default_rng(21)


def test_broadcast_operands_get_gradients_of_their_own_shape() -> None:
    a_np, b_np = rng.standard_normal((3, 1)), rng.standard_normal((1, 4))
    a, b = Tensor(a_np, dtype=dtypes.float32), Tensor(b_np, dtype=dtypes.float32)
    da, db = (a * b + a).sum().gradient(a, b)
    ta, tb = torch.tensor(a_np, requires_grad=True), torch.tensor(b_np, requires_grad=True)
    (ta * tb + ta).sum().backward()
    assert da.shape == (3, 1) and db.shape == (1, 4)
    assert ta.grad is not None and tb.grad is not None
    np.testing.assert_allclose(da.numpy(), ta.grad.numpy(), rtol=1e-5)
    np.testing.assert_allclose(db.numpy(), tb.grad.numpy(), rtol=1e-5)


def test_implicitly_broadcast_0d_operand_of_an_alu_node() -> None:
    # a graph built on UOps (as tinygrad code does) may mix a 0-d source with shaped ones, without an EXPAND
    x, w = Tensor([1.0, 2.0, 3.0]), Tensor(2.0, requires_grad=True)
    for m in (x.uop.alu(Ops.MUL, w.uop), w.uop.alu(Ops.MUL, x.uop)):
        assert m.shape == (3,)
        (dw,) = Tensor(m).sum().gradient(w)
        assert dw.shape == () and dw.item() == 6.0


def test_implicitly_broadcast_0d_branch_of_where() -> None:
    cond, x, w = Tensor([True, False, True]), Tensor([1.0, 2.0, 3.0]), Tensor(4.0, requires_grad=True)
    (dw,) = Tensor(cond.uop.alu(Ops.WHERE, x.uop, w.uop)).sum().gradient(w)
    assert dw.shape == () and dw.item() == 1.0  # chosen where cond is False: once
    (dw,) = Tensor(cond.uop.alu(Ops.WHERE, w.uop, x.uop)).sum().gradient(w)
    assert dw.item() == 2.0


def test_implicit_and_direct_uses_of_one_node_add_up() -> None:
    x, p = Tensor([1.0, 2.0, 3.0]), Tensor(0.5, requires_grad=True)
    s = p.sin()
    z = Tensor(x.uop.alu(Ops.MUL, s.uop)).sum() + s
    (dp,) = z.gradient(p)
    assert dp.shape == ()
    assert dp.item() == pytest.approx(7 * math.cos(0.5), rel=1e-5)


def test_constant_target_raises_a_runtime_error() -> None:
    t = Tensor(2.0)
    with pytest.raises(RuntimeError, match="constant"):
        (t * 2.0).gradient(t)


def test_bare_constant_is_skipped_by_backward() -> None:
    w = Tensor(1.0)
    (Tensor.rand(()) + w).backward()
    assert w.grad is None


def test_non_float_and_non_scalar_raise_tinygrads_types() -> None:
    x = Tensor([1, 2, 3])
    with pytest.raises(RuntimeError):
        x.sum().gradient(x)
    with pytest.raises(RuntimeError):
        x.float().sum().gradient(x)
    y = Tensor([1.0, 2.0, 3.0])
    with pytest.raises(AssertionError):
        (y * y).gradient(y)
    (dy,) = (y * y).gradient(y, gradient=Tensor([1.0, 1.0, 1.0]))
    assert dy.tolist() == [2.0, 4.0, 6.0]


def test_gradient_through_clone_of_a_detached_tensor() -> None:
    base = Tensor([1.0, 2.0, 3.0, 4.0])
    x = base.detach().clone()
    (x * 2.0).sum().backward()
    assert x.grad is not None and x.grad.tolist() == [2.0, 2.0, 2.0, 2.0]  # the gradient flows through clone
    assert base.grad is None  # ...detach cuts base off (tinygrad gives it zeros; xgrad computes nothing there)


def test_gradient_through_clone_reaches_its_source_and_the_clone() -> None:
    # as tinygrad (unlike torch): every tensor in the graph gets .grad, the non-leaf clone too
    src = Tensor([1.0, 2.0, 3.0, 4.0])
    x = src.clone()
    (x * 2.0).sum().backward()
    assert src.grad is not None and x.grad is not None
    assert src.grad.tolist() == [2.0] * 4 and x.grad.tolist() == [2.0] * 4


def test_repeated_backward_accumulates_into_the_same_grad() -> None:
    x = Tensor([3.0])
    (x * 2)[0].backward()
    first = x.grad
    (x * 3)[0].backward()
    (x * x)[0].backward()
    assert x.grad is first and first is not None
    assert first.tolist() == [2.0 + 3.0 + 2 * 3.0]


def test_gradient_of_an_expanded_tensor_is_its_own() -> None:
    x_np = rng.standard_normal((5, 2)).astype(np.float32)
    a = Tensor([3.0])
    aex = a.expand(10)
    (aex.reshape(5, 2) * Tensor(x_np)).sum().backward()
    assert aex.grad is not None and a.grad is not None
    np.testing.assert_allclose(aex.grad.numpy(), x_np.reshape(10))
    np.testing.assert_allclose(a.grad.numpy(), [x_np.sum()], rtol=1e-5)


def test_a_gradient_of_as_many_elements_in_another_shape_is_taken() -> None:
    # tinygrad's example: Tensor([3.0]) as the gradient of a 0-d loss
    x = Tensor([1.0, 2.0, 3.0])
    (dx,) = (x * x).sum().gradient(x, gradient=Tensor([3.0]))
    assert dx.tolist() == [6.0, 12.0, 18.0]
    with pytest.raises(ValueError):
        (x * x).gradient(x, gradient=Tensor([1.0, 2.0]))


def test_backward_again_accumulates_even_when_grad_is_read_in_between() -> None:
    # tinygrad's test_accumulate_gradients: .grad read after each backward, then added to by the next one
    x_np, w_np = rng.standard_normal((1, 3)).astype(np.float32), rng.standard_normal((3, 3)).astype(np.float32)
    m_np = rng.standard_normal((1, 3)).astype(np.float32)
    x, w, m = Tensor(x_np), Tensor(w_np), Tensor(m_np)
    out = x.dot(w).relu().log_softmax().mul(m).add(m).sum()
    seen = []
    for _ in range(3):
        out.backward()
        assert x.grad is not None and w.grad is not None
        seen.append((x.grad.numpy(), w.grad.numpy()))
    tx, tw = torch.tensor(x_np, requires_grad=True), torch.tensor(w_np, requires_grad=True)
    torch.nn.functional.log_softmax((tx @ tw).relu(), dim=1).mul(torch.tensor(m_np)).add(
        torch.tensor(m_np)
    ).sum().backward()
    assert tx.grad is not None and tw.grad is not None
    for k, (gx, gw) in enumerate(seen, start=1):
        np.testing.assert_allclose(gx, k * tx.grad.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(gw, k * tw.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_reading_a_pending_assign_twice_runs_it_once() -> None:
    t = Tensor([1.0]).realize()
    t.assign(t + 1)
    assert t.tolist() == [2.0] and t.tolist() == [2.0]
