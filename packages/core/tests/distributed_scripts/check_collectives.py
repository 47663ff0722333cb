"""Run under mpirun by test_distributed.py: every collective against numpy on this job's ranks.

Each rank builds the same inputs from a seed and its rank, so it can compute every rank's input, and so the expected
result, with numpy alone. Prints one line "OK rank=<rank> <checks>" on success; a mismatch raises (non-zero exit)."""

from __future__ import annotations

import os

import numpy as np

from xgrad import Tensor, TinyJit, dtypes
from xgrad.device import Device
from xgrad.distributed import (
    all_gather,
    all_reduce,
    all_reduce_coalesced,
    barrier,
    broadcast,
    broadcast_coalesced,
    local_rank,
    rank,
    reduce_scatter,
    split_rows,
    world_size,
)
from xgrad.distributed.comm import LIBNBC_IALLREDUCE, communicator

MPI = communicator().MPI  # MPI started by xgrad, so with the allreduce algorithm it asks Open MPI for
assert os.environ[LIBNBC_IALLREDUCE[0]] == LIBNBC_IALLREDUCE[1]
R, W = rank(), world_size()
DTYPES = {
    "float32": dtypes.float32,
    "float64": dtypes.float64,
    "int32": dtypes.int32,
    "int64": dtypes.int64,
    "uint8": dtypes.uint8,
    "int8": dtypes.int8,
}
SHAPES = [(), (1,), (7,), (W * 3 + 1,), (5, 3), (2, 3, 4), (1000 * W + 3,)]


def value(r: int, shape: tuple[int, ...], dt: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng((seed, r))
    if dt.startswith("float"):
        return rng.standard_normal(shape).astype(dt)
    lo, hi = (0, 8) if dt == "uint8" else (-5, 6)  # small: sums over 4 ranks fit int8 and uint8
    return rng.integers(lo, hi, shape).astype(dt)


def close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (
        f"{what}: {got.shape} {got.dtype} vs {want.shape} {want.dtype}"
    )
    if got.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


checks = 0
for seed, (shape, dt) in enumerate((s, d) for s in SHAPES for d in DTYPES):
    inputs = [value(r, shape, dt, seed) for r in range(W)]
    x = Tensor(inputs[R], dtype=DTYPES[dt])
    stacked = np.stack(inputs)
    close(all_reduce(x, "sum").numpy(), stacked.sum(0).astype(dt), f"all_reduce sum {shape} {dt}")
    close(all_reduce(x, "max").numpy(), stacked.max(0), f"all_reduce max {shape} {dt}")
    close(all_reduce(x, "min").numpy(), stacked.min(0), f"all_reduce min {shape} {dt}")
    if dt.startswith("float"):
        close(all_reduce(x, "mean").numpy(), (stacked.sum(0) * (1.0 / W)).astype(dt), f"all_reduce mean {shape} {dt}")
    root = seed % W
    close(broadcast(x, root).numpy(), inputs[root], f"broadcast from {root} {shape} {dt}")
    gathered = np.concatenate([i.reshape(-1) if not shape else i for i in inputs])
    close(all_gather(x).numpy(), gathered, f"all_gather {shape} {dt}")
    checks += 6
    if shape:
        s, e = split_rows(shape[0], W)[R]
        close(reduce_scatter(x, "sum").numpy(), stacked.sum(0).astype(dt)[s:e], f"reduce_scatter {shape} {dt}")
        close(reduce_scatter(x, "max").numpy(), stacked.max(0)[s:e], f"reduce_scatter max {shape} {dt}")
        checks += 2

# several tensors reduced by one collective, laid end to end (DataParallel's buckets): realized, lazy, a view
shapes = [(3, 5), (7,), (2, 2)]
mine = [value(R, shape, "float32", 100 + k) for k, shape in enumerate(shapes)]
every = [[value(r, shape, "float32", 100 + k) for k, shape in enumerate(shapes)] for r in range(W)]
want = np.concatenate(
    [sum(e[0] for e in every).reshape(-1), sum(e[1] for e in every), sum(e[2].T for e in every).reshape(-1)]
)
got = all_reduce_coalesced([Tensor(mine[0]).realize(), Tensor(mine[1]) * 1, Tensor(mine[2]).T]).numpy()
close(got, want.astype(np.float32), "all_reduce_coalesced")
root = W - 1
got = broadcast_coalesced([Tensor(mine[0]).realize(), Tensor(mine[1]) * 1, Tensor(mine[2]).T], root).numpy()
want = np.concatenate([every[root][0].reshape(-1), every[root][1], every[root][2].T.reshape(-1)])
close(got, want, "broadcast_coalesced")

# 16-bit floats (reduced by an MPI op of ours): small integers and halves, so every order of summing is exact
for half in (dtypes.float16, dtypes.bfloat16):
    vals = [np.random.default_rng((50, r)).integers(-8, 9, 37).astype(np.float32) / 2 for r in range(W)]
    x = Tensor(vals[R]).cast(half)
    stacked = np.stack(vals)
    close(all_reduce(x, "sum").float().numpy(), stacked.sum(0), f"all_reduce sum {half.name}")
    close(all_reduce(x, "max").float().numpy(), stacked.max(0), f"all_reduce max {half.name}")
    close(all_reduce(x, "mean").float().numpy(), stacked.sum(0) / W, f"all_reduce mean {half.name}")
    s, e = split_rows(37, W)[R]
    close(reduce_scatter(x, "min").float().numpy(), stacked.min(0)[s:e], f"reduce_scatter min {half.name}")
    close(
        all_reduce_coalesced([x, x * 2]).float().numpy(),
        np.concatenate([stacked.sum(0), 2 * stacked.sum(0)]),
        half.name,
    )
    checks += 5
rounded = all_reduce(Tensor([1.0 + 2**-9] * 3).cast(dtypes.bfloat16), "sum").float().numpy()  # 1 + 2^-9 is bf16 1.0
close(rounded, np.full(3, float(W), np.float32), "bfloat16 rounding")

# lazy inputs (a computed, non-contiguous view) and a bool reduction
a = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4) + R)
close(
    all_reduce(a.T * 2, "sum").numpy(),
    sum((np.arange(12, dtype=np.float32).reshape(3, 4) + r).T * 2 for r in range(W)),
    "lazy view",
)
flags = Tensor(np.array([R == 0, True, False]))
close(all_reduce(flags, "max").numpy(), np.array([True, True, False]), "bool any")
close(all_reduce(flags, "min").numpy(), np.array([W == 1, True, False]), "bool all")

