"""CPU speed against numpy and torch, measured in one process on the same data, next to the machine's peak.

Run: .venv/bin/python bench/bench_cpu.py [--quick]
Prints, per workload: best-of-N time for xgrad (heuristic opts), numpy and torch, the ratios xgrad/numpy and
xgrad/torch (below 1 means xgrad is faster) and xgrad's GFLOPS or GB/s. The peak is measured first: an FMA loop and a
copy loop compiled by the same C compiler the CPU backend uses. Asserts nothing.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import time
from collections.abc import Callable

import numpy as np

from xgrad import Tensor, TinyJit
from xgrad_cpu.compiler import CCompiler
from xgrad_cpu.program import load_library

PEAK_SRC = """
#include <stddef.h>
typedef float float8 __attribute__((vector_size(32)));
float fma_loop(long iters) {
  float8 a0 = {1,1,1,1,1,1,1,1}, a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  const float8 m = {0.999999f,0.999999f,0.999999f,0.999999f,0.999999f,0.999999f,0.999999f,0.999999f};
  const float8 c = {1e-7f,1e-7f,1e-7f,1e-7f,1e-7f,1e-7f,1e-7f,1e-7f};
  for (long i = 0; i < iters; i++) {
    a0 = a0*m+c; a1 = a1*m+c; a2 = a2*m+c; a3 = a3*m+c; a4 = a4*m+c; a5 = a5*m+c; a6 = a6*m+c; a7 = a7*m+c;
  }
  float8 s = a0+a1+a2+a3+a4+a5+a6+a7;
  return s[0]+s[7];
}
void copy_loop(float* restrict dst, const float* restrict src, long n) { for (long i = 0; i < n; i++) dst[i] = src[i]; }
"""


def best(fn: Callable[[], object], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def peak() -> tuple[float, float]:
    """Single-core FMA GFLOPS and copy GB/s (times the cores for the machine)."""
    lib = load_library(CCompiler().compile(PEAK_SRC))
    lib.fma_loop.restype = ctypes.c_float
    lib.fma_loop.argtypes = [ctypes.c_long]
    iters = 20_000_000
    t = best(lambda: lib.fma_loop(iters), 3)
    gflops = iters * 8 * 8 * 2 / t / 1e9
    n = 1 << 24
    src, dst = np.ones(n, np.float32), np.empty(n, np.float32)
    lib.copy_loop.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
    t = best(lambda: lib.copy_loop(dst.ctypes.data, src.ctypes.data, n), 5)
    return gflops, 2 * n * 4 / t / 1e9


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer repetitions")
    args = parser.parse_args()
    reps = 3 if args.quick else 5
    cores = len(os.sched_getaffinity(0))
    fma, copy = peak()
    print(f"peak: {fma:.1f} GFLOPS/core FMA ({fma * cores:.1f} on {cores} cores), {copy:.1f} GB/s copy (1 core)")
    try:
        import torch

        torch.set_num_threads(cores)
    except ImportError:
        torch = None  # type: ignore[assignment]
    rng = np.random.default_rng(0)
    rows: list[tuple[str, Callable[[], object], Callable[[], object], Callable[[], object] | None, float, str]] = []

    def add(
        name: str,
        shapes: list[tuple[int, ...]],
        xg: Callable[..., Tensor],
        npf: Callable[..., object],
        tf: Callable[..., object] | None,
        work: float,
        unit: str,
    ) -> None:
        arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        tensors = [Tensor(a).realize() for a in arrays]
        torch_ts = [torch.from_numpy(a) for a in arrays] if torch is not None else []
        rows.append(
            (
                name,
                lambda: xg(*tensors).realize(),
                lambda: npf(*arrays),
                (lambda: tf(*torch_ts)) if tf is not None and torch is not None else None,
                work,
                unit,
            )
        )

    def matmul(a: object, b: object) -> object:
        return a @ b  # type: ignore[operator]

    def np_softmax(a: np.ndarray) -> np.ndarray:
        e = np.exp(a - a.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def chain(a: object, b: object, c: object) -> object:
        return (a + b) * c - a / 2  # type: ignore[operator]

    for n in (256, 1024) if args.quick else (256, 1024, 2048):
        add(f"matmul {n}", [(n, n), (n, n)], matmul, matmul, matmul, 2 * n**3, "GFLOPS")
    add("batched matmul 16x256", [(16, 256, 256)] * 2, matmul, matmul, matmul, 2 * 16 * 256**3, "GFLOPS")
    m = 1024 if args.quick else 4096
    add(
        f"softmax {m}x{m}",
        [(m, m)],
        lambda a: a.softmax(-1),
        np_softmax,
        (lambda a: torch.softmax(a, -1)) if torch is not None else None,
        m * m * 4 * 2,
        "GB/s",
    )
    e = 1 << (22 if args.quick else 24)
    add("elementwise (a+b)*c-a/2", [(e,)] * 3, chain, chain, chain, 4 * e * 4, "GB/s")
    s = 1 << (24 if args.quick else 26)
    add("sum of floats", [(s,)], lambda a: a.sum(), lambda a: a.sum(), lambda a: a.sum(), s * 4, "GB/s")
    print(
        f"{'workload':28s} {'xgrad ms':>10s} {'numpy ms':>10s} {'torch ms':>10s} {'x/numpy':>8s} {'x/torch':>8s}"
        f" {'xgrad':>14s}"
    )
    for name, xg, npf, tf, work, unit in rows:
        tx, tn = best(xg, reps), best(npf, reps)
        tt = best(tf, reps) if tf is not None else float("nan")
        rate = work / tx / 1e9
        print(
            f"{name:28s} {tx * 1e3:10.2f} {tn * 1e3:10.2f} {tt * 1e3:10.2f} {tx / tn:8.2f} {tx / tt:8.2f}"
            f" {rate:8.1f} {unit}"
        )
    a, b = Tensor(np.ones(16, np.float32)).realize(), Tensor(np.ones(16, np.float32)).realize()
    tiny = TinyJit(lambda x, y: (x * y + 1).realize())
    n_calls = 2000
    for _ in range(5):
        tiny(a, b)
    start = time.perf_counter()
    for _ in range(n_calls):
        tiny(a, b)
    print(f"tiny jitted op replay: {(time.perf_counter() - start) / n_calls * 1e6:.1f} us/call")
    print("BEAM search: not implemented yet (heuristic optimizations only)")


if __name__ == "__main__":
    main()
