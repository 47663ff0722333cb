"""BEAM search against the heuristic, numpy and torch, measured in one process on the same data.

Run: .venv/bin/python bench/bench_beam.py [--quick] [--beam N]
For matmul 1024 and 2048 (float32) and conv2d (batch 32, 64->64 channels, 56x56, 3x3, padding 1) it prints best-of-N
times, taken in turn, for xgrad with heuristic opts (BEAM=0), xgrad with BEAM=N (default 2), numpy and torch CPU; the
ratios BEAM/numpy and BEAM/torch (below 1 means xgrad is faster), GFLOPS of both xgrad columns, and how long the first
BEAM call took (the search; results are cached on disk, so a second run shows about the compile time only;
IGNORE_BEAM_CACHE=1 searches again). `--quick`: matmul 1024 and a batch-8 conv2d. The workloads, the timing helpers
and the machine peak come from bench_cpu.py (one definition of each). Asserts nothing.
"""

from __future__ import annotations

import argparse
import functools
import os
import time
from typing import Any

import numpy as np
from bench_cpu import Probes, Workload, interleaved, measure_peak, workloads, xgrad_call

from xgrad import Tensor
from xgrad.helpers import Context

WANTED = ("matmul 1024", "matmul 2048", "conv2d")


def row(w: Workload, arrays: list[np.ndarray], beam: int, reps: int, torch: Any) -> str:
    """One workload: the first BEAM call alone (the search), then heuristic, BEAM, numpy and torch timed in turn
    (best of `reps` each, interleaved so that load from other processes hits all alike)."""
    tensors = [Tensor(a).realize() for a in arrays]
    with Context(BEAM=beam):
        start = time.perf_counter()
        got = w.xgrad(*tensors).numpy()  # the first call searches (or reads the BEAM cache)
        search_s = time.perf_counter() - start
    fns = [xgrad_call(w, tensors, BEAM=0), xgrad_call(w, tensors, BEAM=beam)]
    nan = float("nan")
    err = nan
    if w.numpy is not None:
        want = np.asarray(w.numpy(*arrays))
        err = float(np.abs(got - want).max() / (np.abs(want).max() + 1e-9))
        fns.append(functools.partial(w.numpy, *arrays))
    if w.torch is not None and torch is not None:
        fns.append(functools.partial(w.torch, *[torch.from_numpy(a) for a in arrays]))
    times = [min(ts) for ts in interleaved(fns, reps, 0.25)]
    t_heur, t_beam = times[0], times[1]
    t_np = times[2] if w.numpy is not None else nan
    t_torch = times[-1] if w.torch is not None and torch is not None else nan
    return (
        f"{w.name:28s} {t_heur * 1e3:9.2f} {t_beam * 1e3:9.2f} {t_np * 1e3:9.2f} {t_torch * 1e3:9.2f}"
        f" {t_beam / t_np:8.2f} {t_beam / t_torch:8.2f} {w.work / t_heur / 1e9:8.1f} {w.work / t_beam / 1e9:8.1f}"
        f" {search_s:9.1f}" + (f"  (max rel err {err:.1e})" if err > 1e-4 else "")
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="matmul 1024 and a batch-8 conv2d, fewer repetitions")
    parser.add_argument("--beam", type=int, default=2, help="beam width (default 2)")
    args = parser.parse_args()
    reps = 3 if args.quick else 5
    cores = len(os.sched_getaffinity(0))
    peak = measure_peak(Probes(cores))
    print(f"peak: FMA {peak.fma_core:.1f} GFLOPS on 1 core, {peak.fma_all:.1f} on {cores}")
    torch: Any = None
    try:
        import torch

        torch.set_num_threads(cores)
    except ImportError:
        pass
    head = f"{'workload':28s} {'heur ms':>9s} {'BEAM ms':>9s} {'numpy ms':>9s} {'torch ms':>9s}"
    print(f"{head} {'B/numpy':>8s} {'B/torch':>8s} {'heur GF':>8s} {'BEAM GF':>8s} {'search s':>9s}")
    rng = np.random.default_rng(0)
    for w in workloads(args.quick, torch):
        if not w.name.startswith(WANTED):
            continue
        arrays = [rng.standard_normal(s).astype(np.float32) for s in w.shapes]
        print(row(w, arrays, args.beam, reps, torch), flush=True)


if __name__ == "__main__":
    main()
