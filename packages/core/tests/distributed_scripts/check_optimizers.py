"""Run under mpirun by test_distributed.py: DataParallel with every optimizer of xgrad.nn.optim (and fused updates)
equals one process on the whole batch.

A two-layer MLP, init seeded per rank (DataParallel's broadcast makes it rank 0's), 3 steps on consecutive slices of
one batch per rank; rank 0 then runs the same steps alone on the whole batches. Prints "OK rank=<rank> <max diff>"."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from xgrad import Context, Tensor, TinyJit, nn
from xgrad.distributed import DataParallel, rank, world_size
from xgrad.nn import optim
from xgrad.nn.state import get_parameters, get_state_dict

R, W = rank(), world_size()
LOCAL, STEPS = 8, 3
rng = np.random.default_rng(3)
X = rng.standard_normal((STEPS, LOCAL * W, 6)).astype(np.float32)
Y = rng.standard_normal((STEPS, LOCAL * W, 3)).astype(np.float32)

OPTIMIZERS: dict[str, Callable[[list[Tensor]], optim.Optimizer]] = {
    "SGD": lambda ps: optim.SGD(ps, lr=0.1),
    "SGD-momentum-nesterov": lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
    "SGD-fused": lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9, fused=True),
    "LARS": lambda ps: optim.LARS(ps, lr=0.05),
    "Muon": lambda ps: optim.Muon(ps, lr=0.02),
    "LAMB": lambda ps: optim.LAMB(ps, lr=0.01),
    "Adam": lambda ps: optim.Adam(ps, lr=0.01),
    "AdamW-fused": lambda ps: optim.AdamW(ps, lr=0.01, fused=True),
}


class MLP:
    def __init__(self) -> None:
        self.l1, self.l2 = nn.Linear(6, 5), nn.Linear(5, 3)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l2(self.l1(x).relu())


def train(make_opt: Callable[[list[Tensor]], optim.Optimizer], seed: int, dp: bool, jit: bool) -> dict[str, np.ndarray]:
    Tensor.manual_seed(seed)
    model = MLP()
    opt = make_opt(get_parameters(model))
    wrapper = DataParallel(model) if dp else None

    def step(x: Tensor, y: Tensor) -> Tensor:
        with Context(TRAINING=1):
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            if wrapper is not None:
                wrapper.backward(loss)
            else:
                loss.backward()
            Tensor.realize(loss, *opt.schedule_step())
        return loss

    run = TinyJit(step) if jit else step
    for i in range(STEPS):
        xs, ys = (X[i], Y[i]) if not dp else (X[i][R * LOCAL : (R + 1) * LOCAL], Y[i][R * LOCAL : (R + 1) * LOCAL])
        run(Tensor(xs).realize(), Tensor(ys).realize())
    return {k: v.numpy() for k, v in get_state_dict(model).items()}


worst = 0.0
for name, make in OPTIMIZERS.items():
    jit = name in ("Adam", "LAMB")  # two of them under TinyJit as well
    mine = train(make, seed=10 + R, dp=True, jit=jit)
    if R == 0:
        want = train(make, seed=10, dp=False, jit=False)
        start = {k: v.numpy() for k, v in get_state_dict((Tensor.manual_seed(10), MLP())[1]).items()}
        for k in want:
            np.testing.assert_allclose(mine[k], want[k], rtol=1e-5, atol=1e-5, err_msg=f"{name} {k}")
            assert not np.array_equal(want[k], start[k]), f"{name}: {k} did not train"
            worst = max(worst, float(np.abs(mine[k] - want[k]).max()))
print(f"OK rank={R} {worst:.3g}", flush=True)
