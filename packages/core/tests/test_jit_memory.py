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


def test_a_capture_reuses_the_intermediates_of_its_earlier_schedules() -> None:
    """While capturing, each realize's intermediates (dead once it ran, but held by the recording) serve later
    realizes: a capture of a step that realizes layer by layer holds one layer's at a time, not every layer's."""
    rng = np.random.default_rng(1)
    ws = [Tensor(rng.standard_normal((128, 128)).astype(np.float32) / 16).realize() for _ in range(8)]

    used: list[int] = []

    def step(x: Tensor) -> Tensor:
        used.append(GlobalCounters.mem_used)
        for w in ws:  # (w * 2 + 1) is realized inside each layer's schedule: an intermediate of 64 KiB
            x = (x @ ((w * 2 + 1).contiguous() - 1)).relu().realize()
        used[-1] = GlobalCounters.mem_used - used[-1]  # what the capture holds at its end
        return x

    jitted = TinyJit(step)
    xs = [rng.standard_normal((4, 128)).astype(np.float32) for _ in range(4)]
    got = []
    for x in xs:
        got.append(jitted(Tensor(x)).numpy())
    assert len(used) == 2  # an eager call, then the capture: its 8 layers' 64 KiB intermediates share one block
    assert used[1] < 2 * 128 * 128 * 4
    inner = {id(st.item.bufs[0]) for st in jitted.steps if st.item.bufs[0].nbytes == 128 * 128 * 4}
    assert len(inner) <= 2
    for x, g in zip(xs, got):
        a = x
        for w in ws:
            a = np.maximum(a @ (w.numpy() * 2), 0)
        np.testing.assert_allclose(g, a, rtol=1e-4, atol=1e-5)
