"""Rewrites per second of `xgrad.uop.symbolic.simplify` on typical kernel index expressions (no assertions).

Run: PYTHONPATH=packages/core/src python bench/bench_rewrite.py [count]

The expressions are what movement ops leave behind: a view's flat index built from output ranges, unflattened into
another shape with // and %, permuted, sometimes padded (a gate) or strided. "rewrites" are graph_rewrite steps
(`RewriteStats.calls`), the unit every pass in xgrad reports.
"""

from __future__ import annotations

import random
import sys
import time

from xgrad.dtype import dtypes
from xgrad.uop.ops import UOp
from xgrad.uop.pattern import RewriteStats
from xgrad.uop.symbolic import simplify

DIMS = (1, 2, 3, 4, 5, 8, 16, 32)


def strides(shape: list[int]) -> list[int]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return out[::-1]


def flat_index(idxs: list[UOp], shape: list[int]) -> UOp:
    out = UOp.const(dtypes.index, 0)
    for i, st in zip(idxs, strides(shape)):
        out = out + i * st
    return out


def unflatten(flat: UOp, shape: list[int]) -> list[UOp]:
    return [(flat // st) % n for n, st in zip(shape, strides(shape))]


def index_expr(rng: random.Random, axis0: int) -> UOp:
    """One view chain: ranges over an output shape, reshaped/permuted back to a source buffer's flat index."""
    shape = [rng.choice(DIMS) for _ in range(rng.randint(2, 4))]
    ranges = [UOp.range(n, axis0 + i) for i, n in enumerate(shape)]
    idxs: list[UOp] = list(ranges)
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(["reshape", "permute", "pad", "stride"])
        if kind == "permute":
            order = list(range(len(shape)))
            rng.shuffle(order)
            idxs, shape = [idxs[o] for o in order], [shape[o] for o in order]
        elif kind == "reshape":
            total = 1
            for n in shape:
                total *= n
            new_shape = [n for n in shape]
            rng.shuffle(new_shape)
            if rng.random() < 0.5 and len(new_shape) > 1:
                new_shape = [new_shape[0] * new_shape[1], *new_shape[2:]]
            idxs, shape = unflatten(flat_index(idxs, shape), new_shape), new_shape
        elif kind == "stride":
            axis = rng.randrange(len(shape))
            idxs[axis] = idxs[axis] * 2 + rng.randint(0, 1)
            shape[axis] = shape[axis] * 2 + 1
        else:  # pad one axis by (1, 1): a gated index
            axis = rng.randrange(len(shape))
            inner = idxs[axis] - 1
            valid = inner.ge(0).logical_and(inner.lt(shape[axis]))
            idxs[axis] = valid.where(inner, 0)
    return flat_index(idxs, shape)


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    rng = random.Random(0)
    exprs = [index_expr(rng, 4 * i) for i in range(count)]  # distinct ranges: no work is shared between expressions
    before_nodes = sum(len(e.toposort) for e in exprs)
    calls0 = RewriteStats.calls["symbolic"]
    start = time.perf_counter()
    out = [simplify(e) for e in exprs]
    seconds = time.perf_counter() - start
    rewrites = RewriteStats.calls["symbolic"] - calls0
    after_nodes = sum(len(e.toposort) for e in out)
    print(f"{count} expressions in {seconds:.2f} s: {count / seconds:.0f} expressions/s")
    print(f"{rewrites} rewrites: {rewrites / seconds:.0f} rewrites/s")
    print(f"nodes {before_nodes} -> {after_nodes} ({after_nodes / before_nodes:.0%})")


if __name__ == "__main__":
    main()
