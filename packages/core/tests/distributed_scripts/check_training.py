"""Run under mpirun by test_distributed.py: the digits CNN trained data-parallel equals one process on the whole batch.

    check_training.py eager|jit CHECKPOINT_DIR

Every rank starts from its own random init (seeded by its rank): DataParallel's broadcast makes them rank 0's. Each
step, the ranks take consecutive slices of one batch drawn the same on every rank. Rank 0 then trains the same model
alone, from the same init, on the whole batches, and compares the weights (1e-5). Every rank checks that its weights
are rank 0's, bit for bit. With a checkpoint dir: rank 0 saves model and optimizer, every rank resumes into a fresh
model, and one more step from the resumed state equals one more step of the original.
Prints "OK rank=<rank> <max difference>"."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import numpy as np

from xgrad import Context, Tensor, TinyJit
from xgrad.distributed import DataParallel, all_gather, load_checkpoint, rank, save_checkpoint, world_size
from xgrad.nn.optim import Adam
from xgrad.nn.state import get_parameters, get_state_dict

ROOT = pathlib.Path(__file__).resolve().parents[4]
spec = importlib.util.spec_from_file_location("train_digits", ROOT / "examples" / "train_digits.py")
assert spec is not None and spec.loader is not None
demo = importlib.util.module_from_spec(spec)
sys.modules["train_digits"] = demo  # its dataclasses look their module up
spec.loader.exec_module(demo)

MODE, CKPT = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "")
R, W = rank(), world_size()
STEPS, LOCAL_BATCH, LR = 4, 16, 1e-2


def load_train() -> tuple[np.ndarray, np.ndarray]:
    """demo.load_split(0)'s training set, read from scikit-learn's digits file without importing scikit-learn (its
    import costs seconds per rank on a loaded host)."""
    found = importlib.util.find_spec("sklearn")
    assert found is not None and found.origin is not None
    data = np.loadtxt(pathlib.Path(found.origin).parent / "datasets" / "data" / "digits.csv.gz", delimiter=",")
    x = data[:, :-1].astype(np.float32).reshape(-1, 1, 8, 8)
    y = data[:, -1].astype(np.int32)
    order = np.random.default_rng(0).permutation(len(x))
    train = order[: -int(round(len(x) * 0.2))]
    x = (x - x[train].mean()) / x[train].std()
    return x[train], y[train]


x_train, y_train = load_train()
order = np.random.default_rng(7).integers(0, len(x_train), (STEPS + 1, LOCAL_BATCH * W))  # +1: the resumed step


def make(seed: int) -> tuple[object, Adam]:
    Tensor.manual_seed(seed)
    model = demo.DigitsNet()
    return model, Adam(get_parameters(model), lr=LR)


def step_fn(model: object, opt: Adam, dp: DataParallel | None) -> object:
    def step(x: Tensor, y: Tensor) -> Tensor:
        with Context(TRAINING=1):
            opt.zero_grad()
            loss = model(x).sparse_categorical_crossentropy(y)  # type: ignore[operator]
            if dp is not None:
                dp.backward(loss)
            else:
                loss.backward()
            Tensor.realize(loss, *opt.schedule_step())
        return loss

    return TinyJit(step) if MODE == "jit" else step


def batch(i: int, part: bool) -> tuple[Tensor, Tensor]:
    idx = order[i][R * LOCAL_BATCH : (R + 1) * LOCAL_BATCH] if part else order[i]
    return Tensor(x_train[idx]).realize(), Tensor(y_train[idx]).realize()


def weights(obj: object) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in get_state_dict(obj).items()}


model, opt = make(seed=100 + R)
dp = DataParallel(model)
step = step_fn(model, opt, dp)
for i in range(STEPS):
    step(*batch(i, part=True))  # type: ignore[operator]
mine = weights(model)
for name, w in mine.items():  # every rank holds rank 0's weights, bit for bit
    every = all_gather(Tensor(w.reshape(1, -1))).numpy()
    assert (every == every[0]).all(), f"rank {R}: {name} differs between ranks"

worst = 0.0
if R == 0:  # one process, the whole batches, no collective
    ref_model, ref_opt = make(seed=100)
    ref_step = step_fn(ref_model, ref_opt, None)
    for i in range(STEPS):
        ref_step(*batch(i, part=False))  # type: ignore[operator]
    start = weights(make(seed=100)[0])
    for name, want in weights(ref_model).items():
        np.testing.assert_allclose(mine[name], want, rtol=1e-5, atol=1e-5, err_msg=name)
        worst = max(worst, float(np.abs(mine[name] - want).max()))
        assert not np.array_equal(want, start[name]), f"{name} did not train"

if CKPT:
    path = pathlib.Path(CKPT) / "dp.safetensors"
    save_checkpoint({"model": model, "opt": opt}, path)
    resumed, resumed_opt = make(seed=200 + R)
    load_checkpoint({"model": resumed, "opt": resumed_opt}, path)
    for name, w in weights(resumed).items():
        np.testing.assert_array_equal(w, mine[name], err_msg=f"resumed {name}")
    resumed_step = step_fn(resumed, resumed_opt, DataParallel(resumed, broadcast_params=False))
    resumed_step(*batch(STEPS, part=True))  # type: ignore[operator]
    step(*batch(STEPS, part=True))  # type: ignore[operator]
    for name, w in weights(resumed).items():
        np.testing.assert_allclose(w, weights(model)[name], rtol=1e-6, atol=1e-7, err_msg=f"step after resume {name}")
print(f"OK rank={R} {worst:.3g}", flush=True)
