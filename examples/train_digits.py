"""Train a small CNN on scikit-learn's handwritten digits (1797 8x8 images, shipped with the package: no download).

    python examples/train_digits.py [--steps 300] [--device CPU] [--out weights.safetensors]

The model is two 3x3 convolutions and a linear layer, trained with Adam from `xgrad.nn.optim`. The training step
(forward, backward, optimizer update) is wrapped in `TinyJit`: the first call runs it, the second captures its
kernels and every later call replays them on the next batch without building or scheduling a graph. Batches have a
fixed size, so every call sees inputs of the same shape. The learning rate decays linearly to 0: it is assigned into
the optimizer's `lr` buffer between steps, which the captured kernels read. The last 20% of a seeded shuffle is held
out for testing; the images are standardised with the training set's mean and standard deviation.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import TextIO

import numpy as np

from xgrad import Context, Device, Tensor, TinyJit, nn
from xgrad.nn.optim import Adam
from xgrad.nn.state import get_parameters, get_state_dict, safe_save


class DigitsNet:
    """(N, 1, 8, 8) images -> (N, 10) logits."""

    def __init__(self) -> None:
        self.conv1 = nn.Conv2d(1, 8, 3)  # -> 8 x 6 x 6
        self.conv2 = nn.Conv2d(8, 16, 3)  # -> 16 x 4 x 4
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def __call__(self, x: Tensor) -> Tensor:
        x = self.conv1(x).relu()
        x = self.conv2(x).relu()
        return self.fc(x.flatten(1))


def load_split(seed: int = 0, holdout: float = 0.2) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(X_train, Y_train, X_test, Y_test): images (N, 1, 8, 8) float32 standardised with the training set's mean and
    standard deviation, labels int32; the test set is the last `holdout` of a shuffle seeded with `seed`."""
    from sklearn.datasets import load_digits  # type: ignore[import-untyped]

    digits = load_digits()
    x = digits.images.astype(np.float32).reshape(-1, 1, 8, 8)
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(round(len(x) * holdout))
    train, test = order[:-n_test], order[-n_test:]
    mean, std = x[train].mean(), x[train].std()  # statistics of the training set only
    x = (x - mean) / std
    return x[train], y[train], x[test], y[test]


class Progress:
    """A one-line progress bar: steps done, loss, samples per second (redrawn in place on a terminal)."""

    def __init__(self, total: int, out: TextIO, width: int = 24) -> None:
        self.total, self.out, self.width = total, out, width
        self.start = time.perf_counter()
        self.last_draw = 0.0
        self.tty = out.isatty()

    def update(self, step: int, loss: float, samples: int) -> None:
        now = time.perf_counter()
        done = step == self.total
        if not done and now - self.last_draw < (0.1 if self.tty else 2.0):
            return
        self.last_draw = now
        filled = self.width * step // self.total
        bar = "#" * filled + "." * (self.width - filled)
        rate = samples / max(now - self.start, 1e-9)
        line = f"[{bar}] {step}/{self.total} loss {loss:.4f} {rate:,.0f} samples/s (compiling included)"
        self.out.write(("\r" + line + ("\n" if done else "")) if self.tty else line + "\n")
        self.out.flush()


@dataclass
class Result:
    test_accuracy: float
    final_loss: float
    step_time_s: float  # mean wall time of a replayed (jitted) step
    first_steps_s: float  # the first two calls: eager run and capture, compiling every kernel
    total_s: float


def train(
    steps: int = 300,
    batch_size: int = 64,
    lr: float = 2e-2,
    seed: int = 0,
    device: str | None = None,
    out: str | None = None,
    log: TextIO = sys.stderr,
) -> Result:
    """Train DigitsNet for `steps` steps and return its test accuracy and timings; save the weights to `out`."""
    start = time.perf_counter()
    with Context(DEV=device or Device.DEFAULT):
        x_train, y_train, x_test, y_test = load_split(seed)
        Tensor.manual_seed(seed)
        model = DigitsNet()
        opt = Adam(get_parameters(model), lr=lr)

        @TinyJit
        def train_step(x: Tensor, y: Tensor) -> Tensor:
            with Context(TRAINING=1):
                opt.zero_grad()
                loss = model(x).sparse_categorical_crossentropy(y).backward()
                Tensor.realize(loss, *opt.schedule_step())  # the loss with the update: it reads the old weights
            return loss

        rng = np.random.default_rng(seed + 1)
        progress = Progress(steps, log)
        loss_value, first_steps_s = float("nan"), 0.0
        loop_start = replay_start = time.perf_counter()
        for step in range(steps):
            opt.lr.assign(Tensor([lr * (1 - step / steps)], device=opt.lr.device, dtype=opt.lr.dtype)).realize()
            idx = rng.integers(0, len(x_train), batch_size)
            loss = train_step(Tensor(x_train[idx]).realize(), Tensor(y_train[idx]).realize())
            loss_value = float(loss.item())
            if step == min(1, steps - 1):
                first_steps_s = time.perf_counter() - loop_start
                replay_start = time.perf_counter()
            progress.update(step + 1, loss_value, (step + 1) * batch_size)
        replayed = max(steps - 2, 0)
        step_time = (time.perf_counter() - replay_start) / replayed if replayed else float("nan")

        predictions = model(Tensor(x_test)).argmax(-1).numpy()
        accuracy = float((predictions == y_test).mean())
        if out is not None:
            safe_save(get_state_dict(model), out)
    return Result(accuracy, loss_value, step_time, first_steps_s, time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps of --batch-size samples (300)")
    parser.add_argument("--batch-size", type=int, default=64, help="samples per step (64)")
    parser.add_argument("--lr", type=float, default=2e-2, help="peak Adam learning rate, decayed linearly to 0 (2e-2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split, the init and the batches (0)")
    parser.add_argument("--device", default=None, help="xgrad device, e.g. CPU, PYTHON, WEBGPU (default: DEV)")
    parser.add_argument("--out", default=None, help="save the trained weights here (.safetensors)")
    args = parser.parse_args(argv)
    result = train(args.steps, args.batch_size, args.lr, args.seed, args.device, args.out)
    print(f"device: {args.device or Device.DEFAULT}")
    print(f"test accuracy: {result.test_accuracy * 100:.2f}% (final training loss {result.final_loss:.4f})")
    print(
        f"time per step: {result.step_time_s * 1e3:.2f} ms replayed by TinyJit "
        f"(first two steps, compiling: {result.first_steps_s:.2f} s; total {result.total_s:.2f} s)"
    )
    if args.out:
        print(f"weights saved to {args.out}")


if __name__ == "__main__":
    main()
