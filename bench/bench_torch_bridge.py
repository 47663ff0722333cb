"""The torch bridge's cost: the digits CNN's training step (examples/train_digits.py's DigitsNet, Adam, cross-entropy,
batch 64) as plain torch code on the `xgrad` device (eager, and under `torch.compile(backend="xgrad")`), against
the same torch code on CPU and against native xgrad (its TinyJit'd step), plus the per-op overhead of a tiny op.

Every variant starts from the same weights and sees the same batches; each is timed after warm-up steps (native
xgrad and the compiled bridge: eager run and capture; eager modes: two steps). The time of a step includes reading
the loss (`loss.item()`), which is where the bridge realizes. The tiny op is `a + b` on two 4-element tensors, timed
as the Python cost of issuing it (the bridge and native xgrad build a lazy graph; torch CPU computes it).

Run: .venv/bin/python bench/bench_torch_bridge.py [--steps 30] [--ops 2000]   (asserts nothing; prints ratios)
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 (torch's own spelling)

import xgrad_torch
import xgrad_torch.compile  # noqa: F401 (registers the backend name)
from xgrad import Context, Tensor, TinyJit
from xgrad.nn.optim import Adam
from xgrad.nn.state import get_parameters, get_state_dict

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "train_digits.py"
LR = 2e-3
BATCH = 64


def load_demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_digits", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_digits"] = module
    spec.loader.exec_module(module)
    return module


def torch_model(weights: dict[str, np.ndarray]) -> torch.nn.Module:
    """DigitsNet in torch with `weights` (conv 1->8 3x3, relu, conv 8->16 3x3, relu, flatten, linear 256->10)."""
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 16, 3),
        torch.nn.ReLU(),
        torch.nn.Flatten(1),
        torch.nn.Linear(16 * 4 * 4, 10),
    )
    names = {"0": "conv1", "2": "conv2", "5": "fc"}
    state = {k: torch.from_numpy(weights[f"{names[k.split('.')[0]]}.{k.split('.')[1]}"]) for k in model.state_dict()}
    model.load_state_dict(state)
    return model


def timed(step: Callable[[int], float], steps: int, warmup: int) -> tuple[float, list[float]]:
    """Mean seconds per step after `warmup` steps, and every step's loss."""
    losses = [step(i) for i in range(warmup)]
    start = time.perf_counter()
    losses += [step(i) for i in range(warmup, warmup + steps)]
    return (time.perf_counter() - start) / steps, losses


def bench_native(
    demo: ModuleType, batches: list[tuple[np.ndarray, np.ndarray]], steps: int
) -> tuple[float, list[float]]:
    Tensor.manual_seed(0)
    model = demo.DigitsNet()
    opt = Adam(get_parameters(model), lr=LR)

    @TinyJit
    def train_step(x: Tensor, y: Tensor) -> Tensor:
        with Context(TRAINING=1):
            opt.zero_grad()
            loss: Tensor = model(x).sparse_categorical_crossentropy(y).backward()
            Tensor.realize(loss, *opt.schedule_step())
        return loss

    def step(i: int) -> float:
        x, y = batches[i]
        return float(train_step(Tensor(x).realize(), Tensor(y.astype(np.int32)).realize()).item())

    return timed(step, steps, 2)


def bench_torch(model: torch.nn.Module, device: str, batches: list[tuple[np.ndarray, np.ndarray]], steps: int,
                compiled: bool = False) -> tuple[float, list[float]]:  # fmt: skip
    model = model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    data = [(torch.from_numpy(x).to(device), torch.from_numpy(y).long().to(device)) for x, y in batches]

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(x), y)

    def update() -> None:
        opt.step()

    if compiled:  # the forward with its loss (and so its backward), and the optimizer step
        loss_of = torch.compile(loss_of, backend="xgrad", dynamic=False)
        update = torch.compile(update, backend="xgrad", dynamic=False)

    def step(i: int) -> float:
        x, y = data[i]
        opt.zero_grad()
        loss = loss_of(x, y)
        loss.backward()  # type: ignore[no-untyped-call]
        update()
        return float(loss.item())

    return timed(step, steps, 3 if compiled else 2)


def tiny_op_us(make: Callable[[], tuple[Any, Any]], ops: int) -> float:
    a, b = make()
    for _ in range(50):
        a + b
    start = time.perf_counter()
    for _ in range(ops):
        a + b
    return (time.perf_counter() - start) / ops * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="timed training steps per variant (30)")
    parser.add_argument("--ops", type=int, default=2000, help="tiny ops timed per variant (2000)")
    args = parser.parse_args(argv)
    demo = load_demo()
    x_train, y_train, _, _ = demo.load_split(0)
    rng = np.random.default_rng(1)
    batches = [
        (x_train[idx], y_train[idx]) for idx in (rng.integers(0, len(x_train), BATCH) for _ in range(args.steps + 3))
    ]
    Tensor.manual_seed(0)
    weights = {k: v.numpy() for k, v in get_state_dict(demo.DigitsNet()).items()}

    native_s, native_l = bench_native(demo, batches, args.steps)
    cpu_s, cpu_l = bench_torch(torch_model(weights), "cpu", batches, args.steps)
    eager_s, eager_l = bench_torch(torch_model(weights), "xgrad", batches, args.steps)
    comp_s, comp_l = bench_torch(torch_model(weights), "xgrad", batches, args.steps, compiled=True)

    print(f"digits CNN training step, batch {BATCH}, {args.steps} timed steps (torch {torch.__version__})")
    print(f"  native xgrad (TinyJit)             {native_s * 1e3:8.2f} ms")
    print(f"  torch CPU                          {cpu_s * 1e3:8.2f} ms")
    print(f"  torch on xgrad, eager              {eager_s * 1e3:8.2f} ms   {eager_s / native_s:5.2f}x native xgrad")
    print(f"  torch on xgrad, torch.compile      {comp_s * 1e3:8.2f} ms   {comp_s / native_s:5.2f}x native xgrad")
    print(f"  ratios: eager/cpu {eager_s / cpu_s:.2f}x, compiled/cpu {comp_s / cpu_s:.2f}x, native/cpu "
          f"{native_s / cpu_s:.2f}x")  # fmt: skip
    print(f"  first losses: cpu {cpu_l[0]:.5f} xgrad eager {eager_l[0]:.5f} compiled {comp_l[0]:.5f} "
          f"native {native_l[0]:.5f}")  # fmt: skip

    bridge_us = tiny_op_us(lambda: (torch.ones(4).to("xgrad"), torch.ones(4).to("xgrad")), args.ops)
    native_us = tiny_op_us(
        lambda: (Tensor.ones(4).contiguous().realize(), Tensor.ones(4).contiguous().realize()), args.ops
    )
    cpu_us = tiny_op_us(lambda: (torch.ones(4), torch.ones(4)), args.ops)
    xgrad_torch.storage.flush()
    overhead = f"{bridge_us - native_us:.1f} us ({bridge_us / native_us:.2f}x)"
    print(f"tiny op a + b (4 elements): torch on xgrad {bridge_us:.1f} us, native xgrad {native_us:.1f} us, "
          f"torch CPU {cpu_us:.1f} us; bridge overhead {overhead}")  # fmt: skip


if __name__ == "__main__":
    main()
