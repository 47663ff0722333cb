"""A tinygrad-style reference script, run on xgrad with only its imports changed.

Everything below the imports is written the way a tinygrad user writes it: a small CNN with BatchNorm feeds a
transformer block (multi-head self-attention, LayerNorm, a gelu MLP, residuals); the model is trained for a few
steps with `nn.optim.Adam` inside a `TinyJit` step under `Tensor.train()`, its weights are saved with
`safe_save`, loaded back into a fresh model with `safe_load` + `load_state_dict`, and both are run in eval mode.
Batches are drawn with `Tensor.randint`; the eval pass is scheduled with `schedule_linear` and run with `run_linear`;
the head's weights are also dumped to a raw file through DISK tensors (a length header written through a bitcast
view, then the float32 values) and read back with `Tensor(pathlib.Path(...))`; and causal attention over a prefix
whose length is a bound `Variable` (one kernel for every length, as a KV-cache decode uses) is checked against the
full sequence. An inverse temperature is fitted on the eval logits: a plain `Tensor([1.0])` trained by Adam, the
logits scaled by a custom kernel written in UOps with its own backward; the eval pass is replayed by a
`TinyJit(prune=True)`; and a matmul of the wrong shape is caught as the `RuntimeError` tinygrad raises.

The only lines changed from the tinygrad original are the four import lines marked `# was: ...`:

    from tinygrad import Tensor, nn, TinyJit, dtypes, Device, GlobalCounters, Variable
    from tinygrad.nn.state import get_parameters, get_state_dict, load_state_dict, safe_load, safe_save
    from tinygrad.engine.realize import run_linear
    from tinygrad.uop.ops import KernelInfo, UOp

Run: python examples/tinygrad_reference.py [--steps 12] [--batch 32]
(the data are 8x8 digit images from scikit-learn when it is installed, else a seeded synthetic set).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import tempfile

import numpy as np

from xgrad import Device, GlobalCounters, Tensor, TinyJit, Variable, dtypes, nn  # was: from tinygrad import ...
from xgrad.engine.realize import run_linear  # was: from tinygrad.engine.realize import run_linear
from xgrad.nn.state import get_parameters, get_state_dict, load_state_dict, safe_load, safe_save  # was: tinygrad...
from xgrad.uop.ops import KernelInfo, UOp  # was: from tinygrad.uop.ops import KernelInfo, UOp


class ConvStem:
    """(B, 1, 8, 8) images -> (B, 4, dim) tokens: two conv + BatchNorm + relu + 2x2 max-pool stages."""

    def __init__(self, dim: int):
        self.c1, self.bn1 = nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm(8)
        self.c2, self.bn2 = nn.Conv2d(8, dim, 3, padding=1), nn.BatchNorm(dim)

    def __call__(self, x: Tensor) -> Tensor:
        x = self.bn1(self.c1(x)).relu().max_pool2d((2, 2))  # -> (B, 8, 4, 4)
        x = self.bn2(self.c2(x)).relu().max_pool2d((2, 2))  # -> (B, dim, 2, 2)
        return x.flatten(2).transpose(1, 2)  # -> (B, 4, dim): one token per spatial position


class TransformerBlock:
    """Pre-norm block: x + attn(ln1(x)), then + mlp(ln2(x))."""

    def __init__(self, dim: int, n_heads: int):
        self.n_heads = n_heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def attention(self, x: Tensor) -> Tensor:
        bs, seqlen, dim = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=2)
        q, k, v = [t.reshape(bs, seqlen, self.n_heads, dim // self.n_heads).transpose(1, 2) for t in (q, k, v)]
        out = q.scaled_dot_product_attention(k, v)  # (bs, heads, seqlen, head_dim)
        return self.proj(out.transpose(1, 2).reshape(bs, seqlen, dim))

    def __call__(self, x: Tensor) -> Tensor:
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(self.fc1(self.ln2(x)).gelu())


class Model:
    def __init__(self, dim: int = 16, n_heads: int = 2, classes: int = 10):
        self.stem = ConvStem(dim)
        self.pos = nn.Embedding(4, dim)  # learned position embedding of the 4 tokens
        self.block = TransformerBlock(dim, n_heads)
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def __call__(self, x: Tensor) -> Tensor:
        h = self.block(self.stem(x) + self.pos(Tensor.arange(4)))
        return self.head(self.ln_f(h).mean(axis=1))


def get_data(n: int = 512, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(images (n, 1, 8, 8) float32 standardised, labels (n,) int32)."""
    try:
        from sklearn.datasets import load_digits  # type: ignore[import-untyped]

        d = load_digits()
        x, y = d.images.astype(np.float32)[:n], d.target.astype(np.int32)[:n]
    except ImportError:  # a seeded stand-in: the label is which of 10 fixed patterns an image is closest to
        rng = np.random.default_rng(seed)
        patterns = rng.standard_normal((10, 8, 8)).astype(np.float32)
        y = rng.integers(0, 10, n).astype(np.int32)
        x = patterns[y] + 0.5 * rng.standard_normal((n, 8, 8)).astype(np.float32)
    x = ((x - x.mean()) / x.std()).astype(np.dtype(dtypes.default_float.fmt))
    return x.reshape(-1, 1, 8, 8), y


