"""Time per training step of the digits demo's CNN (examples/train_digits.py: DigitsNet, Adam, sparse categorical
cross-entropy) replayed by TinyJit, against the same model trained by torch on the CPU in the same process.

Both start from the same weights (xgrad's init copied into torch) and see the same sequence of batches; both run
Adam with the same hyper-parameters. The xgrad step is timed after its two warm-up calls (eager run, capture), the
torch step after two warm-up steps too. The losses of both runs at the first two steps and the last are printed
side by side as a sanity check.

Run: .venv/bin/python bench/bench_train.py [--steps 200] [--batch-size 64] [--threads N]   (asserts nothing)
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys
import time
from types import ModuleType

import numpy as np

from xgrad import Context, Tensor, TinyJit
from xgrad.helpers import NUM_CPU_THREADS
from xgrad.nn.optim import Adam
from xgrad.nn.state import get_parameters, get_state_dict

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "train_digits.py"
LR = 2e-3
WARMUP = 2
Batches = list[tuple[np.ndarray, np.ndarray]]


def load_demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_digits", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_digits"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def torch_model(weights: dict[str, np.ndarray]):  # type: ignore[no-untyped-def]
    """DigitsNet in torch: conv(1->8, 3) relu, conv(8->16, 3) relu, flatten, linear(256->10), with `weights`."""
    import torch

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


def time_xgrad(demo: ModuleType, batches: Batches) -> tuple[float, list[float], dict]:
    Tensor.manual_seed(0)
    model = demo.DigitsNet()
    weights = {k: v.numpy().copy() for k, v in get_state_dict(model).items()}
    opt = Adam(get_parameters(model), lr=LR)

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        with Context(TRAINING=1):
            opt.zero_grad()
            loss = model(x).sparse_categorical_crossentropy(y).backward()
            Tensor.realize(loss, *opt.schedule_step())
        return loss

    inputs = [(Tensor(x).realize(), Tensor(y).realize()) for x, y in batches]
    losses = [step(*inputs[i]).item() for i in range(WARMUP)]
    start = time.perf_counter()
    for x, y in inputs[WARMUP:]:
        out = step(x, y)
    losses.append(out.item())  # inside the timing: waits for the last step's kernels
    elapsed = time.perf_counter() - start
    return elapsed / (len(batches) - WARMUP), losses, weights


def time_torch(
    weights: dict[str, np.ndarray], batches: list[tuple[np.ndarray, np.ndarray]]
) -> tuple[float, list[float]]:
    import torch

    model = torch_model(weights)
    opt = torch.optim.Adam(model.parameters(), lr=LR, eps=1e-8)
    inputs = [(torch.from_numpy(x), torch.from_numpy(y).long()) for x, y in batches]

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    losses = [float(step(*inputs[i])) for i in range(WARMUP)]
    start = time.perf_counter()
    for x, y in inputs[WARMUP:]:
        out = step(x, y)
    losses.append(float(out))
    elapsed = time.perf_counter() - start
    return elapsed / (len(batches) - WARMUP), losses


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="timed steps (200)")
    parser.add_argument("--batch-size", type=int, default=64, help="samples per step (64)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    demo = load_demo()
    x_train, y_train, _, _ = demo.load_split(0)
    rng = np.random.default_rng(1)
    batches = []
    for _ in range(args.steps + WARMUP):
        idx = rng.integers(0, len(x_train), args.batch_size)
        batches.append((np.ascontiguousarray(x_train[idx]), np.ascontiguousarray(y_train[idx])))

    xgrad_s, xgrad_losses, weights = time_xgrad(demo, batches)
    torch_s, torch_losses = time_torch(weights, batches)
    print(f"DigitsNet training step, batch {args.batch_size}, {args.steps} timed steps, CPU")
    threads = NUM_CPU_THREADS.value or "all cores"
    print(f"  xgrad (TinyJit replay, NUM_CPU_THREADS={threads}): {xgrad_s * 1e3:8.3f} ms/step")
    print(f"  torch {torch.__version__} ({torch.get_num_threads()} threads): {torch_s * 1e3:8.3f} ms/step")
    print(f"  xgrad/torch time ratio: {xgrad_s / torch_s:.2f}x")
    print("  loss at steps 1, 2 and the last: xgrad", " ".join(f"{v:.4f}" for v in xgrad_losses))
    print("                                   torch", " ".join(f"{v:.4f}" for v in torch_losses))


if __name__ == "__main__":
    main()
