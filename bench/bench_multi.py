"""Multi-device on logical CPU devices: allreduce strategies and a data-parallel training step, measured in one run.

Run: .venv/bin/python bench/bench_multi.py [--reps N]
1. Allreduce of a (4, N) tensor split on axis 0 over CPU..CPU:3, summed over axis 0 (N = 2**20): naive vs ring
   (RING=0 / RING=2), best of N, with numpy's `a.sum(0)` on one core as the reference, and the bytes each strategy
   copies (counted from the schedule).
2. A TinyJit'd data-parallel training step (MLP 256-512-10, batch 512, SGD) on 1, 2 and 4 devices, best of N, with
   torch CPU doing the same step. The CPU devices share one host and one thread pool, so more devices means more,
   smaller kernels plus copies: this measures the overhead of the multi-device machinery, not a speedup.
Asserts nothing.
"""

from __future__ import annotations

import argparse

import numpy as np
from bench_cpu import best

from xgrad import Context, Tensor, TinyJit, nn
from xgrad.engine.multi import schedule_multi
from xgrad.engine.schedule import create_schedule
from xgrad.nn.optim import SGD
from xgrad.nn.state import get_parameters

D4 = ("CPU", "CPU:1", "CPU:2", "CPU:3")


def bench_allreduce(reps: int) -> None:
    n = 1 << 20
    a = np.random.default_rng(0).standard_normal((4, n)).astype(np.float32)
    t = Tensor(a).shard(D4, axis=0).realize()
    t_np = best(lambda: a.sum(0), reps, warmup=False)
    print(f"allreduce sum over 4 devices of (4, {n}) float32; numpy a.sum(0): {t_np * 1e3:.2f} ms")
    for name, ring in (("naive", 0), ("ring", 2)):
        with Context(RING=ring):
            items, _, _ = schedule_multi([t.sum(0).uop], create_schedule)
            copied = sum(it.bufs[0].nbytes for it in items if it.is_copy)
            t.sum(0).realize()  # compile
            secs = best(lambda: t.sum(0).realize(), reps, warmup=False)
        print(f"  {name:5s}: {secs * 1e3:8.2f} ms  ({secs / t_np:5.1f}x numpy)  copies {copied / 1e6:.1f} MB")


class MLP:
    def __init__(self) -> None:
        self.l1 = nn.Linear(256, 512)
        self.l2 = nn.Linear(512, 10)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l2(self.l1(x).relu())


def xgrad_step_time(devices: tuple[str, ...] | None, x: np.ndarray, y: np.ndarray, reps: int) -> float:
    model = MLP()
    if devices is not None:
        for p in get_parameters(model):
            p.to_(devices).realize()
    opt = SGD(get_parameters(model), lr=0.01)

    @TinyJit
    def step(xb: Tensor, yb: Tensor) -> Tensor:
        opt.zero_grad()
        loss = model(xb).sparse_categorical_crossentropy(yb)
        loss.backward()
        opt.step()
        return loss.realize()

    def batch() -> tuple[Tensor, Tensor]:
        xb, yb = Tensor(x), Tensor(y)
        if devices is not None:
            xb, yb = xb.shard(devices, 0), yb.shard(devices, 0)
        return xb.realize(), yb.realize()

    with Context(TRAINING=1):
        for _ in range(3):  # run, capture, first replay
            step(*batch())
        inputs = [batch() for _ in range(reps)]
        return best(lambda: step(*inputs.pop()).numpy(), reps, warmup=False)


def torch_step_time(x: np.ndarray, y: np.ndarray, reps: int) -> float:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y).long()

    def step() -> None:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(tx), ty)
        loss.backward()
        opt.step()
        loss.item()

    step()
    return best(step, reps, warmup=False)


def bench_training(reps: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 256)).astype(np.float32)
    y = rng.integers(0, 10, 512).astype(np.int32)
    t_torch = torch_step_time(x, y, reps)
    print(f"data-parallel MLP step (batch 512, 256-512-10, SGD, TinyJit); torch CPU: {t_torch * 1e3:.2f} ms")
    one = xgrad_step_time(None, x, y, reps)
    print(f"  1 device : {one * 1e3:8.2f} ms  ({one / t_torch:5.2f}x torch)")
    for devices in (D4[:2], D4):
        secs = xgrad_step_time(devices, x, y, reps)
        ratios = f"{secs / t_torch:5.2f}x torch, {secs / one:5.2f}x 1 device"
        print(f"  {len(devices)} devices: {secs * 1e3:8.2f} ms  ({ratios})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    bench_allreduce(args.reps)
    bench_training(args.reps)


if __name__ == "__main__":
    main()
