"""Cold `create_schedule` time (a schedule-cache miss) of a few graphs: CPU time, best of N; asserts nothing.

Run: .venv/bin/python bench/bench_schedule.py [runs]

Each run builds a fresh graph (new buffers, so nothing of the last run is cached on its nodes) and calls
`create_schedule` directly, past the schedule cache. CPU time (`time.process_time`), not wall time: the machine may be
shared. Graphs: `chain120` 120 elementwise ops, `mixed120` the same with reductions and movement ops between them,
`reduce120` a 120-op chain with a mean every third op (each mean a kernel that recomputes the chain before it), `cnn`
the forward and backward graph of a small two-conv network. Also printed: the graph_rewrite steps of each pass
(`RewriteStats.calls`), a count that does not depend on the machine's load.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable

import numpy as np

from xgrad import Tensor
from xgrad.engine.schedule import create_schedule
from xgrad.uop.ops import UOp
from xgrad.uop.pattern import RewriteStats


def chain120() -> list[UOp]:
    x = Tensor.rand(64, 64)
    for i in range(120):
        x = (x * 1.01 + 0.5).relu() if i % 2 else x.exp2().log2()
    return [x.uop]


def mixed120() -> list[UOp]:
    x, y = Tensor.rand(64, 64), Tensor.rand(64, 64)
    for i in range(120):
        if i % 10 == 3:
            x = x + x.sum(axis=1, keepdim=True) * 0.001
        elif i % 10 == 6:
            x = x.permute(1, 0).reshape(64, 64) + y
        elif i % 10 == 8:
            x = x.pad(((1, 1), (0, 0)))[1:65, :].flip(0) * 0.5
        else:
            x = (x * 1.01 + 0.5).relu() if i % 2 else x.exp2().log2()
    return [x.uop]


def reduce120() -> list[UOp]:
    x = Tensor.rand(64, 64)
    for i in range(120):
        if i % 3 == 0:
            x = x - x.mean(axis=1, keepdim=True)
        else:
            x = x.exp2() if i % 3 == 1 else (x * 0.5).relu()
    return [x.uop]


def cnn() -> list[UOp]:
    rng = np.random.default_rng(0)
    x = Tensor.rand(8, 1, 16, 16)
    w1 = Tensor(rng.random((4, 1, 3, 3), dtype=np.float32))
    w2 = Tensor(rng.random((8, 4, 3, 3), dtype=np.float32))
    w3 = Tensor(rng.random((8 * 12 * 12, 10), dtype=np.float32))
    loss = (x.conv2d(w1).relu().conv2d(w2).relu().reshape(8, -1) @ w3).log_softmax().mean()
    return [loss.uop, *(g.uop for g in loss.gradient(w1, w2, w3))]


GRAPHS: dict[str, Callable[[], list[UOp]]] = {
    "chain120": chain120,
    "mixed120": mixed120,
    "reduce120": reduce120,
    "cnn": cnn,
}


def cold_ms(build: Callable[[], list[UOp]], runs: int) -> tuple[float, int, dict[str, int]]:
    """Best CPU milliseconds of `runs` cold schedules, the number of items and the rewrite steps of the last one."""
    best = float("inf")
    items = 0
    steps: dict[str, int] = {}
    for _ in range(runs):
        roots = build()  # realizes the random inputs (their own schedules) before the clock starts
        gc.collect()
        RewriteStats.calls.clear()
        start = time.process_time()
        out, _ = create_schedule(roots)
        best = min(best, time.process_time() - start)
        items, steps = len(out), dict(RewriteStats.calls)
    return best * 1e3, items, steps


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    for name, build in GRAPHS.items():
        ms, items, steps = cold_ms(build, runs)
        print(f"{name:10s} {ms:7.1f} ms  {items:3d} items  rewrite steps {steps}")


if __name__ == "__main__":
    main()
