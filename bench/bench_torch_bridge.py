"""The torch bridge's cost: the digits CNN's training step (examples/train_digits.py's DigitsNet, Adam, cross-entropy,
batch 64) as plain torch code on the `xgrad` device (eager, and under `torch.compile(backend="xgrad")`), against
the same torch code on CPU and against native xgrad (its TinyJit'd step), plus the per-op overhead of a tiny op.
The compiled step is also run with a backend whose graphs do no work (they return their first call's outputs):
torch's own per-step cost under torch.compile (dynamo's guards, aot_autograd's wrappers, the autograd engine, the
optimizer's step wrapper), which no backend can remove.

Every variant starts from the same weights and sees the same batches; each is timed after warm-up steps (native
xgrad and the compiled bridge: eager run and capture; eager modes: two steps). The time of a step includes reading
the loss (`loss.item()`), which is where the bridge realizes. Native xgrad is timed twice: with TinyJit (the issue's
reference) and without it (graph building and cached scheduling every step: what an eager step cannot avoid). Each
variant's steps are timed in `--rounds` rounds; the best round is reported (the host is shared: other rounds only
add other processes' load) with the worst beside it, and the share of that best round spent in Python's cyclic
garbage collector. The tiny op is `a + b` on two 4-element tensors, timed as the Python cost of issuing it (the
bridge and native xgrad build a lazy graph; torch CPU computes it), best of `--rounds` rounds.

On a loaded host, wall-clock times mostly measure waiting: `--clock cpu` times the process's CPU time instead
(time.process_time, every thread), with torch on one thread; run it with NUM_CPU_THREADS=1 so xgrad's kernels run
on the calling thread too and the three numbers count work, not the worker pool's wake-ups.

`--counts` counts instead of timing (deterministic, for a loaded host): per steady-state step of native xgrad
without TinyJit and of the bridge's eager step (ratios to the first), and of native xgrad's TinyJit'd step, the
compiled bridge and its no-op graphs (ratios to native TinyJit), the Python function calls (cProfile), the Python
bytecodes executed (sys.settrace opcode events; torch's C++ is not counted) and the kernels run (a TinyJit replay
counts none).

Run: .venv/bin/python bench/bench_torch_bridge.py [--steps 30] [--ops 2000] [--rounds 3] [--clock wall|cpu] [--counts]
(asserts nothing)
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import importlib.util
import math
import os
import pathlib
import pstats
import sys
import time
from collections.abc import Callable
from types import FrameType, ModuleType
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 (torch's own spelling)
from torch._dynamo.backends.common import aot_autograd

import xgrad_torch
import xgrad_torch.compile  # noqa: F401 (registers the backend name)
from xgrad import Context, GlobalCounters, Tensor, TinyJit
from xgrad.nn.optim import Adam
from xgrad.nn.state import get_parameters, get_state_dict

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "train_digits.py"
LR = 2e-3
BATCH = 64
clock: Callable[[], float] = time.perf_counter  # --clock cpu: time.process_time


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


class GCClock:
    """Seconds spent in Python's cyclic garbage collector while installed (gc.callbacks)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = clock()
        else:
            self.seconds += clock() - self._start


class Timing:
    """Mean seconds per step of each round, and the GC seconds per step of each."""

    def __init__(self) -> None:
        self.rounds: list[float] = []
        self.gc: list[float] = []

    @property
    def best(self) -> float:
        return min(self.rounds)

    @property
    def worst(self) -> float:
        return max(self.rounds)

    @property
    def gc_share(self) -> float:
        return self.gc[self.rounds.index(self.best)] / self.best


def timed(step: Callable[[int], float], steps: int, warmup: int, rounds: int) -> tuple[Timing, list[float]]:
    """Per-round mean seconds per step after `warmup` steps (`rounds` rounds of `steps`), and every step's loss."""
    losses = [step(i) for i in range(warmup)]
    timing = Timing()
    for r in range(rounds):
        collector = GCClock()
        gc.callbacks.append(collector)
        start = clock()
        losses += [step(warmup + (r * steps + i) % steps) for i in range(steps)]
        timing.rounds.append((clock() - start) / steps)
        gc.callbacks.remove(collector)
        timing.gc.append(collector.seconds / steps)
    return timing, losses


class Counts(Timing):
    """Python calls, bytecodes and kernels per step (`counted`)."""

    def __init__(self, calls: float, bytecodes: float, kernels: float) -> None:
        super().__init__()
        self.calls, self.bytecodes, self.kernels = calls, bytecodes, kernels


