"""TinyJit replays a CPU step's kernels as one batched call (`xgrad_cpu.batch.CPUBatch`): same results as the step
by step replay, across new inputs, new variable values (symbolic sizes) and thread counts."""

from __future__ import annotations

import numpy as np

from xgrad import Tensor, TinyJit, Variable
from xgrad.helpers import Context
from xgrad_cpu.batch import CPUBatch


def test_replay_is_one_batch_and_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 48)).astype(np.float32)
    wt = Tensor(w).realize()

    @TinyJit
    def step(x: Tensor) -> Tensor:
        h = (x @ wt).relu()
        return (h - h.mean(1, keepdim=True)).exp().sum(1).realize()

    for i in range(5):
        x = rng.standard_normal((8, 64)).astype(np.float32)
        h = np.maximum(x @ w, 0)
        expected = np.exp(h - h.mean(1, keepdims=True)).sum(1)
        np.testing.assert_allclose(step(Tensor(x)).numpy(), expected, rtol=1e-5)
        if i >= 2:  # captured: its kernels run as one batch
            assert [type(r) for r in step.runs] == [CPUBatch] and len(step.steps) > 1


def test_batch_follows_variables_and_thread_counts() -> None:
    cache = Tensor.zeros(32, 16).contiguous().realize()
    pos = Variable("pos", 0, 31)
    table = np.zeros((32, 16), np.float32)

    @TinyJit
    def write(x: Tensor, at: Variable) -> Tensor:
        cache.shrink(((at, at + 1), None)).assign(x).realize()
        return (cache.shrink(((0, at + 1), None)) * 2).sum(0).realize()  # a size that depends on the variable

    for i, threads in enumerate([1, 2, 1, 2, 2, 1, 2]):
        row = np.full((1, 16), i + 1, np.float32)
        table[i] = row
        with Context(NUM_CPU_THREADS=threads):
            out = write(Tensor(row), pos.bind(i)).numpy()
        np.testing.assert_allclose(out, (table[: i + 1] * 2).sum(0))
    assert any(isinstance(r, CPUBatch) for r in write.runs)
