"""A KV-cache decode loop with symbolic shapes against concrete shapes and numpy, measured in one process.

Run: .venv/bin/python bench/bench_symbolic.py [--steps N] [--dim D]
Each step writes one row into a cache of `steps` rows and attends over the rows written so far:
`softmax(q @ cache[:pos+1].T) @ cache[:pos+1]`. Three ways:
- symbolic: a TinyJit whose position is a bound Variable: the kernels are compiled once and replayed for every step;
- concrete: the same code with an int position: every step has new shapes, so new kernels are compiled;
- numpy: the same math.
Prints the programs compiled and the mean time per step after the first two (the JIT's eager and capture calls), and
the ratios symbolic/numpy and concrete/symbolic (time over time). Checks the results against numpy; asserts no time:
compare ratios measured in the same run.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from xgrad import Device, Tensor, TinyJit, Variable
from xgrad.uop.ops import UOp

WARMUP = 2


def attend(cache: Tensor, q: Tensor, x: Tensor, pos: int | UOp) -> Tensor:
    cache.shrink(((pos, pos + 1), None)).assign(x).realize()
    seen = cache.shrink(((0, pos + 1), None))
    return ((q @ seen.T).softmax(-1) @ seen).realize()


def run(steps: int, dim: int, symbolic: bool, rows: np.ndarray, q: np.ndarray) -> tuple[float, int, np.ndarray]:
    dev = Device[Device.DEFAULT]
    before = int(dev.compiled_count)
    cache = Tensor.zeros(steps, dim).contiguous().realize()
    qt = Tensor(q).realize()
    var = Variable("pos", 0, steps - 1)
    step = TinyJit(lambda x, p: attend(cache, qt, x, p))
    out = None
    start = time.perf_counter()
    for k in range(steps):
        if k == WARMUP:  # the JIT runs eagerly, then captures: time the steps after that
            start = time.perf_counter()
        x = Tensor(rows[k : k + 1]).realize()
        out = step(x, var.bind(k)) if symbolic else attend(cache, qt, x, k)
    assert out is not None
    elapsed = (time.perf_counter() - start) / (steps - WARMUP)
    return elapsed, int(dev.compiled_count) - before, out.numpy()


def run_numpy(steps: int, rows: np.ndarray, q: np.ndarray) -> tuple[float, np.ndarray]:
    cache = np.zeros_like(rows)
    out = q
    start = time.perf_counter()
    for k in range(steps):
        if k == WARMUP:
            start = time.perf_counter()
        cache[k] = rows[k]
        s = q @ cache[: k + 1].T
        e = np.exp(s - s.max(-1, keepdims=True))
        out = (e / e.sum(-1, keepdims=True)) @ cache[: k + 1]
    return (time.perf_counter() - start) / (steps - WARMUP), out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--dim", type=int, default=64)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((args.steps, args.dim)).astype(np.float32)
    q = rng.standard_normal((1, args.dim)).astype(np.float32)
    t_sym, n_sym, out_sym = run(args.steps, args.dim, True, rows, q)
    t_con, n_con, out_con = run(args.steps, args.dim, False, rows, q)
    t_np, out_np = run_numpy(args.steps, rows, q)
    np.testing.assert_allclose(out_sym, out_np, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out_con, out_np, rtol=1e-4, atol=1e-5)
    print(f"device {Device.DEFAULT}, {args.steps} steps, dim {args.dim}")
    print(f"symbolic (TinyJit): {t_sym * 1e3:8.3f} ms/step, {n_sym:4d} programs compiled")
    print(f"concrete          : {t_con * 1e3:8.3f} ms/step, {n_con:4d} programs compiled")
    print(f"numpy             : {t_np * 1e3:8.3f} ms/step")
    print(f"symbolic/numpy {t_sym / t_np:.2f}x   concrete/symbolic {t_con / t_sym:.2f}x")


if __name__ == "__main__":
    main()