def counted(step: Callable[[int], float], steps: int, warmup: int, rounds: int) -> tuple[Timing, list[float]]:
    """`timed`'s stand-in under --counts: per step after `warmup` + `steps` steps (native xgrad's step takes a few
    to settle), the Python function calls (cProfile, over `steps` steps), the bytecodes executed (over 3 steps) and
    the kernels run."""
    losses = [step(i) for i in range(warmup)] + [step(warmup + i % steps) for i in range(steps)]
    profile = cProfile.Profile()
    GlobalCounters.reset()
    profile.enable()
    losses += [step(warmup + i % steps) for i in range(steps)]
    profile.disable()
    kernels = GlobalCounters.kernel_count / steps
    calls = sum(row[1] for row in pstats.Stats(profile).stats.values()) / steps  # type: ignore[attr-defined]
    executed = [0]

    def opcodes(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            executed[0] += 1
        return opcodes

    def frames(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        return opcodes

    sys.settrace(frames)
    losses += [step(warmup + i % steps) for i in range(3)]
    sys.settrace(None)
    return Counts(calls, executed[0] / 3, kernels), losses


measure = timed  # --counts: counted


def bench_native(
    demo: ModuleType, batches: list[tuple[np.ndarray, np.ndarray]], steps: int, rounds: int, jit: bool = True
) -> tuple[Timing, list[float]]:
    Tensor.manual_seed(0)
    model = demo.DigitsNet()
    opt = Adam(get_parameters(model), lr=LR)

    def train_step(x: Tensor, y: Tensor) -> Tensor:
        with Context(TRAINING=1):
            opt.zero_grad()
            loss: Tensor = model(x).sparse_categorical_crossentropy(y).backward()
            Tensor.realize(loss, *opt.schedule_step())
        return loss

    run = TinyJit(train_step) if jit else train_step

    def step(i: int) -> float:
        x, y = batches[i]
        return float(run(Tensor(x).realize(), Tensor(y.astype(np.int32)).realize()).item())

    return measure(step, steps, 2, rounds)


def _fresh(o: Any) -> Any:
    """A new torch tensor over the xgrad Tensor that `o` holds (as the real backend wraps its results each call), so
    that autograd can take a gradient over as its own instead of copying it; `o` itself when it is a view."""
    if not isinstance(o, torch.Tensor) or o.device.type != "xgrad":
        return o
    whole = xgrad_torch.storage.holder_of(o).whole
    if tuple(o.shape) != whole.shape or o.storage_offset() != 0 or not o.is_contiguous():
        return o
    return xgrad_torch.storage.wrap(whole, o.dtype)


def _replaying_compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
    """An aot_autograd graph compiler whose graph runs once and then returns those outputs, in new tensors, on every
    call."""
    first: list[Any] = []

    def run(args: list[Any]) -> Any:
        inputs = list(args)
        args.clear()
        if not first:
            first.append(gm(*inputs))
        return [_fresh(o) for o in first[0]]

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


# torch's own cost of the compiled step: dynamo's guards, aot_autograd's wrappers and autograd.Function, the autograd
# engine and the optimizer's step wrapper, around graphs that do no work (the floor under any torch.compile backend)
noop_backend = aot_autograd(fw_compiler=_replaying_compiler, bw_compiler=_replaying_compiler,
                            keep_inference_input_mutations=True)  # fmt: skip


def bench_torch(model: torch.nn.Module, device: str, batches: list[tuple[np.ndarray, np.ndarray]], steps: int,
                rounds: int, compiled: Any = False) -> tuple[Timing, list[float]]:  # fmt: skip
    model = model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    data = [(torch.from_numpy(x).to(device), torch.from_numpy(y).long().to(device)) for x, y in batches]

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(x), y)

    def update() -> None:
        opt.step()

    if compiled:  # the forward with its loss (and so its backward), and the optimizer step
        backend = "xgrad" if compiled is True else compiled
        loss_of = torch.compile(loss_of, backend=backend, dynamic=False)
        update = torch.compile(update, backend=backend, dynamic=False)

    def step(i: int) -> float:
        x, y = data[i]
        opt.zero_grad()
        loss = loss_of(x, y)
        loss.backward()  # type: ignore[no-untyped-call]
        update()
        return float(loss.item())

    return measure(step, steps, 3 if compiled else 2, rounds)


def tiny_op_us(make: Callable[[], tuple[Any, Any]], ops: int, rounds: int) -> float:
    """Microseconds to issue `a + b`, best of `rounds` rounds of `ops`."""
    a, b = make()
    for _ in range(50):
        a + b
    best = math.inf
    for _ in range(rounds):
        start = clock()
        for _ in range(ops):
            a + b
        best = min(best, (clock() - start) / ops * 1e6)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="timed training steps per round (30)")
    parser.add_argument("--ops", type=int, default=2000, help="tiny ops per round (2000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per variant; the best is reported (3)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="wall time or process CPU time")
    parser.add_argument("--counts", action="store_true", help="count calls, bytecodes and kernels per eager step")
    args = parser.parse_args(argv)
    global clock, measure
    if args.clock == "cpu":
        clock = time.process_time
        torch.set_num_threads(1)
    load_before = os.getloadavg()[0]
    demo = load_demo()
    x_train, y_train, _, _ = demo.load_split(0)
    rng = np.random.default_rng(1)
    batches = [
        (x_train[idx], y_train[idx]) for idx in (rng.integers(0, len(x_train), BATCH) for _ in range(args.steps + 3))
    ]
    Tensor.manual_seed(0)
    weights = {k: v.numpy() for k, v in get_state_dict(demo.DigitsNet()).items()}

    rounds = args.rounds
    if args.counts:
        measure = counted
        torch.set_num_threads(1)

        def bridge(compiled: Any = False) -> Timing:
            return bench_torch(torch_model(weights), "xgrad", batches, args.steps, rounds, compiled)[0]

        rows = [
            ("native xgrad, no TinyJit", bench_native(demo, batches, args.steps, rounds, jit=False)[0]),
            ("torch on xgrad, eager", bridge()),
            ("native xgrad (TinyJit)", bench_native(demo, batches, args.steps, rounds)[0]),
            ("torch on xgrad, torch.compile", bridge(True)),
            ("  torch's part: no-op graphs", bridge(noop_backend)),
        ]
        print(f"digits CNN training step, batch {BATCH}, per step (torch {torch.__version__})")
        print("                                  Python calls   bytecodes   kernels")
        for k, (name, c) in enumerate(rows):
            base = rows[0 if k < 2 else 2][1]  # eager steps: to native without TinyJit; the rest: to native TinyJit
            assert isinstance(c, Counts) and isinstance(base, Counts)
            print(f"  {name:30s} {c.calls:10.0f} {c.bytecodes:11.0f} {c.kernels:9.1f}   "
                  f"{c.calls / base.calls:.2f}x calls, {c.bytecodes / base.bytecodes:.2f}x bytecodes")  # fmt: skip
        return
    native, native_l = bench_native(demo, batches, args.steps, rounds)
    unjitted, _ = bench_native(demo, batches, args.steps, rounds, jit=False)
    cpu, cpu_l = bench_torch(torch_model(weights), "cpu", batches, args.steps, rounds)
    eager, eager_l = bench_torch(torch_model(weights), "xgrad", batches, args.steps, rounds)
    comp, comp_l = bench_torch(torch_model(weights), "xgrad", batches, args.steps, rounds, compiled=True)
    noop, _ = bench_torch(torch_model(weights), "xgrad", batches, args.steps, rounds, compiled=noop_backend)

    print(f"digits CNN training step, batch {BATCH}, best of {rounds} rounds of {args.steps} steps, {args.clock} "
          f"time (torch {torch.__version__}, NUM_CPU_THREADS={os.environ.get('NUM_CPU_THREADS', 'all')})")  # fmt: skip
    print("                                       best    worst   GC   best / native xgrad (TinyJit)")

    def row(name: str, t: Timing) -> None:
        print(f"  {name:34s} {t.best * 1e3:6.2f} {t.worst * 1e3:6.2f} ms {t.gc_share * 100:3.0f}%  "
              f"{t.best / native.best:5.2f}x")  # fmt: skip

    row("native xgrad (TinyJit)", native)
    row("native xgrad, no TinyJit", unjitted)
    row("torch CPU", cpu)
    row("torch on xgrad, eager", eager)
    row("torch on xgrad, torch.compile", comp)
    row("  torch's part: no-op graphs", noop)
    print(f"  ratios: eager/cpu {eager.best / cpu.best:.2f}x, compiled/cpu {comp.best / cpu.best:.2f}x, "
          f"eager/native no TinyJit {eager.best / unjitted.best:.2f}x")  # fmt: skip
    print(f"  first losses: cpu {cpu_l[0]:.5f} xgrad eager {eager_l[0]:.5f} compiled {comp_l[0]:.5f} "
          f"native {native_l[0]:.5f}")  # fmt: skip

    bridge_us = tiny_op_us(lambda: (torch.ones(4).to("xgrad"), torch.ones(4).to("xgrad")), args.ops, rounds)
    native_us = tiny_op_us(
        lambda: (Tensor.ones(4).contiguous().realize(), Tensor.ones(4).contiguous().realize()), args.ops, rounds
    )
    cpu_us = tiny_op_us(lambda: (torch.ones(4), torch.ones(4)), args.ops, rounds)
    xgrad_torch.storage.flush()
    overhead = f"{bridge_us - native_us:.1f} us ({bridge_us / native_us:.2f}x)"
    print(f"tiny op a + b (4 elements): torch on xgrad {bridge_us:.1f} us, native xgrad {native_us:.1f} us, "
          f"torch CPU {cpu_us:.1f} us; bridge overhead {overhead}")  # fmt: skip
    print(f"load average (1 min) {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")


if __name__ == "__main__":
    main()
