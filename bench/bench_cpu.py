"""CPU speed against numpy and torch, measured in one process on the same data, next to the machine's peak.

Run: .venv/bin/python bench/bench_cpu.py [--quick] [--only NAME] [--beam N] [--reps N] [--avx2]
`--avx2` measures an AVX2-only host on an AVX-512 one: xgrad's kernels are built for x86-64-v3 (CPU_MARCH), torch's
oneDNN and ATen kernels are held to AVX2 (ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY) and numpy's OpenBLAS takes its
Haswell kernels (OPENBLAS_CORETYPE); the script runs itself again with those set, before any of them loads.
Prints, per workload: best-of-N time for xgrad (heuristic opts; with --beam N also under BEAM=N), numpy and torch,
the ratios xgrad/numpy and xgrad/torch (time over time: below 1 means xgrad is faster) and xgrad's GFLOPS or GB/s
with the share of the measured peak. `pair/np` is the paired ratio: the median over the rounds of xgrad's time over
numpy's time in the same round. On a shared machine whose speed drifts in phases of seconds, the two minimums may
come from different phases; the paired ratio compares calls made a fraction of a second apart. The peak (an FMA loop
and a copy loop on one core and on all cores, compiled by the same C compiler the CPU backend uses) is printed
first, and each workload's rounds also run the all-core loop of its unit: its "of peak" is against the best of those,
the machine's speed in the same rounds. The libraries take turns, and each timed call follows a short sleep (the other
libraries' spinning threads go idle) and one untimed warm call (see `interleaved`). Asserts nothing; the machine may
be shared, so compare ratios measured in the same run, not numbers across runs.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from bench_overhead import per_call_us

from xgrad import Tensor, TinyJit
from xgrad.helpers import Context
from xgrad_cpu.compiler import CCompiler
from xgrad_cpu.program import load_library

# what --avx2 sets: every library in the run limited to AVX2 (+FMA), as on a host without AVX-512
AVX2_ENV = {
    "CPU_MARCH": "x86-64-v3",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "ATEN_CPU_CAPABILITY": "avx2",
    "OPENBLAS_CORETYPE": "Haswell",
}
FMA_CHAINS = 12  # independent accumulators: more than FMA latency x FMAs per cycle (4 x 2 on Zen 3 and Zen 5)


def peak_source(lanes: int) -> str:
    """The probe loops in C: an FMA loop over FMA_CHAINS vectors of `lanes` floats (the widest registers the CPU
    backend's kernels use: 16 with AVX-512) and a copy loop."""
    chains = range(FMA_CHAINS)
    return f"""
typedef float floatv __attribute__((vector_size({lanes * 4})));
float fma_loop(long iters) {{
  const floatv zero = {{0}}, m = zero + 0.999999f, c = zero + 1e-7f;
  floatv {", ".join(f"a{i} = zero + 1.00{i:02d}f" for i in chains)};  // distinct: a compiler may merge equal chains
  for (long i = 0; i < iters; i++) {{
    {" ".join(f"a{i} = a{i} * m + c;" for i in chains)}
  }}
  floatv s = {" + ".join(f"a{i}" for i in chains)};
  return s[0] + s[{lanes - 1}];
}}
void copy_loop(float* restrict dst, const float* restrict src, long n) {{
  for (long i = 0; i < n; i++) dst[i] = src[i];
}}
"""


def best(fn: Callable[[], object], reps: int, warmup: bool = True) -> float:
    """The fastest of `reps` timed calls, after one untimed warm-up call (compiles, caches) unless `warmup` is off."""
    if warmup:
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


@dataclass
class Peak:
    fma_core: float  # GFLOPS of one core
    fma_all: float  # GFLOPS of all cores together (the clock may be lower with every core busy)
    copy_core: float  # GB/s (read + write) of one core
    copy_all: float  # GB/s of all cores together
    cores: int


class Probes:
    """The peak loops, ready to run on all cores at once (ctypes drops the GIL, so Python threads run the C loops in
    parallel): an FMA loop (FMA_CHAINS independent vector chains per core, as wide as the generated kernels'
    vectors) and a 64 MiB copy split over the cores. Each workload's rounds also run the probe of its unit, so its
    "of peak" is against the machine's speed in those same rounds (other tenants' load comes and goes in phases of
    seconds)."""

    ITERS = 20_000_000  # FMA loop iterations per core (~20-40 ms)

    def __init__(self, cores: int) -> None:
        self.cores = cores
        compiler = CCompiler()
        self.lanes = compiler.vector_bytes() // 4
        self.lib = load_library(compiler.compile(peak_source(self.lanes)))
        self.lib.fma_loop.restype = ctypes.c_float
        self.lib.fma_loop.argtypes = [ctypes.c_long]
        self.lib.copy_loop.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
        self.n = 1 << 24
        self.src, self.dst = np.ones(self.n, np.float32), np.empty(self.n, np.float32)
        self.chunk = self.n // cores
        self.pool = ThreadPoolExecutor(cores)
        self.fma_flops = self.ITERS * FMA_CHAINS * self.lanes * 2 * cores  # the flops of one `fma_all`
        self.copy_bytes = 2 * self.chunk * cores * 4  # the bytes read and written by one `copy_all`

    def fma_core(self) -> None:
        self.lib.fma_loop(self.ITERS)

    def copy_core(self) -> None:
        self.lib.copy_loop(self.dst.ctypes.data, self.src.ctypes.data, self.n)

    def fma_all(self) -> None:
        for j in [self.pool.submit(self.lib.fma_loop, self.ITERS) for _ in range(self.cores)]:
            j.result()

    def copy_all(self) -> None:
        step = self.chunk * 4
        jobs = [
            self.pool.submit(
                self.lib.copy_loop, self.dst.ctypes.data + i * step, self.src.ctypes.data + i * step, self.chunk
            )
            for i in range(self.cores)
        ]
        for j in jobs:
            j.result()


def measure_peak(probes: Probes) -> Peak:
    """Each probe on one core and on all cores at once, best of a few calls."""
    fma = probes.fma_flops / probes.cores / best(probes.fma_core, 3) / 1e9
    copy_core = 2 * probes.n * 4 / best(probes.copy_core, 5) / 1e9
    fma_all = probes.fma_flops / best(probes.fma_all, 3) / 1e9
    copy_all = probes.copy_bytes / best(probes.copy_all, 5) / 1e9
    return Peak(fma, fma_all, copy_core, copy_all, probes.cores)


@dataclass
class Workload:
    """One line of the table: the same inputs go to the xgrad, numpy and torch functions."""

    name: str
    shapes: list[tuple[int, ...]]
    xgrad: Callable[..., Tensor]
    numpy: Callable[..., object] | None
    torch: Callable[..., object] | None
    work: float  # flops (GFLOPS) or bytes moved (GB/s)
    unit: str
    arrays: list[np.ndarray] = field(default_factory=list)


def interleaved(fns: list[Callable[[], object]], reps: int, settle: float) -> list[list[float]]:
    """The times of `reps` timed calls of each function (one list per function, in round order), calling them in turn
    so that load from other processes on a shared machine hits all of them alike. Each round starts one function
    later (a, b, c, then b, c, a, ...): no function always takes the same slot of a round, which a disturbance with
    about the period of a round would otherwise hit every time.

    Each timed call follows `settle` seconds of sleep and one untimed call of the same function: OpenBLAS's and
    torch's worker threads busy-wait for a while after a call (OpenBLAS ~0.1 s), so on a 2-core machine the next
    library would share its cores with them; and after the sleep the first call runs on idle, slowly clocked cores
    with cold caches (25-50% slower for every library here). Each library is timed warm, on otherwise idle cores, as
    in a loop that calls it back to back."""
    times: list[list[float]] = [[] for _ in fns]
    for r in range(reps):
        for i in range(len(fns)):
            k = (i + r) % len(fns)  # each round starts at the next function (see the docstring)
            time.sleep(settle)
            fns[k]()
            start = time.perf_counter()
            fns[k]()
            times[k].append(time.perf_counter() - start)
    return times


def paired_ratio(ts: list[float], ref: list[float]) -> float:
    """The median over rounds of `ts[i] / ref[i]` (times of two functions measured in the same rounds)."""
    return float(np.median(np.array(ts) / np.array(ref)))


def xgrad_call(w: Workload, tensors: list[Tensor], **knobs: Any) -> Callable[[], object]:
    """One run of a workload in xgrad under the knobs `knobs` (e.g. BEAM=2). The graph is rebuilt each call, so a
    timing includes scheduling from the schedule cache, as a user's code would."""

    def run() -> object:
        with Context(**knobs):
            return w.xgrad(*tensors).realize()

    return run


def matmul(a: Any, b: Any) -> Any:
    return a @ b


def np_softmax(a: np.ndarray) -> Any:
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def chain(a: Any, b: Any, c: Any) -> Any:
    return (a + b) * c - a / 2


def np_conv2d(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """3x3 convolution, stride 1, padding 1, as 9 BLAS matmuls over shifted views (numpy has no conv)."""
    n, _, h, wd = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((w.shape[0], n, h, wd), np.float32)
    for i in range(3):
        for j in range(3):
            out += np.tensordot(w[:, :, i, j], xp[:, :, i : i + h, j : j + wd], axes=([1], [1]))
    return out.transpose(1, 0, 2, 3)


def workloads(quick: bool, torch: Any) -> list[Workload]:
    out: list[Workload] = []
    for n in (256, 1024) if quick else (256, 1024, 2048):
        out.append(Workload(f"matmul {n}", [(n, n), (n, n)], matmul, matmul, matmul, 2 * n**3, "GFLOPS"))
    out.append(
        Workload("batched matmul 16x256", [(16, 256, 256)] * 2, matmul, matmul, matmul, 2 * 16 * 256**3, "GFLOPS")
    )
    batch = 8 if quick else 32
    conv_torch = (lambda x, w: torch.nn.functional.conv2d(x, w, padding=1)) if torch is not None else None
    out.append(
        Workload(
            f"conv2d {batch}x64x56x56 3x3",
            [(batch, 64, 56, 56), (64, 64, 3, 3)],
            lambda x, w: x.conv2d(w, padding=1),
            np_conv2d,
            conv_torch,
            2 * batch * 64 * 64 * 56 * 56 * 9,
            "GFLOPS",
        )
    )
    m = 1024 if quick else 4096
    softmax_torch = (lambda a: torch.softmax(a, -1)) if torch is not None else None
    out.append(
        Workload(f"softmax {m}x{m}", [(m, m)], lambda a: a.softmax(-1), np_softmax, softmax_torch, m * m * 8, "GB/s")
    )
    e = 1 << (22 if quick else 24)
    out.append(Workload(f"elementwise (a+b)*c-a/2 {e >> 20}M", [(e,)] * 3, chain, chain, chain, 4 * e * 4, "GB/s"))
    s = 1 << (24 if quick else 26)
    out.append(
        Workload(
            f"sum of {s >> 20}M floats", [(s,)], lambda a: a.sum(), lambda a: a.sum(), lambda a: a.sum(), s * 4, "GB/s"
        )
    )
    return out


def tiny_jit_us() -> float:
    """Per-call cost of replaying a TinyJit'd elementwise op on 16 floats (capture excluded; best of 8 runs of 500
    calls, as bench_jit.py measures it)."""
    a, b = Tensor(np.ones(16, np.float32)).realize(), Tensor(np.ones(16, np.float32)).realize()
    tiny = TinyJit(lambda x, y: (x * y + 1).realize())
    return per_call_us(lambda: tiny(a, b), 500, runs=8, warmup=20)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer repetitions")
    parser.add_argument("--only", default="", help="run only the workloads whose name contains this text")
    parser.add_argument("--beam", type=int, default=0, help="also time xgrad under BEAM=N (a column per setting)")
    parser.add_argument(
        "--settle", type=float, default=0.25, help="seconds of idle before each timed call (other libraries' spinning)"
    )
    parser.add_argument(
        "--reps",
        type=int,
        default=0,
        help="timed calls per library (best of; default 7, 3 with --quick): more reps "
        "make the minimum steadier on a machine whose speed drifts",
    )
    parser.add_argument("--avx2", action="store_true", help="xgrad, torch and numpy all limited to AVX2 (see above)")
    args = parser.parse_args()
    if args.avx2 and any(os.environ.get(k) != v for k, v in AVX2_ENV.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **AVX2_ENV})  # numpy is loaded already
    reps = args.reps or (3 if args.quick else 7)
    cores = len(os.sched_getaffinity(0))
    probes = Probes(cores)
    peak = measure_peak(probes)
    print(
        f"peak: FMA ({probes.lanes}-lane vectors) {peak.fma_core:.1f} GFLOPS on 1 core, {peak.fma_all:.1f} on {cores}; "
        f"copy {peak.copy_core:.1f} GB/s on 1 core, {peak.copy_all:.1f} GB/s on {cores}"
    )
    torch: Any = None
    try:
        import torch

        torch.set_num_threads(cores)
    except ImportError:
        pass
    # the xgrad columns: heuristics, and each BEAM setting asked for (the knobs go to `xgrad_call`)
    columns: list[tuple[str, dict[str, Any]]] = [("xgrad", {})]
    if args.beam:
        columns.append((f"BEAM={args.beam}", {"BEAM": args.beam}))
    rng = np.random.default_rng(0)
    head = f"{'workload':30s} {'numpy ms':>9s} {'torch ms':>9s}"
    head += "".join(f" {c + ' ms':>11s} {'/numpy':>7s} {'/torch':>7s} {'pair/np':>7s}" for c, _ in columns)
    head += f" {'best rate':>16s} {'of peak':>7s}"
    print(head)
    for w in workloads(args.quick, torch):
        if args.only and args.only not in w.name:
            continue
        arrays = [rng.standard_normal(s).astype(np.float32) for s in w.shapes]
        tensors = [Tensor(a).realize() for a in arrays]
        fns = [xgrad_call(w, tensors, **knobs) for _, knobs in columns]
        if w.numpy is not None:
            fns.append(functools.partial(w.numpy, *arrays))
        if w.torch is not None and torch is not None:
            fns.append(functools.partial(w.torch, *[torch.from_numpy(a) for a in arrays]))
        fns.append(probes.fma_all if w.unit == "GFLOPS" else probes.copy_all)  # the peak in the same rounds
        measured = interleaved(fns, reps, args.settle)
        peak_now = (probes.fma_flops if w.unit == "GFLOPS" else probes.copy_bytes) / min(measured.pop()) / 1e9
        ours = measured[: len(columns)]
        rest = iter(measured[len(columns) :])
        np_times = next(rest) if w.numpy is not None else None
        tn = min(np_times) if np_times is not None else float("nan")
        tt = min(next(rest)) if w.torch is not None and torch is not None else float("nan")
        times = [min(ts) for ts in ours]
        pairs = [paired_ratio(ts, np_times) if np_times is not None else float("nan") for ts in ours]
        rate = w.work / min(times) / 1e9
        of_peak = rate / peak_now
        line = f"{w.name:30s} {tn * 1e3:9.2f} {tt * 1e3:9.2f}"
        line += "".join(f" {t * 1e3:11.2f} {t / tn:7.2f} {t / tt:7.2f} {p:7.2f}" for t, p in zip(times, pairs))
        line += f" {rate:9.1f} {w.unit:6s} {of_peak:7.0%}"
        print(line, flush=True)
        del tensors
    if not args.only or "jit" in args.only:
        print(f"tiny jitted op replay: {tiny_jit_us():.1f} us/call")


if __name__ == "__main__":
    main()
