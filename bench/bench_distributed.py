"""xgrad.distributed on this machine: all_reduce bandwidth beside mpi4py on numpy arrays, and a data-parallel step.

    python bench/bench_distributed.py [--sizes-mb 1 4 16 64 256] [--repeats 5] [--steps 20] [--bucket-mb 4]

Launches itself under mpirun (Open MPI; as root with --allow-run-as-root --oversubscribe):
1. 2 ranks: for each size, the best time of `all_reduce(x).realize()` on a realized float32 CPU tensor (xgrad: a
   schedule item whose MPI call reads and writes the tensors' buffers), of the same under TinyJit (what a jitted
   training step pays), and of `comm.Allreduce(a, b)` on numpy arrays (mpi4py, blocking), alternating, each after
   the same blocking MPI barrier. MPI is started by xgrad (with the allreduce algorithm it asks Open MPI for, see
   xgrad.distributed.comm; mpi4py's blocking call is not affected). Bandwidth is the algorithm bandwidth: bytes / time.
2. The digits CNN (examples/train_digits.py) trained with DataParallel under TinyJit on a global batch of 64: one rank
   (the whole batch) and two ranks (32 each); the median replayed step time.
3. Overlap: an MLP of --mlp-layers layers of --mlp-width (16 MB of float32 gradients by default) trained with
   DataParallel under TinyJit on 2 ranks, buckets of --bucket-mb: the median step with the buckets' collectives
   overlapped with the rest of the backward (the default) and with overlap=False, alternating.

Ratios are measured in the same run; the numbers depend on the host's load (ranks share its cores).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def launch(n: int, *args: str) -> list[dict[str, float]]:
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        sys.exit("bench_distributed: mpirun is not installed (apt install openmpi-bin)")
    flags = (["--allow-run-as-root"] if os.geteuid() == 0 else []) + ["--oversubscribe"]
    env = {**os.environ, "NUM_CPU_THREADS": os.environ.get("NUM_CPU_THREADS", "1")}
    cmd = [mpirun, *flags, "-n", str(n), sys.executable, __file__, "--worker", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:
        sys.exit(f"bench_distributed: {' '.join(cmd)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return [json.loads(line[5:]) for line in out.stdout.splitlines() if line.startswith("JSON ")]


def worker_allreduce(sizes_mb: list[float], repeats: int) -> None:
    import numpy as np

    from xgrad import Tensor, TinyJit
    from xgrad.distributed import all_reduce, rank
    from xgrad.distributed.comm import communicator

    comm = communicator().MPI.COMM_WORLD  # MPI started by xgrad (its choice of Open MPI's allreduce: see comm.py)
    for mb in sizes_mb:
        n = int(mb * 2**20) // 4
        a = np.full(n, float(rank() + 1), np.float32)
        b = np.empty_like(a)
        x = Tensor(a).realize()
        all_reduce(x).realize()  # warm: the schedule cached, the output memory cached by the allocator
        jitted = TinyJit(lambda t: all_reduce(t).realize())
        for _ in range(3):  # run, capture, replay
            jitted(x)
        best_x = best_j = best_m = float("inf")
        # each timed call after the same blocking MPI barrier; small sizes get more calls (best of 5 calls of 0.2 ms
        # is one scheduler tick from another answer): at least 64 MB moved per column
        for _ in range(max(repeats, int(64 // mb))):
            comm.Barrier()
            t = time.perf_counter()
            y = all_reduce(x).realize()
            best_x = min(best_x, time.perf_counter() - t)
            del y
            comm.Barrier()
            t = time.perf_counter()
            jitted(x)
            best_j = min(best_j, time.perf_counter() - t)
            comm.Barrier()
            t = time.perf_counter()
            comm.Allreduce(a, b)
            best_m = min(best_m, time.perf_counter() - t)
        assert float(all_reduce(x).numpy()[0]) == float(b[0])
        if rank() == 0:
            row = {"mb": mb, "xgrad_s": best_x, "jit_s": best_j, "mpi4py_s": best_m}
            print("JSON " + json.dumps(row), flush=True)


def worker_step(steps: int, global_batch: int) -> None:
    import numpy as np

    from xgrad import Context, Tensor, TinyJit
    from xgrad.distributed import DataParallel, rank, world_size
    from xgrad.nn.optim import Adam
    from xgrad.nn.state import get_parameters

    spec = importlib.util.spec_from_file_location("train_digits", ROOT / "examples" / "train_digits.py")
    assert spec is not None and spec.loader is not None
    demo = importlib.util.module_from_spec(spec)
    sys.modules["train_digits"] = demo
    spec.loader.exec_module(demo)
    x_train, y_train, _, _ = demo.load_split(0)
    r, w = rank(), world_size()
    local = global_batch // w
    Tensor.manual_seed(0)
    model = demo.DigitsNet()
    opt = Adam(get_parameters(model), lr=1e-3)
    dp = DataParallel(model)

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        with Context(TRAINING=1):
            opt.zero_grad()
            loss = dp.backward(model(x).sparse_categorical_crossentropy(y))
            Tensor.realize(loss, *opt.schedule_step())
        return loss

    rng = np.random.default_rng(1)
    times = []
    for i in range(steps + 3):
        idx = rng.integers(0, len(x_train), global_batch)[r * local : (r + 1) * local]
        xb, yb = Tensor(x_train[idx]).realize(), Tensor(y_train[idx]).realize()
        t = time.perf_counter()
        step(xb, yb).item()
        if i >= 3:  # after the eager call, the capture and one replay
            times.append(time.perf_counter() - t)
    if r == 0:
        print("JSON " + json.dumps({"ranks": w, "step_s": statistics.median(times)}), flush=True)


def worker_overlap(steps: int, layers: int, width: int, bucket_mb: float) -> None:
    import numpy as np

    from xgrad import Context, Tensor, TinyJit, nn
    from xgrad.distributed import DataParallel, rank
    from xgrad.nn.optim import SGD
    from xgrad.nn.state import get_parameters

    r = rank()
    rng = np.random.default_rng(r)
    x = Tensor(rng.standard_normal((32, width)).astype(np.float32)).realize()
    y = Tensor(rng.standard_normal((32, width)).astype(np.float32)).realize()
    runs = {}
    for overlap in (True, False):
        Tensor.manual_seed(0)
        model = [nn.Linear(width, width) for _ in range(layers)]
        opt = SGD(get_parameters(model), lr=1e-4)
        dp = DataParallel(model, bucket_mb=bucket_mb, overlap=overlap)

        def step(x: Tensor, y: Tensor, model: list = model, opt: SGD = opt, dp: DataParallel = dp) -> Tensor:
            with Context(TRAINING=1):
                opt.zero_grad()
                h = x
                for layer in model:
                    h = layer(h).relu()
                loss = dp.backward(((h - y) ** 2).mean())
                Tensor.realize(loss, *opt.schedule_step())
            return loss

        runs[overlap] = TinyJit(step)
        for _ in range(3):
            runs[overlap](x, y).item()
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(steps):
        for overlap, run in runs.items():
            t = time.perf_counter()
            run(x, y).item()
            times[overlap].append(time.perf_counter() - t)
    if r == 0:
        row = {"overlap_s": statistics.median(times[True]), "whole_s": statistics.median(times[False])}
        print("JSON " + json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 4, 16, 64, 256])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--mlp-layers", type=int, default=4)
    parser.add_argument("--mlp-width", type=int, default=1024)
    parser.add_argument("--bucket-mb", type=float, default=4.0)
    parser.add_argument("--worker", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        if args.worker[0] == "allreduce":
            worker_allreduce(args.sizes_mb, args.repeats)
        elif args.worker[0] == "overlap":
            worker_overlap(args.steps, args.mlp_layers, args.mlp_width, args.bucket_mb)
        else:
            worker_step(args.steps, args.batch)
        return
    sizes = [str(s) for s in args.sizes_mb]
    print("all_reduce, 2 ranks, float32 on CPU (bandwidth = bytes / time, best of --repeats or 64 MB / size calls)")
    print("xgrad: all_reduce(x).realize() (scheduled each call); jit: the same replayed by TinyJit")
    print(f"{'MB':>8} {'xgrad GB/s':>11} {'jit GB/s':>9} {'mpi4py GB/s':>12} {'xgrad/mpi4py':>13} {'jit/mpi4py':>11}")
    for row in launch(2, "allreduce", "--sizes-mb", *sizes, "--repeats", str(args.repeats)):
        nbytes = row["mb"] * 2**20
        gx, gj, gm = (nbytes / row[k] / 1e9 for k in ("xgrad_s", "jit_s", "mpi4py_s"))
        print(f"{row['mb']:8g} {gx:11.2f} {gj:9.2f} {gm:12.2f} {gx / gm:13.2f} {gj / gm:11.2f}")
    print(f"\ndata-parallel digits CNN step (DataParallel + TinyJit, Adam), global batch {args.batch}")
    one = launch(1, "step", "--steps", str(args.steps), "--batch", str(args.batch))[0]
    two = launch(2, "step", "--steps", str(args.steps), "--batch", str(args.batch))[0]
    print(f"1 rank : {one['step_s'] * 1e3:8.2f} ms/step (batch {args.batch})")
    speedup = one["step_s"] / two["step_s"]
    print(f"2 ranks: {two['step_s'] * 1e3:8.2f} ms/step (batch {args.batch // 2} each); speedup {speedup:.2f}x")
    mlp = ["--steps", str(args.steps), "--mlp-layers", str(args.mlp_layers), "--mlp-width", str(args.mlp_width)]
    ov = launch(2, "overlap", *mlp, "--bucket-mb", str(args.bucket_mb))[0]
    mb = args.mlp_layers * (args.mlp_width + 1) * args.mlp_width * 4 / 2**20
    print(
        f"\noverlap: MLP {args.mlp_layers}x{args.mlp_width} ({mb:.0f} MB of gradients), "
        f"buckets of {args.bucket_mb:g} MB"
    )
    print(
        f"2 ranks: {ov['overlap_s'] * 1e3:8.2f} ms/step overlapped, {ov['whole_s'] * 1e3:8.2f} ms/step after backward"
    )
    print(f"(host: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}: ranks share the cores)")


if __name__ == "__main__":
    main()
