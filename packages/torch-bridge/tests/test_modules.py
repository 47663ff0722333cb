"""torch.nn modules real models use run on `xgrad` with no op falling back to CPU, forward and backward equal to CPU."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

import xgrad_torch  # noqa: F401 (registers the device)

MODULES: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...], bool]] = {
    "conv_batchnorm_pool": (
        lambda: nn.Sequential(
            nn.Conv2d(3, 4, 3),
            nn.BatchNorm2d(4),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(4, 2),
        ),  # fmt: skip
        (4, 3, 10, 10),
        False,
    ),
    "linear_layernorm_gelu": (
        lambda: nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Dropout(0.0), nn.Linear(16, 4)),
        (5, 8),
        False,
    ),
    "conv_groupnorm_silu": (
        lambda: nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.SiLU()),
        (2, 2, 6, 6),
        False,
    ),  # fmt: skip
    "embedding": (lambda: nn.Sequential(nn.Embedding(10, 6), nn.Linear(6, 3)), (4, 5), True),
    "transformer_encoder_layer": (
        lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
        (2, 5, 8),
        False,
    ),
    # one step (torch's fused LSTM cell, as nn.LSTM calls it per time step on non-CPU devices): a multi-step
    # nn.LSTM is one lazy graph whose elementwise chain through time compiles for minutes without a kernel cache
    "lstm_cell": (lambda: nn.LSTMCell(4, 6), (2, 4), False),
    "conv_transpose_tanh_softmax": (
        lambda: nn.Sequential(nn.ConvTranspose2d(2, 3, 3, stride=2), nn.Tanh(), nn.Flatten(), nn.Softmax(-1)),
        (2, 2, 4, 4),
        False,
    ),
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_runs_on_xgrad_like_cpu_without_fallback(name: str) -> None:
    make, shape, int_input = MODULES[name]
    torch.manual_seed(0)
    cpu = make()
    dev = make()
    dev.load_state_dict(cpu.state_dict())
    dev = dev.to("xgrad")
    x = torch.randint(0, 10, shape) if int_input else torch.randn(shape)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a CPU fallback warns: it fails here
        outs = []
        for model, inp in ((cpu, x), (dev, x.to("xgrad"))):
            out = model(inp)
            out = out[0] if isinstance(out, tuple) else out
            out.float().square().mean().backward()
            outs.append(out.detach().cpu())
    np.testing.assert_allclose(outs[1].numpy(), outs[0].numpy(), atol=1e-5)
    for (pname, p), q in zip(cpu.named_parameters(), dev.parameters()):
        assert q.grad is not None and q.grad.device.type == "xgrad", pname
        np.testing.assert_allclose(q.grad.cpu().numpy(), p.grad.numpy(), atol=1e-5, err_msg=pname)


def test_batchnorm_running_statistics_and_eval_match_cpu() -> None:
    torch.manual_seed(0)
    cpu, dev = nn.BatchNorm2d(3), nn.BatchNorm2d(3).to("xgrad")
    for _ in range(3):
        x = torch.randn(4, 3, 5, 5) * 2 + 1
        cpu(x)
        dev(x.to("xgrad"))
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        np.testing.assert_allclose(
            getattr(dev, name).cpu().numpy(), getattr(cpu, name).numpy(), rtol=1e-5, err_msg=name
        )
    cpu.eval()
    dev.eval()
    x = torch.randn(2, 3, 5, 5)
    np.testing.assert_allclose(dev(x.to("xgrad")).detach().cpu().numpy(), cpu(x).detach().numpy(), atol=1e-5)
