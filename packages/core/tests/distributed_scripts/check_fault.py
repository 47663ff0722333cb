"""Run under mpirun by test_distributed.py (with DIST_TIMEOUT set low): rank 1 dies in the middle of a training step,
the other ranks must raise a RankFailedError naming rank 1 within the timeout (plus the watchdog's grace), not hang.

Each surviving rank prints "OK rank=<rank> <seconds it waited>" and writes the error's message to
<argv[2]>/message.<rank> (a file: the ranks' lines interleave on mpirun's stdout, even mid-line).
With argv[1] "overlap" the step is a DataParallel backward whose buckets' collectives are started (in flight) before
the one that finds rank 1 gone. Every rank first runs one whole step, so the timed step compiles nothing (on a slow,
loaded machine the step's first compiles took seconds of the time the test bounds)."""

from __future__ import annotations

import os
import pathlib
import sys
import time

import numpy as np

from xgrad import Tensor, nn
from xgrad.distributed import DataParallel, RankFailedError, all_reduce, rank, world_size
from xgrad.distributed.comm import GRACE
from xgrad.helpers import DIST_TIMEOUT

R, W = rank(), world_size()
w = Tensor(np.ones(1000, np.float32))
assert all_reduce(w).numpy()[0] == W  # a first collective works on every rank
grad = (w * 2 + R).contiguous().realize()  # this step's local work
layers = [nn.Linear(8, 8) for _ in range(4)]
dp = DataParallel(layers, bucket_mb=300 / 2**20)  # 75 floats a bucket: each layer's weight and bias apart


def overlapped_step() -> None:
    x = Tensor(np.ones((2, 8), np.float32))
    for layer in layers:
        x = layer(x).relu()
    dp.backward(x.sum())
    Tensor.realize(*[layer.weight.grad for layer in layers])  # type: ignore[misc]


step = overlapped_step if sys.argv[1] == "overlap" else lambda: all_reduce(grad).realize()
step()  # with every rank: the kernels are compiled and cached before the timed step
if R == 1:
    os._exit(3)  # dies mid-step, before its collective
start = time.perf_counter()
try:
    step()
except RankFailedError as e:
    waited = time.perf_counter() - start
    assert e.ranks == (1,), e.ranks
    assert "rank 1 did not answer" in str(e), str(e)
    assert waited < float(DIST_TIMEOUT.value) + GRACE + 5, waited
    try:  # the communicator is broken: the next collective fails at once
        all_reduce(grad).realize()
        raise AssertionError("a collective after the failure ran")
    except RankFailedError:
        pass
    (pathlib.Path(sys.argv[2]) / f"message.{R}").write_text(str(e))
    print(f"OK rank={R} {waited:.2f}", flush=True)
else:
    raise AssertionError(f"rank {R}: the collective with a dead rank completed")
