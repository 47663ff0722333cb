"""The training demo's step on WEBGPU (lavapipe without a GPU) against torch CPU, measured in the same run.

Run: .venv/bin/python bench/bench_webgpu.py [--steps 30]
Each configuration trains examples/train_digits.py for --steps steps in its own child process and reports the mean
replayed (TinyJit) step: wall time and process CPU time (all threads, lavapipe's included: steadier than wall time on
a shared machine). Configurations: the backend as it is; with the GPU heuristic and range merging of session 14
(`webgpu-old-heuristic`: every kernel's output ranges merged into one, GROUP below 16384 outputs, a workgroup from the
store-contiguous loop only); without merging output ranges into one parallel range; without batching dispatches
into one submit; without both (the backend of session 1); and the xgrad CPU device. The torch row trains the same
network (same layers, Adam, batch 64) on torch CPU; ratios are against it (above 1 means xgrad is slower).
`--modes a,b --rounds 3` runs only those configurations, alternating, three times each (old against new on a loaded
machine). Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODES = ("webgpu", "webgpu-old-heuristic", "webgpu-no-merge", "webgpu-no-batch", "webgpu-session-1", "cpu")


def child(mode: str, steps: int) -> dict[str, float]:
    """Train in this process with `mode`; the mean replayed step in ms (wall and CPU) and the test accuracy."""
    sys.path.insert(0, str(ROOT / "examples"))
    import train_digits  # type: ignore[import-not-found]

    import xgrad.engine.jit as jit

    if mode.startswith("webgpu"):
        from xgrad_webgpu import device as wd

        if mode in ("webgpu-no-merge", "webgpu-session-1"):
            wd.merge_output_ranges = lambda ast: ast  # type: ignore[attr-defined]
        if mode in ("webgpu-no-batch", "webgpu-session-1"):
            wd.MAX_PENDING_DISPATCHES = 1
        if mode == "webgpu-old-heuristic":
            from xgrad import Device
            from xgrad_codegen import gpu_opt
            from xgrad_webgpu import parallel

            wd.merge_output_ranges = parallel.flatten_output_ranges  # type: ignore[attr-defined]
            gpu_opt._more_threads = lambda ast, renderer, split: []
            renderer = Device["WEBGPU"].renderer
            renderer.group_max_outputs, renderer.min_local = 16384, 1  # a GPU's defaults
    # every call of the step (TinyJit's replays take a fast path that skips `_replay`): the first runs eagerly, the
    # second captures, the third is the first replay (it warms caches); time from the start of the fourth call to the
    # start of the last, whole steps only (the loss read, the next learning rate). The test set's evaluation after
    # the last step is not a step: it compiled its own kernels inside the window before (with BEAM=2 and no BEAM
    # cache it searched them: 1168 ms per "step" over 7 steps, the step itself 35 ms)
    call, marks = jit.TinyJit.__call__, {"calls": 0, "cpu": 0.0, "wall": 0.0, "cpu_end": 0.0, "wall_end": 0.0}

    def timed_call(self: object, *args: object, **kwargs: object) -> object:
        marks["calls"] += 1
        if marks["calls"] == 4:
            marks["cpu"], marks["wall"] = time.process_time(), time.perf_counter()
        marks["cpu_end"], marks["wall_end"] = time.process_time(), time.perf_counter()
        return call(self, *args, **kwargs)  # type: ignore[arg-type]

    jit.TinyJit.__call__ = timed_call  # type: ignore[method-assign,assignment]
    device = "CPU" if mode == "cpu" else "WEBGPU"
    result = train_digits.train(steps=steps, device=device, log=open(os.devnull, "w"))  # noqa: SIM115
    n = marks["calls"] - 4
    if n < 1:
        raise SystemExit(f"--steps {steps}: at least 5 steps are needed to time one replayed step")
    cpu, wall = marks["cpu_end"] - marks["cpu"], marks["wall_end"] - marks["wall"]
    return {"wall_ms": 1e3 * wall / n, "cpu_ms": 1e3 * cpu / n, "accuracy": result.test_accuracy}


def torch_step_ms(steps: int) -> dict[str, float]:
    import numpy as np
    import torch

    sys.path.insert(0, str(ROOT / "examples"))
    import train_digits

    torch.manual_seed(0)
    x_train, y_train, _, _ = train_digits.load_split(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 16, 3), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(256, 10),
    )  # fmt: skip
    opt = torch.optim.Adam(model.parameters(), lr=2e-2)
    rng = np.random.default_rng(1)
    cpu = wall = 0.0
    for step in range(steps):
        if step == 2:
            cpu, wall = time.process_time(), time.perf_counter()
        idx = rng.integers(0, len(x_train), 64)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(
            model(torch.from_numpy(x_train[idx])), torch.from_numpy(y_train[idx]).long()
        )
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        loss.item()
    n = steps - 2
    return {"wall_ms": 1e3 * (time.perf_counter() - wall) / n, "cpu_ms": 1e3 * (time.process_time() - cpu) / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated configurations to run")
    parser.add_argument("--rounds", type=int, default=1, help="run the configurations this many times, alternating")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.steps)))
        return
    modes = [m for m in args.modes.split(",") if m]
    if unknown := [m for m in modes if m not in MODES]:
        parser.error(f"unknown configurations {unknown}: choose from {', '.join(MODES)}")
    torch_ms = torch_step_ms(args.steps)
    print(f"{'configuration':20s} {'wall ms/step':>13s} {'CPU ms/step':>12s} {'wall/torch':>11s} {'accuracy':>9s}")
    print(f"{'torch CPU':20s} {torch_ms['wall_ms']:13.2f} {torch_ms['cpu_ms']:12.2f} {1.0:11.2f}")
    for mode in modes * args.rounds:
        cmd = [sys.executable, __file__, "--child", mode, "--steps", str(args.steps)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            print(f"{mode:20s} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
            continue
        r = json.loads(line.removeprefix("RESULT "))
        ratio = r["wall_ms"] / torch_ms["wall_ms"]
        print(f"{mode:20s} {r['wall_ms']:13.2f} {r['cpu_ms']:12.2f} {ratio:11.2f} {r['accuracy']:9.4f}")


if __name__ == "__main__":
    main()