# under TinyJit: the collective is a captured step, replayed on new inputs
step = TinyJit(lambda t: (all_reduce(t * 2, "sum") + 1).realize())
for i in range(4):
    got = step(Tensor(np.full(5, float(R + i), np.float32)).realize()).numpy()
    close(got, np.full(5, sum(2.0 * (r + i) for r in range(W)) + 1, np.float32), f"TinyJit call {i}")
assert step.captured is not None and any(not s.is_kernel for s in step.captured.linear.src)
# a device's own collective library (the NCCL hook): an optional method `collective` of the device object is called
# instead of the host path; here one that records the call and reduces through mpi4py on copies of the bytes
calls = []


def hook(step: object, out: object, src: object) -> None:
    calls.append(step.name)  # type: ignore[attr-defined]
    send = np.frombuffer(src.as_bytes(), np.float32).copy()  # type: ignore[attr-defined]
    recv = np.empty_like(send)
    MPI.COMM_WORLD.Allreduce(send, recv)
    out.copyin(memoryview(recv).cast("B"))  # type: ignore[attr-defined]


cpu = Device["CPU"]
cpu.collective = hook  # type: ignore[attr-defined]
try:
    close(all_reduce(Tensor([1.0, float(R)])).numpy(), np.array([W, sum(range(W))], np.float32), "device hook")
finally:
    del cpu.collective  # type: ignore[attr-defined]
assert calls == ["all_reduce(sum)"], calls
assert local_rank() == R and MPI.COMM_WORLD.Get_rank() == R  # one host: the local rank is the rank
barrier()
checks += 10
print(f"OK rank={R} {checks}", flush=True)
