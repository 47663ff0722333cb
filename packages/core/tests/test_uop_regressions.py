"""Regressions in the UOp core: deep graphs (no recursion limit on shape/device/bounds/lowering/rendering), int bounds
that overflow their dtype, and the gradient of a product reduction (zeros included, against torch)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from xgrad.dtype import dtypes
from xgrad.tensor import Tensor
from xgrad.uop.ops import Ops, UOp
from xgrad.uop.symbolic import simplify

DEEP = 3000  # far past Python's default recursion limit of 1000


def test_shape_device_and_base_of_a_deep_graph_built_without_reading_them():
    u = UOp.const(dtypes.float32, 1.0, "CPU", (3,))
    for _ in range(DEEP):
        u = UOp(Ops.ADD, u.dtype, (u, u))  # built directly: no shape is read while building
    assert u.shape == (3,) and u.device == "CPU"
    v = UOp.const(dtypes.float32, 1.0, "CPU", (3,))
    for _ in range(DEEP):
        v = v.reshape((3, 1)).reshape((3,))
    assert v.base.op is Ops.CONST


def test_bounds_and_simplify_of_a_deep_index_expression():
    x = UOp.variable("x", 0, 10)
    u = x
    for _ in range(DEEP):
        u = u + 1
    assert u.vmin_vmax == (DEEP, DEEP + 10)
    assert simplify(u).render() == f"(x+{DEEP})"


def test_realize_of_a_long_chain_of_adds(xgrad_device):
    x = Tensor([1.0, 2.0], device=xgrad_device)
    for _ in range(1200):
        x = x + 1
    np.testing.assert_array_equal(x.numpy(), [1201.0, 1202.0])


def test_int_mul_bounds_fall_back_to_the_dtype_range_on_overflow():
    x = UOp.variable("x", 2, 1000, dtypes.int32)
    assert (x * x).vmin_vmax == (4, 1_000_000)
    y = x
    for _ in range(40):  # repeated squaring: exact bounds would be astronomically large ints
        y = y * y
    assert y.vmin_vmax == (dtypes.min(dtypes.int32), dtypes.max(dtypes.int32))
    assert simplify(y.lt(5)).op is Ops.CMPLT  # not decided: the value may have wrapped
    b = UOp.variable("b", 0, 200, dtypes.uint8)
    assert (b * 2).vmin_vmax == (0, 255) and (b + 100).vmin_vmax == (0, 255)
    assert (b - 1).vmin_vmax == (0, 255)


def test_index_bounds_past_int64_become_unbounded():
    x = UOp.variable("x", 2, 1 << 40)
    assert (x * x).vmin_vmax == (-float("inf"), float("inf"))


ZERO_CASES = {
    "no_zero": [[1.5, 2.0, -3.0], [0.5, 4.0, 1.0]],
    "one_zero": [[1.5, 0.0, -3.0], [0.5, 4.0, 1.0]],
    "two_zeros": [[0.0, 0.0, -3.0], [0.5, 0.0, 1.0]],
    "all_zero": [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
}


@pytest.mark.parametrize("axis", [None, 0, 1])
@pytest.mark.parametrize("case", list(ZERO_CASES))
def test_prod_gradient_with_zeros_matches_torch(xgrad_device, case, axis):
    a = np.array(ZERO_CASES[case], dtype=np.float32)
    x = Tensor(a, device=xgrad_device)
    tx = torch.tensor(a, requires_grad=True)
    y = x.prod() if axis is None else x.prod(axis)
    ty = tx.prod() if axis is None else tx.prod(axis)
    (y * y + y).sum().backward()
    (ty * ty + ty).sum().backward()
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-6)
    assert x.grad is not None and tx.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_prod_is_one_product_reduction():
    y = Tensor([[1.0, 2.0], [3.0, 4.0]]).prod(1, keepdim=True)
    assert y.uop.op is Ops.REDUCE_AXIS and y.uop.arg == (Ops.MUL, (1,))


def _recursive_order(u: UOp, order: dict[UOp, None]) -> None:
    """The reference: a recursive depth-first walk, sources left to right, each node after its sources."""
    for s in u.src:
        if s not in order:
            _recursive_order(s, order)
    order[u] = None


@pytest.mark.parametrize("seed", range(5))
def test_toposort_is_the_recursive_depth_first_order(seed: int) -> None:
    # schedule-cache keys list a graph's nodes in this order: a walk that ordered shared sources differently would
    # give one graph two keys; random DAGs with shared nodes, leaves of several kinds, repeated sources
    rng = np.random.default_rng(seed)
    nodes = [UOp.const(dtypes.float32, float(i), "CPU", (4,)) for i in range(4)]
    nodes.append(UOp.variable("n", 1, 8))
    for _ in range(300):
        picks = [nodes[int(i)] for i in rng.integers(0, len(nodes), int(rng.integers(1, 4)))]
        ops = (Ops.ADD, Ops.MUL, Ops.MAX)
        nodes.append(UOp(ops[int(rng.integers(0, 3))], dtypes.float32, tuple(picks)))
    sink = UOp(Ops.SINK, dtypes.void, tuple(nodes[-40:]))
    expected: dict[UOp, None] = {}
    _recursive_order(sink, expected)
    assert list(sink.toposort_into({})) == list(expected)
    start: dict[UOp, None] = {}  # into an order that holds some nodes already: only the rest are appended
    for n in nodes[50:60]:
        _recursive_order(n, start)
    order = dict(start)
    _recursive_order(sink, order)
    assert list(sink.toposort_into(dict(start))) == list(order)
    leaf = nodes[0].src[0].src[0].src[0]  # a const's DEVICE: no sources
    assert not leaf.src and list(leaf.toposort_into({})) == [leaf]
    assert sink.toposort_into(dict(expected)) == expected  # nothing new to append
