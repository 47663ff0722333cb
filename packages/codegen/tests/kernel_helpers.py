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


def kernel_items(fn: Callable[[], Tensor], inputs: bool = False) -> list[tuple[UOp, list[np.ndarray]]]:
    """The kernels that realizing `fn()` runs, caught on their way to the device: each one's AST and (`inputs`) the
    float32 contents of its input buffers in PARAM order, read before it runs."""
    seen: list[tuple[UOp, list[np.ndarray]]] = []
    orig = realize.run_kernel

    def spy(item: Any, vals: dict[str, int]) -> Any:
        bufs = [np.frombuffer(bytes(b.as_bytes()), np.float32) for b in item.bufs[1:]] if inputs else []
        seen.append((item.ast, bufs))
        return orig(item, vals)

    realize.run_kernel = spy  # type: ignore[assignment]
    try:
        fn().realize()
    finally:
        realize.run_kernel = orig
    return seen


def kernel_asts(fn: Callable[[], Tensor]) -> list[UOp]:
    """The kernel ASTs that realizing `fn()` runs, caught on their way to the device."""
    return [ast for ast, _ in kernel_items(fn)]


def matmul_ast(m: int, k: int, n: int) -> UOp:
    """The kernel AST of a (m, k) @ (k, n) matmul."""
    a, b = Tensor(data(m, k)).realize(), Tensor(data(k, n, seed=1)).realize()
    (ast,) = kernel_asts(lambda: a @ b)
    return ast
