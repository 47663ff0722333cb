"""xgrad's demo: lazy tensors become fused kernels, generated as C, compiled by a real compiler and run.

Run it with `scripts/dev demo` (or `python examples/demo.py`). Set DEBUG=4 to see the generated source.
"""

from __future__ import annotations

import time

import numpy as np

from xgrad import Device
from xgrad.engine.realize import GlobalCounters
from xgrad.helpers import Context
from xgrad.tensor import Tensor


def main() -> None:
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((256, 512)).astype(np.float32)
    w_np = rng.standard_normal((512, 128)).astype(np.float32) / 16
    print(f"device: {Device.DEFAULT}")
    x, w = Tensor(x_np), Tensor(w_np)
    # a small network layer: matmul, bias-free gelu-ish activation, row softmax
    logits = (x @ w) * (x @ w).sigmoid()
    probs = logits.softmax(-1)
    GlobalCounters.reset()
    print("kernels run (DEBUG=2 format):")
    start = time.perf_counter()
    with Context(DEBUG=2):
        out = probs.numpy()
    elapsed = time.perf_counter() - start
    ref = x_np @ w_np
    ref = ref / (1 + np.exp(-ref))
    ref = np.exp(ref - ref.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    err = float(np.abs(out - ref).max())
    print(
        f"{GlobalCounters.kernel_count} kernels, {GlobalCounters.global_ops / 1e6:.1f} MFLOP, "
        f"{elapsed * 1e3:.1f} ms including compiles; max abs error vs numpy {err:.2e}"
    )
    assert err < 1e-4, "result does not match numpy"


if __name__ == "__main__":
    main()
