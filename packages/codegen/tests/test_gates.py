"""Gate hoisting (`xgrad_codegen.gates`): a sum of gated loads loops zero times where its gate is off, it stays exact
(NaN and inf included) where the gate's zeros matter, and a conv's input gradient computed this way matches torch."""

from __future__ import annotations

import numpy as np
import pytest

from xgrad import Tensor
from xgrad.dtype import dtypes
from xgrad.uop.ops import AxisType, Ops, UOp
from xgrad_codegen.gates import hoist_gates

F32 = dtypes.float32


def gated_load(param: int, pos: UOp, gate: UOp | None) -> UOp:
    buf = UOp(Ops.PARAM, F32, (), param)
    src = (buf, pos) if gate is None else (buf, pos, gate)
    return UOp(Ops.LOAD, F32, (UOp(Ops.INDEX, F32, src),))


def window_sum(both_gated: bool) -> tuple[UOp, UOp, UOp]:
    """sum over k of x[w + k] * y[k], the loads gated by `w < 3` (a window position inside the input)."""
    w, k = UOp.range(6, 0), UOp.range(16, 1, kind=AxisType.REDUCE)
    gate = w.lt(3)
    value = gated_load(1, w * 16 + k, gate) * gated_load(2, k, gate if both_gated else None)
    return UOp(Ops.REDUCE, F32, (value, k), Ops.ADD), gate, k


def test_a_sum_of_gated_loads_loops_zero_times_where_the_gate_is_off() -> None:
    red, gate, k = window_sum(both_gated=True)
    out = hoist_gates(red)
    loop = out.src[1]
    assert loop.op is Ops.RANGE and loop.arg == k.arg
    assert loop.src[0].op is Ops.WHERE and loop.src[0].src[0] is gate  # 16 iterations if the gate holds, else none
    assert all(len(x.src) == 2 for x in out.toposort if x.op is Ops.INDEX)  # inside the loop the gate holds


def test_a_gated_load_times_an_ungated_one_keeps_its_loop() -> None:
    # 0 * inf is NaN: skipping the loop would turn that NaN into 0
    red, _, _ = window_sum(both_gated=False)
    assert hoist_gates(red) is red


def test_a_gate_that_depends_on_the_loop_stays_on_the_loads() -> None:
    w, k = UOp.range(6, 0), UOp.range(16, 1, kind=AxisType.REDUCE)
    gate = (w + k).lt(10)
    value = gated_load(1, w + k, gate) * gated_load(2, k, gate)
    red = UOp(Ops.REDUCE, F32, (value, k), Ops.ADD)
    assert hoist_gates(red) is red


@pytest.mark.parametrize("padding,stride", [(0, 1), (1, 1), (2, 2)])
def test_conv_input_gradient_matches_torch(padding: int, stride: int) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((4, 3, 9, 9)).astype(np.float32), rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
    xt = Tensor(x, device="CPU").is_param_()
    (xt.conv2d(Tensor(w, device="CPU"), padding=padding, stride=stride).relu() * 1.5).sum().backward()
    tx = torch.tensor(x, requires_grad=True)
    (torch.nn.functional.conv2d(tx, torch.tensor(w), padding=padding, stride=stride).relu() * 1.5).sum().backward()
    assert xt.grad is not None
    np.testing.assert_allclose(xt.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_inf_in_a_skipped_window_position_still_gives_torchs_nan() -> None:
    # the padding of a forward conv gates only the input's loads: an inf weight meets the padded zeros (NaN in torch)
    torch = pytest.importorskip("torch")
    x = np.ones((1, 1, 4, 4), np.float32)
    w = np.ones((1, 1, 3, 3), np.float32)
    w[0, 0, 0, 0] = np.inf
    got = Tensor(x, device="CPU").conv2d(Tensor(w, device="CPU"), padding=1).numpy()
    want = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), padding=1).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
