"""TinyJit: capture once, replay with new inputs, no scheduling on replay, clear errors on mismatches."""

from __future__ import annotations

import numpy as np
import pytest

from xgrad import TinyJit
from xgrad.dtype import dtypes
from xgrad.engine.schedule import ScheduleStats
from xgrad.errors import JitError
from xgrad.helpers import Context
from xgrad.tensor import Tensor

rng = np.random.default_rng(7)


def data(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def test_replay_computes_with_new_inputs(xgrad_device):
    @TinyJit
    def f(a: Tensor, b: Tensor) -> Tensor:
        return ((a + b) * 2).sum(1).realize()

    for _ in range(5):
        x, y = data(3, 4), data(3, 4)
        out = f(Tensor(x, device=xgrad_device).realize(), Tensor(y, device=xgrad_device).realize())
        np.testing.assert_allclose(out.numpy(), ((x + y) * 2).sum(1), rtol=1e-5)
    assert f.calls == 2 and len(f.steps) >= 1


def test_replay_does_no_schedule_work(xgrad_device):
    f = TinyJit(lambda a: (a.exp() + 1).softmax().realize())
    for _ in range(2):
        f(Tensor(data(8), device=xgrad_device).realize())
    before = ScheduleStats.calls
    x = data(8)
    out = f(Tensor(x, device=xgrad_device).realize())
    assert ScheduleStats.calls == before  # replay launched the captured kernels only
    e = np.exp(np.exp(x) + 1 - (np.exp(x) + 1).max())
    np.testing.assert_allclose(out.numpy(), e / e.sum(), rtol=1e-5)


def test_jitted_training_step_updates_parameters(xgrad_device):
    w = Tensor(data(4, 2), device=xgrad_device).realize()
    w_np = w.numpy().copy()

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        w.is_param = True
        loss = ((x @ w - y) ** 2).mean()
        (g,) = loss.gradient(w)
        w.assign(w - g * 0.1)
        return loss.realize(w)

    for _ in range(4):
        x, y = data(5, 4), data(5, 2)
        loss = step(Tensor(x, device=xgrad_device).realize(), Tensor(y, device=xgrad_device).realize())
        ref_loss = ((x @ w_np - y) ** 2).mean()
        grad = 2 * x.T @ (x @ w_np - y) / (5 * 2)
        w_np = w_np - 0.1 * grad
        np.testing.assert_allclose(loss.item(), ref_loss, rtol=1e-4)
        np.testing.assert_allclose(w.numpy(), w_np, rtol=1e-4, atol=1e-5)


def test_changed_inputs_raise_jit_errors(xgrad_device):
    f = TinyJit(lambda a: (a * 2).realize())
    for _ in range(3):
        f(Tensor(data(3), device=xgrad_device).realize())
    with pytest.raises(JitError, match="shape"):
        f(Tensor(data(4), device=xgrad_device).realize())
    with pytest.raises(JitError, match="dtype"):
        f(Tensor([1, 2, 3], device=xgrad_device, dtype=dtypes.int32).realize())
    with pytest.raises(JitError, match="CONST"):
        f(Tensor.full((3,), 2.0, device=xgrad_device))  # a lazy computed input is realized; a constant is refused
    with pytest.raises(JitError, match="inputs"):
        f(Tensor(data(3), device=xgrad_device).realize(), Tensor(data(3), device=xgrad_device).realize())


def test_the_same_tensor_passed_twice_raises_on_replay_too(xgrad_device):
    f = TinyJit(lambda a, b: (a + b).realize())
    x, y = Tensor(data(3), device=xgrad_device).realize(), Tensor(data(3), device=xgrad_device).realize()
    for _ in range(3):
        np.testing.assert_allclose(f(x, y).numpy(), x.numpy() + y.numpy())
    with pytest.raises(JitError, match="twice"):
        f(x, x)


def test_reading_data_during_capture_raises():
    f = TinyJit(lambda a: (a * 2).numpy())
    f(Tensor([1.0]).realize())
    with pytest.raises(JitError, match="inside a TinyJit capture"):
        f(Tensor([1.0]).realize())


def test_jit_off_runs_the_function_every_time():
    calls = []

    def g(a: Tensor) -> Tensor:
        calls.append(1)
        return (a + 1).realize()

    with Context(JIT=0):
        f = TinyJit(g)
        for _ in range(3):
            assert f(Tensor([1.0]).realize()).tolist() == [2.0]
    assert len(calls) == 3
