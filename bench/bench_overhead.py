"""Python overhead of xgrad: per-realize cost on a schedule-cache hit, and the time to compile a new kernel.

Run: .venv/bin/python bench/bench_overhead.py   (prints times next to numpy's for the same op; asserts nothing)

The realize loop runs `(a @ b).realize()` on the same 256x256 inputs; the kernel time alone is measured by launching
the compiled program directly and the graph build by building it without realizing, so what is left is the engine's
Python cost on a cached schedule (finding the cached schedule, binding buffers, launching). Best of twelve runs each:
the machine may be shared. Then everyday calls (making, slicing, reading back tensors, `Tensor.rand`). New-kernel
compile time is the wall time of realizing graphs the process has not seen, with an empty cache directory (clang
included).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable

import numpy as np


def per_call_us(fn: Callable[[], object], n: int, runs: int = 12, warmup: int = 5) -> float:
    """Microseconds per call: the best of `runs` runs of `n` calls (the machine may be shared, and other work only
    adds time), after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n * 1e6)
    return best


def main() -> None:
    os.environ.setdefault("XGRAD_CACHE_DIR", tempfile.mkdtemp(prefix="xgrad-bench-overhead-"))
    from xgrad import Device, Tensor
    from xgrad.engine.schedule import create_schedule

    rng = np.random.default_rng(0)
    an, bn = rng.standard_normal((256, 256), dtype=np.float32), rng.standard_normal((256, 256), dtype=np.float32)
    a, b = Tensor(an).realize(), Tensor(bn).realize()

    def realize_matmul() -> None:
        (a @ b).realize()

    realize_us = per_call_us(realize_matmul, 50)
    build_us = per_call_us(lambda: a @ b, 50)  # building the lazy graph alone (the Tensor API, not the engine)
    items, _ = create_schedule([(a @ b).uop])
    dev = Device[items[0].device]
    program = dev.compile(items[0].ast)
    handles = [buf.handle for buf in items[0].bufs]
    kernel_us = per_call_us(lambda: program(handles, {}, wait=True), 50)
    numpy_us = per_call_us(lambda: an @ bn, 50)
    print(
        f"(a @ b).realize() 256x256, schedule-cache hit: {realize_us:.0f} us/call = graph build {build_us:.0f} us "
        f"+ kernel {kernel_us:.0f} us + engine {realize_us - build_us - kernel_us:.0f} us; numpy {numpy_us:.0f} us"
    )

    x = Tensor(rng.standard_normal(64, dtype=np.float32)).realize()

    def small_op() -> None:
        (x * 2 + 1).realize()

    small_us = per_call_us(small_op, 125)
    small_build_us = per_call_us(lambda: x * 2 + 1, 125)
    xn = x.numpy()
    numpy_small_us = per_call_us(lambda: xn * 2 + 1, 125)
    print(
        f"(x * 2 + 1).realize() 64 floats, schedule-cache hit: {small_us:.0f} us/call "
        f"(graph build {small_build_us:.0f} "
        f"us); numpy {numpy_small_us:.2f} us/call"
    )

    # everyday calls around the kernels: making tensors, reading results back, slicing, drawing random numbers
    xs = rng.standard_normal((64, 64), dtype=np.float32)
    t64 = Tensor(xs).realize()
    calls: list[tuple[str, Callable[[], object], Callable[[], object]]] = [
        ("Tensor(64x64 ndarray)", lambda: Tensor(xs), lambda: np.array(xs)),
        ("t[3] (lazy view)", lambda: t64[3], lambda: xs[3]),
        ("(t + 1).realize().numpy()", lambda: (t64 + 1).realize().numpy(), lambda: xs + 1),
        ("Tensor.rand(64, 64).realize()", lambda: Tensor.rand(64, 64).realize(), lambda: rng.random((64, 64))),
    ]
    for name, ours, theirs in calls:
        print(
            f"{name}: {per_call_us(ours, 20, runs=6):.0f} us/call; numpy {per_call_us(theirs, 20, runs=6):.1f} us/call"
        )

    compiled_before = dev.compiled_count
    start = time.perf_counter()
    for k in range(1, 9):  # shapes the process has not seen: each is a new kernel (matmul, softmax, sum)
        m = Tensor(rng.standard_normal((32 + k, 48), dtype=np.float32))
        w = Tensor(rng.standard_normal((48, 16 + k), dtype=np.float32))
        (m @ w).softmax(-1).sum(0).realize()
    seconds = time.perf_counter() - start
    kernels = dev.compiled_count - compiled_before
    print(f"new kernels: {kernels} compiled in {seconds:.2f} s: {seconds / max(kernels, 1) * 1e3:.0f} ms per kernel")


if __name__ == "__main__":
    main()
