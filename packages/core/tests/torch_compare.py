"""Shared helpers of the torch-referenced op tests (test_math.py, test_reduce.py, test_nn_functional.py).

`rng` is reseeded from the test's name before each test by the autouse fixture `seed_per_test` (import it into the
test module to activate it), so every test draws the same data on every run, in any order: 0-d inputs are baked into
kernels as constants, so this also lets the compile cache hit. `check` compares an xgrad function with torch, forward
and backward; `run_docstring` runs the `>>>` examples of one Tensor method. (conftest.py puts this directory on
sys.path, so test modules `from torch_compare import ...`.)
"""

from __future__ import annotations

import doctest
import importlib.util
import inspect
import pathlib
import sys
import zlib
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

from xgrad.tensor import Tensor

Fn = Callable[..., Any]


class PerTestRng:
    """A numpy Generator that `seed_per_test` replaces before each test; attribute access reaches the current one."""

    def __init__(self) -> None:
        self.gen = np.random.default_rng(0)

    def reseed(self, seed: int) -> None:
        self.gen = np.random.default_rng(seed)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.gen, name)


rng: Any = PerTestRng()


@pytest.fixture(autouse=True)
def seed_per_test(request: pytest.FixtureRequest) -> None:
    """Reseed `rng` from the test's name (crc32), as each module's own fixture did before."""
    rng.reseed(zlib.crc32(request.node.name.encode()))


def rand(shape: tuple[int, ...], low: float = -2.0, high: float = 2.0) -> np.ndarray:
    return np.asarray(rng.uniform(low, high, size=shape), dtype=np.float32)


def rand_away(shape: tuple[int, ...], kinks: Sequence[float], low: float = -4.0, high: float = 4.0) -> np.ndarray:
    """Uniform values, moved off a small neighbourhood of each kink (where the gradient jumps)."""
    x = rand(shape, low, high)
    for k in kinks:
        near = np.abs(x - k) < 0.05
        x = np.where(near, x + 0.1, x).astype(np.float32)
    return x


def check(
    device: str,
    fn: Fn,
    torch_fn: Fn | None,
    *arrays: np.ndarray,
    atol: float = 1e-5,
    rtol: float = 1e-5,
    grad: bool = True,
    grad_atol: float | None = None,
) -> None:
    """`fn` on xgrad tensors against `torch_fn` (default `fn`) on float64 torch tensors: the forward values, and
    the gradient of every input for a random upstream gradient (so non-scalar outputs are covered too). The
    gradients are built before anything is read: reading realizes a tensor, which cuts its graph."""
    xs = [Tensor(a, device=device, requires_grad=True) for a in arrays]  # a 0-d one: a buffer, not a constant
    ts = [torch.tensor(a.astype(np.float64), requires_grad=True) for a in arrays]
    out = fn(*xs)
    want = (torch_fn or fn)(*ts)
    assert out.shape == tuple(want.shape), f"forward shape {out.shape} != torch {tuple(want.shape)}"
    upstream = rand(out.shape)
    grads = out.gradient(*xs, gradient=Tensor(upstream, device=device)) if grad else []
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), atol=atol, rtol=rtol, equal_nan=True)
    if not grad:
        return
    want_grads = torch.autograd.grad(want, ts, torch.tensor(upstream.astype(np.float64)), allow_unused=True)
    for i, (g, wg, x) in enumerate(zip(grads, want_grads, xs)):
        assert g.shape == x.shape, f"grad {i} shape {g.shape} != input shape {x.shape}"
        assert g.dtype == x.dtype, f"grad {i} dtype {g.dtype} != input dtype {x.dtype}"
        expected = np.zeros(x.shape) if wg is None else wg.detach().numpy()
        np.testing.assert_allclose(
            g.numpy(), expected, atol=grad_atol or atol, rtol=rtol, err_msg=f"gradient of input {i}", equal_nan=True
        )


def run_docstring(name: str) -> None:
    """Run the `>>>` examples in the docstring of Tensor.<name>; fail if there are none or one fails."""
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner()
    obj = inspect.getattr_static(Tensor, name)
    obj = obj.fget if isinstance(obj, property) else getattr(Tensor, name)
    tests = finder.find(obj, name, globs={"Tensor": Tensor})
    for test in tests:
        runner.run(test)
    assert runner.tries > 0, f"Tensor.{name} has no docstring example"
    assert runner.failures == 0, f"the docstring example of Tensor.{name} fails"


EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / "examples"


def load_example(name: str) -> ModuleType:
    """Import `examples/<name>.py` as module `name` (registered in sys.modules: dataclasses look their module up while
    the class is built)."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
