"""Kernel boundaries: how many kernels the scheduler makes for common graphs (no device runs: DEV=NULL)."""

from __future__ import annotations

import numpy as np
import pytest

from xgrad.dtype import dtypes
from xgrad.engine.indexing import KernelCtx, push_index
from xgrad.engine.schedule import create_schedule, kernel_order
from xgrad.errors import XgradError
from xgrad.helpers import Context
from xgrad.tensor import Tensor
from xgrad.uop.ops import Ops, UOp
from xgrad.uop.passes import add_pass_hook, remove_pass_hook


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


# ---- the pipeline: named passes, a hook around each, the order of assigns ----
def test_create_schedule_runs_its_passes_in_order_through_the_hook():
    seen: list[tuple[str, Ops]] = []

    def hook(name: str, graph: UOp, seconds: float) -> None:
        assert seconds >= 0
        seen.append((name, graph.op))

    add_pass_hook(hook)
    try:
        with Context(SPEC=1, SPLIT_REDUCEOP=1):
            kernels((Tensor.empty(16, 16) + 1).sum(1))
    finally:
        remove_pass_hook(hook)
    names = [name for name, _ in seen]
    assert names == ["check tensor graph", "split reductions", "kernel boundaries", "order kernels", "lower kernels"]
    assert all(op is Ops.SINK for _, op in seen)


def test_debug_6_prints_each_pass_result(capsys: pytest.CaptureFixture[str]):
    with Context(DEBUG=6):
        kernels(Tensor.empty(4, 4).sum(1) * 2)
    out = capsys.readouterr().out
    for name in ("kernel boundaries", "order kernels", "lower kernels"):
        assert f"--- after {name} ---" in out
    found = out.split("--- after kernel boundaries ---")[1].split("---")[0]
    assert found.strip() == "MUL dtypes.float (4,)"  # the one boundary: the reduction fuses into it


def test_an_assign_runs_after_the_kernels_that_read_the_old_value():
    a = Tensor([1.0, 2.0, 3.0, 4.0], device="CPU").realize()
    old_doubled = (a * 2).contiguous()  # reads the buffer the assign overwrites
    later = old_doubled + 1  # reads it only through old_doubled's buffer
    a.assign(a + 10)
    items, _ = create_schedule([a.uop, later.uop])  # the assign comes first in the graph's order
    order = [it.ast.src[0].src[1].op for it in items]
    assert order.index(Ops.MUL) < order.index(Ops.ADD)  # the reader (a * 2) before the assign (a + 10)
    a2 = Tensor([1.0, 2.0, 3.0, 4.0], device="CPU").realize()
    reader = (a2 * 2).contiguous() + 1
    a2.assign(a2 + 10)
    a2.realize(reader)
    np.testing.assert_array_equal(reader.numpy(), np.array([1.0, 2.0, 3.0, 4.0]) * 2 + 1)
    np.testing.assert_array_equal(a2.numpy(), np.array([11.0, 12.0, 13.0, 14.0]))


def test_kernel_order_keeps_a_graph_without_assign_in_its_order():
    a = Tensor.empty(8)
    x = (a + 1).contiguous()
    y = (x * 2).contiguous()
    nodes = [y.uop.src[0].src[0], y.uop.src[0]]  # not a real schedule's boundaries, only an order to keep
    assert kernel_order(nodes) == nodes
    items, _ = create_schedule([y.uop])
    assert [it.ast.src[0].src[1].op for it in items] == [Ops.ADD, Ops.MUL]


def test_an_assign_that_reads_another_assigns_result_runs_after_it():
    a = Tensor([1.0, 2.0], device="CPU").realize()
    b = Tensor([10.0, 20.0], device="CPU").realize()
    a.assign(b + 1)  # reads b's old value: runs before b's assign
    b.assign(a + 1)  # reads a's new value
    a.realize(b)
    assert a.tolist() == [11.0, 21.0] and b.tolist() == [12.0, 22.0]


def test_index_lowering_refuses_an_op_it_has_no_rule_for():
    ctx = KernelCtx({}, [])
    var = UOp(Ops.SINK, dtypes.void, ())  # no tensor-graph op pushes through a SINK
    with pytest.raises(XgradError, match="cannot lower Ops.SINK"):
        push_index(var, (), ctx)
