"""TinyJit shares memory between the intermediates of a captured step whose lifetimes do not overlap."""

from __future__ import annotations

import numpy as np

from xgrad import Tensor, TinyJit
from xgrad.helpers import GlobalCounters


def test_a_replayed_chain_shares_its_intermediates_and_matches_eager() -> None:
    rng = np.random.default_rng(0)
    ws = [Tensor(rng.standard_normal((64, 64)).astype(np.float32) / 8).realize() for _ in range(6)]
    state = Tensor.zeros(64).contiguous().realize()  # read and written by every call: must keep its own memory

    def step(x: Tensor) -> Tensor:
        for w in ws:  # each layer's output realized: 6 intermediates of one size, each dead after the next layer
            x = (x @ w).relu().realize()
        state.assign(state + x.sum(0)).realize()
        return (x.sum() + state.sum()).realize()

    jitted = TinyJit(step)
    xs = [rng.standard_normal((8, 64)).astype(np.float32) for _ in range(6)]
    before = GlobalCounters.mem_used
    got = [jitted(Tensor(x)).item() for x in xs]
    outs = {id(st.item.bufs[0]) for st in jitted.steps}
    assert len(outs) < len(jitted.steps)  # some kernels write the same (shared) buffer
    state.assign(Tensor.zeros(64)).realize()
    h, want = None, []
    for x in xs:  # numpy's answer for the same sequence of calls
        a = x
        for w in ws:
            a = np.maximum(a @ w.numpy(), 0)
        h = a.sum(0) if h is None else h + a.sum(0)
        want.append(a.sum() + h.sum())
    np.testing.assert_allclose(got, want, rtol=1e-4)
    assert GlobalCounters.mem_used - before < 6 * 8 * 64 * 4 * 2  # not every intermediate kept
