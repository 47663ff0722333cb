"""Per-call cost of a tiny TinyJit'd op (replay only) against numpy and torch doing the same tiny op.

Run: .venv/bin/python bench/bench_jit.py   (prints microseconds per call, best of 8 runs; asserts nothing)
"""

from __future__ import annotations

import numpy as np
from bench_overhead import per_call_us

from xgrad import Tensor, TinyJit


def main() -> None:
    a, b = Tensor(np.ones(16, np.float32)).realize(), Tensor(np.ones(16, np.float32)).realize()
    tiny = TinyJit(lambda x, y: (x * y + 1).realize())
    xgrad_us = per_call_us(lambda: tiny(a, b), 500, runs=8, warmup=20)
    an, bn = np.ones(16, np.float32), np.ones(16, np.float32)
    numpy_us = per_call_us(lambda: an * bn + 1, 500, runs=8, warmup=20)
    print(f"tiny jitted op (16 floats, a*b+1): xgrad replay {xgrad_us:.1f} us/call, numpy {numpy_us:.2f} us/call")
    try:
        import torch

        at, bt = torch.ones(16), torch.ones(16)
        torch_us = per_call_us(lambda: at * bt + 1, 500, runs=8, warmup=20)
        print(f"torch {torch_us:.2f} us/call; xgrad/torch = {xgrad_us / torch_us:.1f}")
    except ImportError:
        print("torch not installed")


if __name__ == "__main__":
    main()
