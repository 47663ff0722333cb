"""Kernel boundaries: how many kernels the scheduler makes for common graphs (no device runs: DEV=NULL)."""

from __future__ import annotations

import pytest

from xgrad.engine.schedule import create_schedule
from xgrad.helpers import Context
from xgrad.tensor import Tensor
from xgrad.uop.ops import Ops


@pytest.fixture(autouse=True)
def null_device():
    with Context(DEV="NULL"):
        yield


def kernels(*ts: Tensor) -> list:
    items, _ = create_schedule([t.uop for t in ts])
    return [it for it in items if not it.is_copy]


def test_elementwise_chain_is_one_kernel():
    a, b, c = Tensor.empty(16, 16), Tensor.empty(16, 16), Tensor.empty(16, 16)
    assert len(kernels((a + b) * c)) == 1


def test_reduce_with_prologue_is_one_kernel():
    a, b = Tensor.empty(16, 16), Tensor.empty(16, 16)
    assert len(kernels((a * b).sum(1))) == 1


def test_reduce_epilogue_fuses_into_reduce():
    a = Tensor.empty(16, 16)
    assert len(kernels((a.sum(1) * 2).exp())) == 1


def test_softmax_is_at_most_three_kernels():
    assert len(kernels(Tensor.empty(32, 64).softmax())) <= 3


def test_movement_chain_makes_no_copy_kernel():
    a = Tensor.empty(4, 6, 8)
    view = a.reshape(6, 4, 8).permute(2, 0, 1).pad(((1, 1), (0, 0), (2, 0))).shrink(((0, 9), (1, 5), (0, 5))).flip(0)
    assert view.uop.base.op is Ops.BUFFER  # still only a view: nothing to compute yet
    assert len(kernels(view + 1)) == 1  # consumed: one kernel, reading through the view


def test_contiguous_is_a_boundary():
    a = Tensor.empty(16, 16)
    assert len(kernels((a + 1).contiguous() * 2)) == 2


def test_reduce_behind_expand_is_realized_once():
    a = Tensor.empty(16, 16)
    m = a.max(1, keepdim=True)
    ks = kernels(a - m)
    assert len(ks) == 2
    assert sum(1 for k in ks for u in k.ast.toposort if u.op is Ops.REDUCE) == 1


def test_shared_reduce_is_not_recomputed():
    a = Tensor.empty(16, 16)
    s = a.sum()
    ks = kernels(s + 1, s * 2)
    assert sum(1 for k in ks for u in k.ast.toposort if u.op is Ops.REDUCE) == 1


def test_kernel_ast_has_no_movement_ops():
    a = Tensor.empty(8, 8)
    for k in kernels((a.T + a).sum(0)):
        assert not any(
            u.op in (Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP) for u in k.ast.toposort
        )


def test_big_reduction_to_few_outputs_is_split_in_two_kernels():
    a = Tensor.empty(1 << 16)
    ks = kernels(a.sum())
    assert len(ks) == 2  # partial sums in parallel, then the total
    with Context(SPLIT_REDUCEOP=0):
        assert len(kernels(Tensor.empty(1 << 16).sum())) == 1


def test_cached_schedule_copies_a_slice_of_each_new_buffer():
    # a schedule cache hit used to rebuild the copy source (a view of part of an input buffer) as a fresh buffer
    for i in range(3):
        x = Tensor([float(i) + k for k in range(8)], device="CPU").realize()
        assert x[2:6].to("CPU:1").tolist() == [float(i) + k for k in range(2, 6)]


def test_elementwise_of_two_buffers_repeated_by_a_big_expand_is_computed_once():
    # a conv's input gradient: relu'(pre) * grad is read by every window position; fused, it was recomputed per read
    pre, grad, w = Tensor.empty(8, 16), Tensor.empty(8, 16), Tensor.empty(16, 32)
    masked = (pre > 0).where(grad, 0.0)
    ks = kernels((masked.reshape(8, 16, 1) * w.reshape(1, 16, 32)).sum(1))
    assert len(ks) == 2
    first = [u.op for u in ks[0].ast.toposort]
    assert Ops.WHERE in first and Ops.REDUCE not in first  # the masked gradient, alone


def test_elementwise_repeated_a_few_times_or_reading_one_buffer_stays_fused():
    a, b = Tensor.empty(8, 16), Tensor.empty(8, 16)
    assert len(kernels(((a + b).reshape(8, 16, 1).expand(8, 16, 4)).sum(1))) == 1  # repeated 4 times only
    assert len(kernels((a.exp().reshape(8, 16, 1).expand(8, 16, 64)).sum(1))) == 1  # one buffer: cheap to redo


def test_an_elementwise_boundary_does_not_hide_a_shared_reduce():
    # logits = x @ w + b feeds both the loss and (through a big expand) the gradient: the matmul is still realized once
    x, w, b, t = Tensor.empty(8, 64), Tensor.empty(64, 10), Tensor.empty(10), Tensor.empty(8, 10)
    logits = x @ w + b
    grad = logits - t
    ks = kernels(logits.exp().sum(), (grad.reshape(8, 10, 1) * x.reshape(8, 1, 64)).sum(0))
    assert sum(1 for k in ks for u in k.ast.toposort if u.op is Ops.REDUCE) == 3  # matmul, loss sum, weight grad


def test_an_output_that_a_big_expand_repeats_stays_a_plain_boundary():
    # x is realized anyway (an output): the reduction inside it must not become a kernel of its own
    a, c, w = Tensor.empty(8, 16), Tensor.empty(8), Tensor.empty(8, 32)
    x = a.sum(1) * c
    y = (x.reshape(8, 1).expand(8, 32) * w).sum(0)
    assert len(kernels(x, y)) == 2
