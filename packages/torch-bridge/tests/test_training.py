"""End to end: the digits CNN in plain torch trains on `xgrad` as on CPU; state dicts save and load through CPU."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from digits import DigitsNet, train

import xgrad_torch  # noqa: F401 (registers the device)


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[list[float], float]]:
    pytest.importorskip("sklearn")
    return {device: train(device, epochs=2) for device in ("cpu", "xgrad")}  # 46 steps: 97.5% on CPU


def test_digits_cnn_reaches_95_percent_on_xgrad(runs: dict[str, tuple[list[float], float]]) -> None:
    losses, accuracy = runs["xgrad"]
    assert accuracy >= 0.95, f"test accuracy {accuracy:.3f} after {len(losses)} steps"


def test_digits_first_losses_equal_the_cpu_run(runs: dict[str, tuple[list[float], float]]) -> None:
    np.testing.assert_allclose(runs["xgrad"][0][:5], runs["cpu"][0][:5], atol=1e-4, rtol=0)
    assert abs(runs["xgrad"][1] - runs["cpu"][1]) < 0.03


def test_state_dict_save_load_through_cpu() -> None:
    torch.manual_seed(1)
    model = DigitsNet().to("xgrad")
    with torch.no_grad():
        model.fc.bias.add_(1.0)  # a lazy in-place write: saving must see it
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    loaded = torch.load(buf, map_location="cpu", weights_only=True)
    for name, value in model.state_dict().items():
        assert loaded[name].device.type == "cpu"
        assert torch.equal(loaded[name], value.cpu()), name
    fresh = DigitsNet().to("xgrad")
    fresh.load_state_dict(loaded)
    x = torch.randn(2, 1, 8, 8)
    assert torch.allclose(fresh(x.to("xgrad")).cpu(), model(x.to("xgrad")).cpu(), atol=1e-6)
    buf.seek(0)
    on_device = torch.load(buf, weights_only=True)  # no map_location: back where they were saved from
    assert all(v.device.type == "xgrad" for v in on_device.values())
    assert torch.equal(on_device["fc.bias"].cpu(), loaded["fc.bias"])


def test_parameter_buffer_survives_parameter_detach_data_and_module_to() -> None:
    layer = torch.nn.Linear(3, 2).to("xgrad")
    w = layer.weight
    assert isinstance(w, torch.nn.Parameter) and w.device.type == "xgrad"
    before = w.detach().cpu()
    w.data.mul_(2)  # through .data
    assert torch.equal(w.detach().cpu(), before * 2)
    d = w.detach()
    d.add_(1)  # detach shares the storage
    assert torch.equal(w.detach().cpu(), before * 2 + 1)
    back = layer.to("cpu").to("xgrad")
    assert torch.equal(back.weight.detach().cpu(), before * 2 + 1)
