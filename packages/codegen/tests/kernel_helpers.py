"""Helpers shared by the optimizer tests: test data, catching the kernel ASTs a realize runs, and a renderer that
looks to the optimizer like the CPU one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from xgrad import Tensor
from xgrad.engine import realize
from xgrad.uop.ops import UOp
from xgrad_codegen.renderer import CStyleRenderer


class ScratchRenderer(CStyleRenderer):
    """A renderer like the CPU one as the optimizer sees it: 8-lane vectors and scratch arrays."""

    max_vector_width = 8
    supports_scratch = True


def data(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


def kernel_asts(fn: Callable[[], Tensor]) -> list[UOp]:
    """The kernel ASTs that realizing `fn()` runs, caught on their way to the device."""
    seen: list[UOp] = []
    orig = realize.run_kernel

    def spy(item: Any, vals: dict[str, int]) -> Any:
        seen.append(item.ast)
        return orig(item, vals)

    realize.run_kernel = spy  # type: ignore[assignment]
    try:
        fn().realize()
    finally:
        realize.run_kernel = orig
    return seen


def matmul_ast(m: int, k: int, n: int) -> UOp:
    """The kernel AST of a (m, k) @ (k, n) matmul."""
    a, b = Tensor(data(m, k)).realize(), Tensor(data(k, n, seed=1)).realize()
    (ast,) = kernel_asts(lambda: a @ b)
    return ast
