"""examples/tinygrad_reference.py (a tinygrad-style script with only its imports changed) runs on xgrad: it trains,
its loss goes down, its safetensors round trip reloads an identical model, and its eval-mode forward pass matches a
torch re-implementation of the same model loaded with the same weights."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from torch_compare import load_example

from xgrad.device import Device
from xgrad.helpers import Context

torch = pytest.importorskip("torch")
F = torch.nn.functional

STEPS = 10
BATCH = 16


@pytest.fixture(scope="module")
def run() -> dict[str, Any]:
    if "CPU" not in Device.get_available_devices(runs_kernels_only=True):
        pytest.skip("the CPU device is not available")
    with Context(DEV="CPU"):
        return dict(load_example("tinygrad_reference").main(steps=STEPS, batch=BATCH, verbose=False))


def _torch_forward(w: dict[str, torch.Tensor], x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The script's Model in eval mode, written with torch.nn.functional."""

    def bn(h: torch.Tensor, p: str) -> torch.Tensor:
        mean, var = w[f"{p}.running_mean"], w[f"{p}.running_var"]
        return F.batch_norm(h, mean, var, w[f"{p}.weight"], w[f"{p}.bias"], training=False, eps=1e-5)

    def lin(h: torch.Tensor, p: str) -> torch.Tensor:
        return F.linear(h, w[f"{p}.weight"], w[f"{p}.bias"])

    def ln(h: torch.Tensor, p: str) -> torch.Tensor:
        return F.layer_norm(h, h.shape[-1:], w[f"{p}.weight"], w[f"{p}.bias"], eps=1e-5)

    h = F.max_pool2d(F.relu(bn(F.conv2d(x, w["stem.c1.weight"], w["stem.c1.bias"], padding=1), "stem.bn1")), 2)
    h = F.max_pool2d(F.relu(bn(F.conv2d(h, w["stem.c2.weight"], w["stem.c2.bias"], padding=1), "stem.bn2")), 2)
    h = h.flatten(2).transpose(1, 2) + w["pos.weight"]
    bs, seqlen, dim = h.shape
    q, k, v = lin(ln(h, "block.ln1"), "block.qkv").chunk(3, dim=2)
    q, k, v = (t.reshape(bs, seqlen, n_heads, dim // n_heads).transpose(1, 2) for t in (q, k, v))
    att = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(bs, seqlen, dim)
    h = h + lin(att, "block.proj")
    h = h + lin(F.gelu(lin(ln(h, "block.ln2"), "block.fc1"), approximate="tanh"), "block.fc2")
    return lin(ln(h, "ln_f").mean(1), "head")


def test_reference_script_loss_decreases(run: dict[str, Any]) -> None:
    losses = run["losses"]
    assert len(losses) == STEPS and all(np.isfinite(losses))
    assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.05, f"loss did not go down: {losses}"


def test_reference_script_reloaded_weights_give_identical_logits(run: dict[str, Any]) -> None:
    np.testing.assert_array_equal(run["logits"], run["logits_reloaded"])


def test_reference_script_counts_its_eval_kernels(run: dict[str, Any]) -> None:
    assert run["eval_kernels"] >= 1  # GlobalCounters.reset() then kernel_count, as tinygrad scripts read it


def test_reference_script_forward_matches_torch_with_same_weights(run: dict[str, Any]) -> None:
    from xgrad.nn.state import get_state_dict

    weights = {k: torch.from_numpy(v.numpy().copy()) for k, v in get_state_dict(run["model"]).items()}
    # BatchNorm moved its running statistics during training: eval mode must use them, not the initial 0/1
    assert not torch.allclose(weights["stem.bn1.running_mean"], torch.zeros(8))
    expected = _torch_forward(weights, torch.from_numpy(run["x_eval"]), run["model"].block.n_heads).numpy()
    np.testing.assert_allclose(run["logits"], expected, rtol=1e-4, atol=1e-4)


def test_reference_script_schedule_linear_gives_the_same_logits(run: dict[str, Any]) -> None:
    assert run["eval_steps"] >= 1
    np.testing.assert_array_equal(run["logits_scheduled"], run["logits"])


def test_reference_script_raw_file_round_trip(run: dict[str, Any]) -> None:
    # written through DISK bitcast views, read back with Tensor(pathlib.Path(...)): the exact float32 values
    np.testing.assert_array_equal(run["head_raw"], run["model"].head.weight.numpy())


def test_reference_script_symbolic_prefix_attention_matches_torch(run: dict[str, Any]) -> None:
    from xgrad.nn.state import get_state_dict

    w = {k: torch.from_numpy(v.numpy().copy()) for k, v in get_state_dict(run["model"]).items()}
    n_heads = run["model"].block.n_heads
    x = torch.from_numpy(run["tokens"])
    bs, _, dim = x.shape
    h = F.layer_norm(x, (dim,), w["block.ln1.weight"], w["block.ln1.bias"], eps=1e-5)
    q, k, v = F.linear(h, w["block.qkv.weight"], w["block.qkv.bias"]).chunk(3, dim=2)
    for length, got in enumerate(run["prefix_attention"], start=1):
        qs, ks, vs = (t[:, :length].reshape(bs, length, n_heads, dim // n_heads).transpose(1, 2) for t in (q, k, v))
        want = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True).transpose(1, 2).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"prefix of {length} tokens")


def test_reference_script_calibration_matches_torch(run: dict[str, Any]) -> None:
    # a plain Tensor([1.0]) trained by Adam through a custom kernel with a grad_fxn, against torch's Adam on x * t
    logits, labels = run["logits"], run["y_eval"]
    t = torch.tensor([1.0], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([t], lr=0.05)
    x, y = torch.from_numpy(logits.astype(np.float64)), torch.from_numpy(labels.astype(np.int64))
    for _ in range(25):
        opt.zero_grad()
        F.cross_entropy(x * t, y).backward()
        opt.step()
    np.testing.assert_allclose(run["temperature"], t.item(), rtol=1e-4)


def test_reference_script_pruned_jit_gives_the_same_logits(run: dict[str, Any]) -> None:
    np.testing.assert_allclose(run["logits_pruned"], run["logits"], rtol=1e-5, atol=1e-5)
    assert run["pruned_kernels"] < run["plain_kernels"]  # the input-free kernels ran once, at the capture


def test_reference_script_catches_a_shape_error_as_runtime_error(run: dict[str, Any]) -> None:
    assert "(2, 3)" in run["shape_error"]
