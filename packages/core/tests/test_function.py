"""`function` (xgrad.engine.function): traced once, applied to new inputs, results equal to the undecorated function's,
gradients flow through, clear errors for changed shapes, implicit inputs and eager bodies."""

from __future__ import annotations

import numpy as np
import pytest

from xgrad import Tensor, function
from xgrad.engine.realize import GlobalCounters
from xgrad.errors import JitError, XgradError

rng = np.random.default_rng(3)


def rand(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def block(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return (x @ w + b).gelu().softmax(-1)


def test_function_matches_undecorated_results_on_new_inputs(xgrad_device: str) -> None:
    traced = function(block)
    for _ in range(3):
        args = [Tensor(a, device=xgrad_device) for a in (rand(2, 3), rand(3, 4), rand(4))]
        np.testing.assert_allclose(traced(*args).numpy(), block(*args).numpy(), rtol=1e-5, atol=1e-6)


def test_function_runs_python_body_once() -> None:
    calls: list[int] = []

    @function
    def f(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        calls.append(1)
        return a + b, a * b

    for i in range(3):
        s, p = f(Tensor([1.0, float(i)]), Tensor([2.0, 3.0]))
        assert s.tolist() == [3.0, i + 3.0] and p.tolist() == [2.0, 3.0 * i]
    assert len(calls) == 1


def test_function_returns_single_tensor_or_tuple_as_body_does() -> None:
    one = function(lambda a: a + 1)(Tensor([1.0]))
    two = function(lambda a: [a + 1, a - 1])(Tensor([1.0]))
    assert isinstance(one, Tensor) and isinstance(two, tuple) and len(two) == 2


def test_function_gradients_match_undecorated(xgrad_device: str) -> None:
    xs, ws, bs = rand(2, 3), rand(3, 4), rand(4)
    grads = []
    for fn in (block, function(block)):
        x, w, b = (Tensor(a, device=xgrad_device).is_param_() for a in (xs, ws, bs))
        (fn(x, w, b) * Tensor(np.arange(8, dtype=np.float32).reshape(2, 4), device=xgrad_device)).sum().backward()
        assert x.grad is not None and w.grad is not None and b.grad is not None
        grads.append([x.grad.numpy(), w.grad.numpy(), b.grad.numpy()])
    for got, want in zip(grads[1], grads[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_function_finds_tensors_inside_containers() -> None:
    @function
    def f(pair: tuple[Tensor, Tensor], scale: dict[str, Tensor]) -> Tensor:
        return (pair[0] - pair[1]) * scale["s"]

    a, b = Tensor([5.0, 7.0]), Tensor([1.0, 2.0])
    assert f((a, b), {"s": Tensor([2.0, 3.0])}).tolist() == [8.0, 15.0]
    assert f((b, a), {"s": Tensor([1.0, 1.0])}).tolist() == [-4.0, -5.0]
    same = Tensor([4.0, 4.0])
    with pytest.raises(JitError, match="traced with 3 tensor inputs, now called with 2"):
        f((same, same), {"s": Tensor([1.0, 1.0])})  # one input fewer than traced: the same tensor counts once


def test_function_same_tensor_twice_is_one_input() -> None:
    f = function(lambda a, b: a * 2 + b)
    x = Tensor([1.0, 2.0])
    assert f(x, x).tolist() == [3.0, 6.0]
    y = Tensor([3.0, 1.0])
    assert f(y, y).tolist() == [9.0, 3.0]


def test_function_changed_shape_raises() -> None:
    f = function(lambda a: a.sum(0))
    f(Tensor.ones(2, 3))
    with pytest.raises(JitError, match=r"input 0 changed shape: traced with \(2, 3\), now \(4, 3\)"):
        f(Tensor.ones(4, 3))


def test_function_changed_dtype_or_static_argument_raises() -> None:
    f = function(lambda a, k: a * k)
    f(Tensor([1.0]), 2)
    with pytest.raises(JitError, match="changed dtype"):
        f(Tensor([1]), 2)
    with pytest.raises(JitError, match="non-Tensor arguments"):
        f(Tensor([1.0]), 3)


def test_function_implicit_input_is_error_unless_allowed() -> None:
    w = Tensor([1.0, 2.0]).realize()
    with pytest.raises(XgradError, match="allow_implicit=True"):
        function(lambda a: a * w)(Tensor([1.0, 1.0]))
    g = function(allow_implicit=True)(lambda a: a * w)
    assert g(Tensor([3.0, 3.0])).tolist() == [3.0, 6.0]
    w.assign(Tensor([10.0, 20.0])).realize()  # an implicit input is read as it is at each call's realize
    assert g(Tensor([1.0, 1.0])).tolist() == [10.0, 20.0]


def test_function_tensors_created_inside_body_are_not_implicit() -> None:
    f = function(lambda a: a + Tensor([1.0, 2.0]))
    assert f(Tensor([1.0, 1.0])).tolist() == [2.0, 3.0]


def test_function_body_that_realizes_raises() -> None:
    with pytest.raises(XgradError, match="must stay lazy"):
        function(lambda a: (a + 1).realize())(Tensor([1.0]).realize())


def test_function_precompile_realizes_first_call_and_is_a_kernel_boundary() -> None:
    body = lambda a: (a * 2).exp2()  # noqa: E731
    a = Tensor(rand(8)).realize()
    pre = function(precompile=True)(body)
    out = pre(a)
    assert out.uop.base.op.name == "BUFFER"  # realized on the first call
    GlobalCounters.reset()
    (pre(a) + 1).realize()
    boundary = GlobalCounters.kernel_count
    GlobalCounters.reset()
    (function(body)(a) + 1).realize()
    fused = GlobalCounters.kernel_count
    assert (boundary, fused) == (2, 1)
    np.testing.assert_allclose(pre(a).numpy(), body(a).numpy(), rtol=1e-6)


def test_function_precompile_backward_matches_plain_gradient() -> None:
    xs = rand(3)
    grads = []
    for fn in (function(lambda a: a.exp().sum()), function(precompile_backward=True)(lambda a: a.exp().sum())):
        x = Tensor(xs).is_param_()
        fn(x).backward()
        assert x.grad is not None
        grads.append(x.grad.numpy())
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-6)


def test_function_works_on_methods() -> None:
    class Scale:
        def __init__(self, k: float) -> None:
            self.k = k

        @function
        def __call__(self, x: Tensor) -> Tensor:
            return x * self.k

    s = Scale(3.0)
    assert s(Tensor([1.0, 2.0])).tolist() == [3.0, 6.0]
    assert s(Tensor([2.0, 2.0])).tolist() == [6.0, 6.0]


def test_function_non_tensor_return_raises() -> None:
    with pytest.raises(XgradError, match="must return a Tensor"):
        function(lambda a: 3)(Tensor([1.0]))


def test_function_grad_fxn_is_refused_with_reason() -> None:
    with pytest.raises(XgradError, match="grad_fxn"):
        function(grad_fxn=lambda *a: a)
