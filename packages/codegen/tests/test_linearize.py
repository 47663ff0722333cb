"""The linearizer's program is a function of the kernel alone: where two loops could open next and tie on kind and
range id (a split or a hoisted gate leaves two RANGEs with one id), graph order decides, never the order a set of
UOps happens to iterate in (their hash is their address, so that order changed from one process to the next and the
same kernel compiled to different source, missing the disk caches)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from kernel_helpers import kernel_asts

from xgrad import Tensor
from xgrad.uop.ops import UOp
from xgrad_codegen import linearize
from xgrad_codegen.pipeline import full_rewrite

cpu_renderer = pytest.importorskip("xgrad_cpu.renderer")


class _ReversedSet(set[UOp]):
    """A set that iterates in the reverse of its usual order: the order another process could see."""

    def __iter__(self) -> Iterator[UOp]:
        return reversed(list(super().__iter__()))


def _sources(asts: list[UOp]) -> list[str]:
    r = cpu_renderer.CRenderer(vector_width=8)
    return [r.render("k", full_rewrite(ast, r)) for ast in asts]


def test_the_program_does_not_depend_on_set_iteration_order(monkeypatch: pytest.MonkeyPatch) -> None:
    # 1001 columns padded to 8 lanes: the padded lanes' loads are gated, gate hoisting gives their reduction loop
    # its own RANGE with the first lane's id, and both loops are ready to open at once
    x = Tensor(np.random.default_rng(0).standard_normal((3, 1001)).astype(np.float32)).realize()
    asts = kernel_asts(lambda: x.sum(0))
    first = _sources(asts)
    init = linearize._Ready.__init__

    def reversed_ranges(self: linearize._Ready, *args: object) -> None:
        init(self, *args)  # type: ignore[arg-type]
        self.ranges = _ReversedSet()

    monkeypatch.setattr(linearize._Ready, "__init__", reversed_ranges)
    assert _sources(asts) == first
