"""Run under mpirun by test_distributed.py: DataParallel with its buckets' collectives overlapped with the rest of the
backward (the default) trains to the same weights as with every bucket reduced in one step after it (overlap=False).

An MLP of four layers, buckets small enough that its gradients make several (each but the last started before the
next bucket's gradients are computed), 3 Adam steps and 3 fused-SGD steps on each rank's slice of a batch, eagerly and
under TinyJit (argv[1]: "eager" or "jit"). Every run of a collective step is counted, to check that the split steps
ran. Prints "OK rank=<rank> <max diff>"."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from xgrad import Context, Tensor, TinyJit, nn
from xgrad.distributed import DataParallel, rank, world_size
from xgrad.distributed.collectives import Collective, all_reduce_coalesced_start, collective_wait
from xgrad.distributed.data_parallel import buckets
from xgrad.nn import optim
from xgrad.nn.state import get_parameters, get_state_dict

R, W = rank(), world_size()
MODE = sys.argv[1]
LOCAL, STEPS = 8, 3
BUCKET_MB = 3000 / 2**20  # about 750 float32s: the 4 layers' gradients (2.3k floats) make several buckets
rng = np.random.default_rng(5)
X = rng.standard_normal((STEPS, LOCAL * W, 12)).astype(np.float32)
Y = rng.standard_normal((STEPS, LOCAL * W, 3)).astype(np.float32)

ran: list[str] = []
_run = Collective.run


def counted(self: Collective, out: Any, *srcs: Any) -> None:
    ran.append(self.name)
    _run(self, out, *srcs)


Collective.run = counted  # type: ignore[method-assign]


class MLP:
    def __init__(self) -> None:
        self.layers = [nn.Linear(12, 32), nn.Linear(32, 32), nn.Linear(32, 24), nn.Linear(24, 3)]

    def __call__(self, x: Tensor) -> Tensor:
        for layer in self.layers[:-1]:
            x = layer(x).relu()
        return self.layers[-1](x)


def train(make_opt: Callable[[list[Tensor]], optim.Optimizer], overlap: bool) -> dict[str, np.ndarray]:
    Tensor.manual_seed(7 + R)  # DataParallel's broadcast makes every rank's init rank 0's
    model = MLP()
    opt = make_opt(get_parameters(model))
    dp = DataParallel(model, bucket_mb=BUCKET_MB, overlap=overlap)

    def step(x: Tensor, y: Tensor) -> Tensor:
        with Context(TRAINING=1):
            opt.zero_grad()
            loss = dp.backward(((model(x) - y) ** 2).mean())
            Tensor.realize(loss, *opt.schedule_step())
        return loss

    run = TinyJit(step) if MODE == "jit" else step
    for i in range(STEPS):
        part = slice(R * LOCAL, (R + 1) * LOCAL)
        run(Tensor(X[i][part]).realize(), Tensor(Y[i][part]).realize())
    return {k: v.numpy() for k, v in get_state_dict(model).items()}


# the wait step waits: rank 1 comes 0.3 s late, so rank 0's start cannot have completed when its wait step runs
parts = [np.arange(n, dtype=np.float32) * (r + 1) for r, n in ((r, 1 << 18) for r in range(W))]
mine_part = [Tensor(parts[R][: 1 << 17]).realize(), Tensor(parts[R][1 << 17 :]).realize()]
if R == 1:
    time.sleep(0.3)
got = collective_wait(all_reduce_coalesced_start(mine_part)).numpy()
np.testing.assert_array_equal(got, np.sum(parts, axis=0), err_msg="all_reduce_coalesced_start + collective_wait")

worst = 0.0
for name, make in {
    "Adam": lambda ps: optim.Adam(ps, lr=0.01),
    "SGD-fused": lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9, fused=True),
}.items():
    ran.clear()
    overlapped = train(make, overlap=True)
    n = len(buckets(get_parameters(MLP())[::-1], int(BUCKET_MB * 2**20)))
    assert n >= 3, n
    starts, waits = ran.count("all_reduce(sum) start"), ran.count("all_reduce(sum) wait")
    assert starts == waits == (n - 1) * STEPS, f"{name}: {starts} starts, {waits} waits for {n} buckets x {STEPS} steps"
    assert ran.count("all_reduce(sum)") == STEPS, ran  # the last bucket in one step
    ran.clear()
    whole = train(make, overlap=False)
    assert (
        "all_reduce(sum) start" not in ran
        and ran.count("all_reduce(sum)") == len(buckets(get_parameters(MLP()), int(BUCKET_MB * 2**20))) * STEPS
    ), ran
    for k, want in whole.items():
        np.testing.assert_allclose(overlapped[k], want, rtol=0, atol=1e-6, err_msg=f"{name} {MODE} {k}")
        worst = max(worst, float(np.abs(overlapped[k] - want).max()))
print(f"OK rank={R} {worst:.3g}", flush=True)