def train(model: Model, steps: int = 12, batch: int = 32, lr: float = 3e-3, seed: int = 0) -> list[float]:
    """Train `model` for `steps` Adam steps; returns the loss of every step."""
    xs, ys = get_data(seed=seed)
    opt = nn.optim.Adam(get_parameters(model), lr=lr)

    @TinyJit
    def train_step(x: Tensor, y: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = model(x).sparse_categorical_crossentropy(y).backward()
            opt.step()
        return loss.realize()

    losses = []
    for _ in range(steps):
        idx = Tensor.randint(batch, high=len(xs)).numpy()  # seeded by Tensor.manual_seed
        x, y = Tensor(xs[idx]), Tensor(ys[idx]).cast(dtypes.int32)  # lazy inputs: the JIT realizes them
        losses.append(train_step(x, y).item())
    return losses


def evaluate(model: Model, x: np.ndarray) -> np.ndarray:
    """Logits in eval mode (BatchNorm uses its running statistics)."""
    return model(Tensor(x)).numpy()


def evaluate_scheduled(model: Model, x: np.ndarray) -> tuple[np.ndarray, int]:
    """The same logits, scheduled first (`schedule_linear`) and run with `run_linear`; also the number of steps."""
    out = model(Tensor(x))
    linear = out.schedule_linear()
    run_linear(linear)
    return out.numpy(), len(linear.src)


def dump_raw(w: Tensor, path: str) -> Tensor:
    """Write `w` to a raw file as an int64 element count followed by its float32 values, through DISK tensors, and
    return the values read back from the file as a tensor of w's shape."""
    n = w.numel()
    disk = Tensor.empty(8 + 4 * n, dtype=dtypes.uint8, device=f"disk:{path}")
    disk[0:8].bitcast(dtypes.int64).assign([n])
    disk[8:].bitcast(dtypes.float32).assign(w.float().flatten())
    raw = Tensor(pathlib.Path(path))
    count = int.from_bytes(raw[0:8].data(), "little")
    return raw[8 : 8 + 4 * count].bitcast(dtypes.float32).to(Device.DEFAULT).reshape(w.shape)


def prefix_attention(block: TransformerBlock, x: Tensor, length: int) -> Tensor:
    """Causal self-attention of `block` over the first `length` tokens of x, with the length a bound Variable."""
    bs, seqlen, dim = x.shape
    n = Variable("n", 1, seqlen).bind(length)
    h = block.ln1(x)[:, :n]
    q, k, v = [t.reshape(bs, n, block.n_heads, dim // block.n_heads).transpose(1, 2) for t in block.qkv(h).chunk(3, 2)]
    return q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2)


def scale_kernel(out, x, t):  # noqa: ANN001, ANN201  (a custom kernel in UOps: out = x * t[0])
    out, x = out.flatten(), x.flatten()
    i = UOp.range(out.numel(), 0)
    return out[i].store(x[i] * t[0]).end(i).sink(arg=KernelInfo(name=f"scale_{out.numel()}"))


def scale_backward(grad, call):  # noqa: ANN001, ANN201  (its backward: d/dx = g * t, d/dt = sum(g * x))
    _, x, t = call.src[1:]
    g = Tensor(grad)
    return None, (g * Tensor(t)).uop, (g * Tensor(x)).sum().reshape(1).uop


def calibrate(logits: np.ndarray, labels: np.ndarray, steps: int = 25, lr: float = 0.05) -> float:
    """Fit an inverse temperature t on held-out logits: `t` is a plain `Tensor([1.0])` that Adam trains (every tensor
    is a parameter), and the logits are scaled by the custom kernel above (backward through its grad_fxn)."""
    x, y = Tensor(logits), Tensor(labels)
    t = Tensor([1.0])
    opt = nn.optim.Adam([t], lr=lr)
    for _ in range(steps):
        with Tensor.train():
            opt.zero_grad()
            scaled = Tensor.empty(*x.shape).custom_kernel(x, t, fxn=scale_kernel, grad_fxn=scale_backward)[0]
            scaled.sparse_categorical_crossentropy(y).backward()
            opt.step()
    return float(t.item())


def evaluate_pruned(model: Model, x: np.ndarray, batches: int = 4) -> tuple[np.ndarray, int, int]:
    """Eval logits from a `TinyJit(prune=True)` replay, batch by batch, and the kernels each capture replays
    (`captured.linear.src`) with and without pruning (the pruned JIT leaves out what does not depend on the input)."""
    pruned = TinyJit(lambda b: model(b).realize(), prune=True)
    plain = TinyJit(lambda b: model(b).realize())
    outs = []
    for part in np.split(x, batches):
        outs.append(pruned(Tensor(part)).numpy())
        plain(Tensor(part))
    assert pruned.captured is not None and plain.captured is not None
    return np.concatenate(outs), len(pruned.captured.linear.src), len(plain.captured.linear.src)


def shape_error(model: Model) -> str:
    """tinygrad code catches a matmul of the wrong shape as a RuntimeError; so does this."""
    try:
        model.head(Tensor.ones(2, 3))
    except RuntimeError as e:
        return str(e)
    return ""


def tinygrad_extras(model: Model, x_eval: np.ndarray, y_eval: np.ndarray, logits: np.ndarray) -> dict:
    """The rest of the surface: plain-tensor parameters, custom kernels with a backward, a pruned JIT, errors."""
    temperature = calibrate(logits, y_eval)
    logits_pruned, pruned_kernels, plain_kernels = evaluate_pruned(model, x_eval)
    return {
        "temperature": temperature,
        "logits_pruned": logits_pruned,
        "pruned_kernels": pruned_kernels,
        "plain_kernels": plain_kernels,
        "shape_error": shape_error(model),
        "y_eval": y_eval,
    }


def main(steps: int = 12, batch: int = 32, seed: int = 0, verbose: bool = True) -> dict:
    Tensor.manual_seed(seed)
    model = Model()
    if verbose:
        print(f"device {Device.DEFAULT}, {sum(p.numel() for p in get_parameters(model))} parameters")
    losses = train(model, steps, batch, seed=seed)
    if verbose:
        print("losses:", " ".join(f"{v:.3f}" for v in losses))

    with tempfile.TemporaryDirectory() as tmp:
        fn = os.path.join(tmp, "model.safetensors")
        safe_save(get_state_dict(model), fn)
        model2 = Model()
        load_state_dict(model2, safe_load(fn))
        x_eval, y_eval = get_data(64, seed=seed + 1)
        GlobalCounters.reset()
        logits = evaluate(model, x_eval)
        eval_kernels = GlobalCounters.kernel_count
        logits2 = evaluate(model2, x_eval)
        logits3, eval_steps = evaluate_scheduled(model, x_eval)
        head_raw = dump_raw(model.head.weight, os.path.join(tmp, "head.bin")).numpy()
    tokens = model.stem(Tensor(x_eval[:2])) + model.pos(Tensor.arange(4))
    prefixes = [prefix_attention(model.block, tokens, p).numpy() for p in range(1, 5)]
    if verbose:
        print(f"reloaded model matches: {np.array_equal(logits, logits2)}; eval ran {eval_kernels} kernels")
        print(f"eval accuracy on 64 images: {(logits.argmax(-1) == y_eval).mean() * 100:.1f}%")
    extras = tinygrad_extras(model, x_eval, y_eval, logits)
    if verbose:
        print(f"temperature {1 / extras['temperature']:.3f}; pruned JIT replays {extras['pruned_kernels']} kernels")
    return {
        **extras,
        "model": model,
        "losses": losses,
        "x_eval": x_eval,
        "logits": logits,
        "logits_reloaded": logits2,
        "eval_kernels": eval_kernels,
        "logits_scheduled": logits3,
        "eval_steps": eval_steps,
        "head_raw": head_raw,
        "tokens": tokens.numpy(),
        "prefix_attention": prefixes,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="tinygrad-style reference model on xgrad")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    main(args.steps, args.batch)
