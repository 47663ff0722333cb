"""`xgrad.uop.sharding`: the split axis the IR reads off a multi-device graph (UOp.axis, Tensor.shard_axis) is the one
the multi-device lowering (`xgrad.engine.multi.lower_multi`, the oracle) produces, node by node."""

from __future__ import annotations

import doctest
from collections.abc import Callable

import numpy as np
import pytest

import xgrad.uop.sharding
from xgrad import Tensor
from xgrad.engine.multi import Sharded, lower_multi
from xgrad.errors import ShardingError
from xgrad.uop.ops import Ops, UOp
from xgrad.uop.sharding import split_axes, split_axis

D1 = ("CPU",)
D2 = ("CPU", "CPU:1")


def _t(*shape: int) -> Tensor:
    return Tensor(np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape))


def _lowered_splits(u: UOp) -> dict[UOp, tuple[int | None, bool]]:
    out = {}
    for node, v in lower_multi([u]).items():
        if isinstance(v, Sharded):
            out[node] = (v.axis, all(s.base.op is Ops.BUFFER for s in v.shards))
    return out


GRAPHS: dict[str, Callable[[], Tensor]] = {
    "shard axis 1": lambda: _t(4, 4).shard(D2, axis=1),
    "realized, elementwise": lambda: _t(4, 4).shard(D2, axis=1).realize() + 1,
    "realized axis 1, flat": lambda: _t(4, 4).shard(D2, axis=1).realize().reshape(16),
    "reshape keeps the split": lambda: _t(4, 8).shard(D2, axis=0).realize().reshape(2, 2, 8),
    "reshape gathers": lambda: _t(4, 6).shard(D2, axis=1).reshape(24),
    "permute": lambda: _t(4, 6).shard(D2, axis=1).realize().T,
    "expand": lambda: _t(4, 1).shard(D2, axis=0).realize().expand(4, 3),
    "pad the split axis": lambda: _t(4, 4).shard(D2, axis=0).realize().pad(((1, 1), (0, 0))),
    "pad another axis": lambda: _t(4, 4).shard(D2, axis=0).realize().pad(((0, 0), (1, 1))),
    "flip": lambda: _t(4, 4).shard(D2, axis=0).realize().flip(0),
    "slice across shards": lambda: _t(4, 4).shard(D2, axis=0).realize()[1:3],
    "slice another axis": lambda: _t(4, 4).shard(D2, axis=0).realize()[:, 1:3],
    "reduce the split axis": lambda: _t(4, 4).shard(D2, axis=0).sum(0),
    "reduce another axis": lambda: _t(4, 4).shard(D2, axis=1).sum(0),
    "reshard": lambda: _t(4, 4).shard(D2, axis=0).realize().shard(D2, axis=1),
    "replicas to a split": lambda: _t(4, 4).shard(D2).realize().shard(D2, axis=1),
    "one device, split": lambda: _t(4, 4).shard(D1, axis=1).realize().reshape(16) * 2,
    "one device, slice": lambda: _t(4, 4).shard(D1, axis=0).realize()[1:3],
    "mixed splits": lambda: _t(4, 4).shard(D2, axis=0) + _t(4, 4).shard(D2, axis=1),
    "replicated and split": lambda: _t(4, 4).shard(D2) * _t(4, 4).shard(D2, axis=1),
}


@pytest.mark.parametrize("name", GRAPHS)
def test_split_axes_are_the_lowering_s(name: str) -> None:
    u = GRAPHS[name]().uop
    lowered = _lowered_splits(u)
    ours = split_axes([u])
    assert lowered, "the graph lives on a device tuple"
    assert {n: (s.axis, s.view) for n, s in ours.items() if n in lowered} == lowered
    assert split_axis(u) == lowered[u][0]


def test_assign_through_a_view_and_across_shards() -> None:
    x = Tensor.zeros(4, 4).shard(D2, axis=0).contiguous().realize()
    inside = x[:, 1:3].assign(Tensor.ones(4, 2).shard(D2, axis=0))
    across = x[1:3].assign(Tensor.ones(2, 4).shard(D2))
    for t, axis in ((inside, 0), (across, None)):
        assert _lowered_splits(t.uop)[t.uop][0] == split_axis(t.uop) == t.shard_axis == axis


def test_realized_buffer_keeps_its_leaf_axis() -> None:
    t = _t(4, 6).shard(D2, axis=1).realize()
    assert split_axis(t.uop) == t.uop.axis == 1 and t.uop.bounds == [(0, 3), (3, 6)]


def test_single_device_nodes_have_no_split() -> None:
    t = _t(4, 4)
    assert split_axis(t.uop) is None and split_axes([(t + 1).uop]) == {}
    with pytest.raises(ShardingError, match="shard it along an axis"):
        _ = t.uop.bounds


def test_docstring_examples_run() -> None:
    result = doctest.testmod(xgrad.uop.sharding, verbose=False)
    assert result.failed == 0 and result.attempted > 0
