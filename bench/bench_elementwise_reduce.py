"""First speed check: a fused elementwise expression and a reduction, xgrad (CPU) against numpy in the same run.

Run: .venv/bin/python bench/bench_elementwise_reduce.py  (prints times and xgrad/numpy ratios; asserts nothing)
"""

from __future__ import annotations

import numpy as np
from bench_cpu import best

from xgrad.tensor import Tensor


def np_softmax(x: np.ndarray, row: int) -> np.ndarray:
    """numpy's softmax over rows of `row` elements of `x` (its first len(x) // row * row elements)."""
    m = x[: len(x) // row * row].reshape(-1, row)
    e = np.exp(m - m.max(-1, keepdims=True))
    out: np.ndarray = e / e.sum(-1, keepdims=True)
    return out


def main() -> None:
    n = 1 << 22
    rng = np.random.default_rng(0)
    a_np, b_np, c_np = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    a, b, c = Tensor(a_np).realize(), Tensor(b_np).realize(), Tensor(c_np).realize()
    rows = [
        (
            "elementwise (a+b)*c - a/2, 4M floats",
            lambda: ((a + b) * c - a / 2).realize(),
            lambda: (a_np + b_np) * c_np - a_np / 2,
            4 * n * 4,
        ),
        ("sum of 4M floats", lambda: a.sum().realize(), lambda: a_np.sum(), n * 4),
        (
            "row sums 2048x2048",
            lambda: a.reshape(2048, 2048).sum(1).realize(),
            lambda: a_np.reshape(2048, 2048).sum(1),
            n * 4,
        ),
        # exp2 on vector lanes (rows of 2048) and on scalar lanes (rows of 7: too short for a vector)
        (
            "softmax 2048x2048",
            lambda: a.reshape(2048, 2048).softmax(-1).realize(),
            lambda: np_softmax(a_np, 2048),
            n * 8,
        ),
        (
            "softmax rows of 7",
            lambda: a[: n // 7 * 7].reshape(-1, 7).softmax(-1).realize(),
            lambda: np_softmax(a_np, 7),
            n * 8,
        ),
    ]
    print(f"{'workload':42s} {'xgrad ms':>10s} {'numpy ms':>10s} {'xgrad/numpy':>12s} {'xgrad GB/s':>11s}")
    for name, xg, npf, nbytes in rows:
        tx, tn = best(xg, 10), best(npf, 10)
        print(f"{name:42s} {tx * 1e3:10.3f} {tn * 1e3:10.3f} {tx / tn:12.2f} {nbytes / tx / 1e9:11.2f}")


if __name__ == "__main__":
    main()
