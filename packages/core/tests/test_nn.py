"""xgrad.nn layers against torch.nn with the same weights: forward, backward, and BatchNorm's running statistics."""

from __future__ import annotations

import doctest
import importlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from xgrad import dtypes, nn
from xgrad.device import Device
from xgrad.errors import DTypeError, ShapeError, XgradError
from xgrad.helpers import Context
from xgrad.tensor import Tensor

RNG = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _same_inputs_in_any_order() -> None:
    """Each test draws the same inputs whichever worker runs it, after whichever tests."""
    global RNG
    RNG = np.random.default_rng(0)
    torch.manual_seed(0)


def _rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _to_xgrad(t: torch.Tensor | None, device: str) -> Tensor | None:
    return None if t is None else Tensor(t.detach().numpy().copy(), device=device).is_param_()


def _copy_weights(
    layer: Any, module: torch.nn.Module, device: str, names: tuple[str, ...] = ("weight", "bias")
) -> None:
    for name in names:
        setattr(layer, name, _to_xgrad(getattr(module, name), device))


def _close(got: Tensor | None, want: torch.Tensor | None, atol: float = 1e-4, rtol: float = 1e-4) -> None:
    assert got is not None and want is not None
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), atol=atol, rtol=rtol)


def _forward_backward(
    layer: Callable[[Tensor], Tensor], module: Callable[[torch.Tensor], torch.Tensor], x_np: np.ndarray, device: str
) -> tuple[Tensor, Tensor, torch.Tensor, torch.Tensor]:
    """Run both on the same input, backpropagate the same random output gradient; returns (out, x) for each."""
    x = Tensor(x_np, device=device).is_param_()
    tx = torch.tensor(x_np, requires_grad=True)
    out, tout = layer(x), module(tx)
    g = _rand(*tout.shape)
    (out * Tensor(g, device=device)).sum().backward()
    (tout * torch.tensor(g)).sum().backward()
    _realize_with_grads(out, x, layer)
    return out, x, tout, tx


def _realize_with_grads(*objs: Any) -> None:
    """Realize the outputs and every gradient in one schedule (fewer, shared kernels than one realize per check)."""
    found: list[Tensor] = []
    for obj in objs:
        for t in [obj] if isinstance(obj, Tensor) else list(getattr(obj, "__dict__", {}).values()):
            if isinstance(t, Tensor):
                found += [t] if t.grad is None else [t, t.grad]
    Tensor.realize(*found)


# ---- Linear ----
def test_linear_matches_torch_forward_backward(xgrad_device: str) -> None:
    module = torch.nn.Linear(5, 3)
    layer = nn.Linear(5, 3)
    _copy_weights(layer, module, xgrad_device)
    out, x, tout, tx = _forward_backward(layer, module, _rand(4, 5), xgrad_device)
    _close(out, tout)
    _close(x.grad, tx.grad)
    _close(layer.weight.grad, module.weight.grad)
    _close(layer.bias.grad if layer.bias is not None else None, module.bias.grad)


def test_linear_init_is_uniform_within_bound_and_marked_param() -> None:
    layer = nn.Linear(16, 8, bias=False)
    w = layer.weight.numpy()
    assert w.shape == (8, 16) and layer.bias is None and layer.weight.is_param
    assert np.abs(w).max() <= 0.25 and np.abs(w).max() > 0.15 and w.std() > 0.1


def test_linear_wrong_input_size_raises_shape_error() -> None:
    with pytest.raises(ShapeError, match="Linear expects"):
        nn.Linear(5, 3)(Tensor.ones(2, 4))


# ---- convolutions ----
CONV2D_CASES = [
    dict(kernel_size=3),
    dict(kernel_size=(2, 3), stride=2, padding=1, bias=False),
    dict(kernel_size=3, stride=(1, 2), padding=(2, 1), dilation=2),
    dict(kernel_size=2, groups=2, padding=(1, 0, 0, 1)),
    dict(kernel_size=3, padding="same", dilation=(1, 2)),
    dict(kernel_size=(2, 4), padding="same"),
    dict(kernel_size=1, padding="valid", bias=False),
]


def _torch_conv_padding(kw: dict[str, Any]) -> tuple[dict[str, Any], Callable[[torch.Tensor], torch.Tensor]]:
    """torch.nn.Conv2d cannot take 4-number padding: pad the input first instead."""
    pad = kw.get("padding", 0)
    if isinstance(pad, tuple) and len(pad) == 4:
        return {**kw, "padding": 0}, lambda t: torch.nn.functional.pad(t, pad)
    return kw, lambda t: t


@pytest.mark.parametrize("kw", CONV2D_CASES, ids=[str(i) for i in range(len(CONV2D_CASES))])
@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")
def test_conv2d_matches_torch_forward_backward(xgrad_device: str, kw: dict[str, Any]) -> None:
    tkw, tpad = _torch_conv_padding(kw)
    module = torch.nn.Conv2d(4, 6, **tkw)
    layer = nn.Conv2d(4, 6, **kw)
    _copy_weights(layer, module, xgrad_device)
    out, x, tout, tx = _forward_backward(layer, lambda t: module(tpad(t)), _rand(2, 4, 7, 6), xgrad_device)
    _close(out, tout)
    _close(x.grad, tx.grad)
    _close(layer.weight.grad, module.weight.grad)
    if module.bias is not None:
        _close(layer.bias.grad if layer.bias is not None else None, module.bias.grad)


def test_conv1d_matches_torch_forward_backward(xgrad_device: str) -> None:
    module = torch.nn.Conv1d(3, 4, 3, stride=2, padding=1)
    layer = nn.Conv1d(3, 4, 3, stride=2, padding=1)
    assert layer.weight.shape == (4, 3, 3)
    _copy_weights(layer, module, xgrad_device)
    out, x, tout, tx = _forward_backward(layer, module, _rand(2, 3, 9), xgrad_device)
    _close(out, tout)
    _close(x.grad, tx.grad)
    _close(layer.weight.grad, module.weight.grad)


def test_conv3d_through_conv2d_matches_torch(xgrad_device: str) -> None:
    module = torch.nn.Conv3d(2, 3, (2, 2, 3), padding=1)
    layer = nn.Conv2d(2, 3, (2, 2, 3), padding=1)
    _copy_weights(layer, module, xgrad_device)
    out, x, tout, tx = _forward_backward(layer, module, _rand(1, 2, 3, 4, 4), xgrad_device)
    _close(out, tout)
    _close(x.grad, tx.grad)


CONV_T_CASES = [
    dict(kernel_size=3),
    dict(kernel_size=3, stride=2, padding=1, output_padding=1),
    dict(kernel_size=(2, 3), stride=(2, 1), dilation=2, bias=False),
    dict(kernel_size=2, stride=2, groups=2),
]


@pytest.mark.parametrize("kw", CONV_T_CASES, ids=[str(i) for i in range(len(CONV_T_CASES))])
def test_conv_transpose2d_matches_torch_forward_backward(xgrad_device: str, kw: dict[str, Any]) -> None:
    module = torch.nn.ConvTranspose2d(4, 6, **kw)
    layer = nn.ConvTranspose2d(4, 6, **kw)
    assert layer.weight.shape == tuple(module.weight.shape)
    _copy_weights(layer, module, xgrad_device)
    out, x, tout, tx = _forward_backward(layer, module, _rand(2, 4, 4, 3), xgrad_device)
    _close(out, tout)
    _close(x.grad, tx.grad)
    _close(layer.weight.grad, module.weight.grad)


def test_conv_transpose1d_matches_torch_forward_backward(xgrad_device: str) -> None:
    module = torch.nn.ConvTranspose1d(2, 3, 3, stride=2, padding=1, output_padding=1)
    layer = nn.ConvTranspose1d(2, 3, 3, stride=2, padding=1, output_padding=1)
    _copy_weights(layer, module, xgrad_device)
    out, x, tout, tx = _forward_backward(layer, module, _rand(2, 2, 5), xgrad_device)
    _close(out, tout)
    _close(x.grad, tx.grad)
    _close(layer.weight.grad, module.weight.grad)


def test_conv2d_init_and_param_flags() -> None:
    layer = nn.Conv2d(4, 8, 3, groups=2)
    assert layer.weight.shape == (8, 2, 3, 3) and layer.weight.is_param and layer.bias is not None
    assert np.abs(layer.weight.numpy()).max() <= 1 / np.sqrt(2 * 9)


def test_conv2d_errors_say_what_to_fix() -> None:
    with pytest.raises(ShapeError, match="multiples of groups"):
        nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(XgradError, match="stride 1"):
        nn.Conv2d(3, 4, 3, stride=2, padding="same")
    with pytest.raises(XgradError, match="not a padding string"):
        nn.Conv2d(3, 4, 3, padding="full")
    with pytest.raises(ShapeError):
        nn.Conv2d(3, 4, 3)(Tensor.ones(1, 2, 5, 5))


# ---- normalisation ----
def _batchnorm_pair(device: str, affine: bool = True, track: bool = True) -> tuple[nn.BatchNorm, torch.nn.Module]:
    module = torch.nn.BatchNorm2d(3, momentum=0.2, affine=affine, track_running_stats=track)
    if affine:
        with torch.no_grad():
            module.weight.uniform_(0.5, 1.5)
            module.bias.uniform_(-0.5, 0.5)
    layer = nn.BatchNorm2d(3, momentum=0.2, affine=affine, track_running_stats=track)
    if affine:
        _copy_weights(layer, module, device)
    if track:
        layer.running_mean = Tensor(np.zeros(3, np.float32), device=device)
        layer.running_var = Tensor(np.ones(3, np.float32), device=device)
        layer.num_batches_tracked = Tensor(np.zeros(1, np.int32), device=device)
    return layer, module


def test_batchnorm_training_matches_torch_and_updates_running_stats(xgrad_device: str) -> None:
    layer, module = _batchnorm_pair(xgrad_device)
    module.train()
    for step in range(2):
        with Context(TRAINING=1):
            out, x, tout, tx = _forward_backward(layer, module, _rand(4, 3, 2, 2) * 2 + step, xgrad_device)
        assert layer.running_mean is not None and layer.running_var is not None
        assert layer.num_batches_tracked is not None
        Tensor.realize(layer.running_mean, layer.running_var, layer.num_batches_tracked)
        _close(out, tout)
        _close(x.grad, tx.grad)
        _close(layer.weight.grad if layer.weight is not None else None, module.weight.grad)
        _close(layer.bias.grad if layer.bias is not None else None, module.bias.grad)
        _close(layer.running_mean, module.running_mean)
        _close(layer.running_var, module.running_var)
        assert layer.num_batches_tracked.tolist() == [step + 1]
        layer.weight.grad = layer.bias.grad = None  # type: ignore[union-attr]
        module.zero_grad()


def test_batchnorm_eval_uses_running_stats(xgrad_device: str) -> None:
    layer, module = _batchnorm_pair(xgrad_device)
    stats = (_rand(3) * 0.1, np.abs(_rand(3)) + 0.5)
    module.running_mean.copy_(torch.tensor(stats[0]))
    module.running_var.copy_(torch.tensor(stats[1]))
    layer.running_mean = Tensor(stats[0], device=xgrad_device)
    layer.running_var = Tensor(stats[1], device=xgrad_device)
    module.eval()
    out, x, tout, tx = _forward_backward(layer, module, _rand(2, 3, 2, 3), xgrad_device)
    _close(out, tout)
    _close(x.grad, tx.grad)


@pytest.mark.parametrize("affine,track", [(False, True), (True, False)])
def test_batchnorm_options_match_torch(xgrad_device: str, affine: bool, track: bool) -> None:
    layer, module = _batchnorm_pair(xgrad_device, affine, track)
    assert (layer.weight is None) is not affine and (layer.running_mean is None) is not track
    module.train()
    with Context(TRAINING=1):
        out, x, tout, tx = _forward_backward(layer, module, _rand(3, 3, 2, 2), xgrad_device)
    _close(out, tout)
    _close(x.grad, tx.grad)
    if not track:  # no running statistics: eval mode normalises with the batch's too, as torch does
        module.eval()
        x_np = _rand(2, 3, 1, 2)
        _close(layer(Tensor(x_np, device=xgrad_device)), module(torch.tensor(x_np)))


def test_batchnorm_running_stats_are_not_params() -> None:
    bn = nn.BatchNorm(4)
    assert bn.weight is not None and bn.weight.is_param and bn.bias is not None and bn.bias.is_param
    for t in (bn.running_mean, bn.running_var, bn.num_batches_tracked):
        assert t is not None and not t.is_param
    assert nn.BatchNorm2d is nn.BatchNorm and nn.BatchNorm3d is nn.BatchNorm


def test_norm_layers_of_the_same_size_keep_separate_buffers() -> None:
    bn1, bn2, ln = nn.BatchNorm(3), nn.BatchNorm(3), nn.LayerNorm(3)
    tensors = [bn1.weight, bn1.bias, bn1.running_mean, bn1.running_var, bn2.weight, bn2.running_mean, ln.weight]
    assert all(t is not None for t in tensors)
    Tensor.realize(*tensors)  # type: ignore[arg-type]
    assert bn1.running_mean is not None and bn2.running_mean is not None and bn2.bias is not None
    bn1.running_mean.assign(Tensor([1.0, 2.0, 3.0])).realize()
    assert bn2.running_mean.tolist() == [0.0, 0.0, 0.0] and bn2.bias.tolist() == [0.0, 0.0, 0.0]


def test_batchnorm_trains_with_adam_like_torch() -> None:
    from xgrad.nn.optim import Adam
    from xgrad.nn.state import get_parameters

    lin, bn = nn.Linear(4, 3, bias=False), nn.BatchNorm(3)
    tlin, tbn = torch.nn.Linear(4, 3, bias=False), torch.nn.BatchNorm1d(3)
    _copy_weights(lin, tlin, Device.DEFAULT, ("weight",))
    opt = Adam(get_parameters([lin, bn]), lr=0.1)
    topt = torch.optim.Adam([*tlin.parameters(), *tbn.parameters()], lr=0.1)
    for _ in range(3):
        x_np, g_np = _rand(8, 4), _rand(8, 3)
        with Context(TRAINING=1):
            opt.zero_grad()
            loss = (bn(lin(Tensor(x_np))) * Tensor(g_np)).sum().backward()
            Tensor.realize(loss, *opt.schedule_step())
        topt.zero_grad()
        tloss = (tbn(tlin(torch.tensor(x_np))) * torch.tensor(g_np)).sum()
        tloss.backward()
        topt.step()
        _close(loss, tloss)
    _close(lin.weight, tlin.weight)
    _close(bn.weight, tbn.weight)
    _close(bn.running_mean, tbn.running_mean)
    _close(bn.running_var, tbn.running_var)


def test_batchnorm_wrong_channels_raises_shape_error() -> None:
    with pytest.raises(ShapeError, match="4 channels"):
        nn.BatchNorm(4)(Tensor.ones(2, 3, 5))


def test_groupnorm_matches_torch_forward_backward(xgrad_device: str) -> None:
    module = torch.nn.GroupNorm(2, 4)
    with torch.no_grad():
        module.weight.uniform_(0.5, 1.5)
        module.bias.uniform_(-0.5, 0.5)
    layer = nn.GroupNorm(2, 4)
    _copy_weights(layer, module, xgrad_device)
    out, x, tout, tx = _forward_backward(layer, module, _rand(2, 4, 3, 2), xgrad_device)
    _close(out, tout)
    _close(x.grad, tx.grad)
    _close(layer.weight.grad if layer.weight is not None else None, module.weight.grad)


def test_instancenorm_matches_torch_forward_backward(xgrad_device: str) -> None:
    module = torch.nn.InstanceNorm2d(3, affine=True)
    with torch.no_grad():
        module.weight.uniform_(0.5, 1.5)
    layer = nn.InstanceNorm(3)
    _copy_weights(layer, module, xgrad_device)
    out, x, tout, tx = _forward_backward(layer, module, _rand(2, 3, 3, 2), xgrad_device)
    _close(out, tout)
    _close(x.grad, tx.grad)
    _close(layer.bias.grad if layer.bias is not None else None, module.bias.grad)


@pytest.mark.parametrize("shape,affine", [(5, True), ((3, 5), True), (5, False)])
def test_layernorm_matches_torch_forward_backward(xgrad_device: str, shape: Any, affine: bool) -> None:
    module = torch.nn.LayerNorm(shape, elementwise_affine=affine)
    layer = nn.LayerNorm(shape, elementwise_affine=affine)
    if affine:
        with torch.no_grad():
            module.weight.uniform_(0.5, 1.5)
        _copy_weights(layer, module, xgrad_device)
    out, x, tout, tx = _forward_backward(layer, module, _rand(2, 3, 5), xgrad_device)
    _close(out, tout)
    _close(x.grad, tx.grad)
    if affine:
        _close(layer.weight.grad if layer.weight is not None else None, module.weight.grad)


def test_layernorm2d_normalises_channels(xgrad_device: str) -> None:
    module = torch.nn.LayerNorm(3)
    with torch.no_grad():
        module.bias.uniform_(-0.5, 0.5)
    layer = nn.LayerNorm2d(3)
    _copy_weights(layer, module, xgrad_device)
    out, x, tout, tx = _forward_backward(
        layer, lambda t: module(t.permute(0, 2, 3, 1)).permute(0, 3, 1, 2), _rand(2, 3, 2, 2), xgrad_device
    )
    _close(out, tout)
    _close(x.grad, tx.grad)


def test_layernorm_wrong_shape_raises_shape_error() -> None:
    with pytest.raises(ShapeError, match="trailing shape"):
        nn.LayerNorm((2, 3))(Tensor.ones(3, 2))


def test_rmsnorm_matches_torch_forward_backward(xgrad_device: str) -> None:
    module = torch.nn.RMSNorm(6, eps=1e-6)
    with torch.no_grad():
        module.weight.uniform_(0.5, 1.5)
    layer = nn.RMSNorm(6)
    _copy_weights(layer, module, xgrad_device, ("weight",))
    out, x, tout, tx = _forward_backward(layer, module, _rand(3, 6), xgrad_device)
    _close(out, tout)
    _close(x.grad, tx.grad)
    _close(layer.weight.grad if layer.weight is not None else None, module.weight.grad)


def test_rmsnorm_half_input_computes_in_float32_and_returns_half() -> None:
    layer = nn.RMSNorm(4, elementwise_affine=False)
    x = np.array([[1e3, 2e3, 3e3, 4e3]], dtype=np.float16)  # squares overflow float16
    out = layer(Tensor(x))
    assert out.dtype == dtypes.float16
    want = x.astype(np.float32) / np.sqrt((x.astype(np.float32) ** 2).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(out.numpy().astype(np.float32), want, rtol=2e-3)


# ---- Embedding, LSTMCell ----
def test_embedding_matches_torch_forward_backward(xgrad_device: str) -> None:
    module = torch.nn.Embedding(7, 3)
    layer = nn.Embedding(7, 3)
    _copy_weights(layer, module, xgrad_device, ("weight",))
    idx = np.array([[0, 6, 2], [2, 2, 5]], dtype=np.int32)
    out, tout = layer(Tensor(idx, device=xgrad_device)), module(torch.tensor(idx, dtype=torch.long))
    g = _rand(2, 3, 3)
    (out * Tensor(g, device=xgrad_device)).sum().backward()
    (tout * torch.tensor(g)).sum().backward()
    _realize_with_grads(out, layer)
    _close(out, tout)
    _close(layer.weight.grad, module.weight.grad)


def test_embedding_float_indices_raise_dtype_error() -> None:
    with pytest.raises(DTypeError, match="integers"):
        nn.Embedding(4, 2)(Tensor([1.0]))


def test_lstmcell_matches_torch_forward_backward(xgrad_device: str) -> None:
    module = torch.nn.LSTMCell(3, 4)
    layer = nn.LSTMCell(3, 4)
    _copy_weights(layer, module, xgrad_device, ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
    x_np, h_np, c_np = _rand(2, 3), _rand(2, 4), _rand(2, 4)
    x = Tensor(x_np, device=xgrad_device).is_param_()
    h, c = layer(x, (Tensor(h_np, device=xgrad_device), Tensor(c_np, device=xgrad_device)))
    tx = torch.tensor(x_np, requires_grad=True)
    th, tc = module(tx, (torch.tensor(h_np), torch.tensor(c_np)))
    (h.sum() + (c * 2).sum()).backward()
    (th.sum() + (tc * 2).sum()).backward()
    _realize_with_grads(h, c, x, layer)
    _close(h, th)
    _close(c, tc)
    _close(x.grad, tx.grad)
    _close(layer.weight_hh.grad, module.weight_hh.grad)
    _close(layer.bias_ih.grad if layer.bias_ih is not None else None, module.bias_ih.grad)


def test_lstmcell_starts_from_zero_state_and_takes_stacked_state() -> None:
    module = torch.nn.LSTMCell(3, 2, bias=False)
    layer = nn.LSTMCell(3, 2, bias=False)
    _copy_weights(layer, module, Device.DEFAULT, ("weight_ih", "weight_hh"))
    x_np = _rand(4, 3)
    h, c = layer(Tensor(x_np))
    th, tc = module(torch.tensor(x_np))
    _close(h, th)
    _close(c, tc)
    h2, c2 = layer(Tensor(x_np), Tensor(np.stack([h.numpy(), c.numpy()])))
    th2, tc2 = module(torch.tensor(x_np), (th, tc))
    _close(h2, th2)
    _close(c2, tc2)


# ---- docs ----
@pytest.mark.parametrize("name", ["xgrad.nn", "xgrad.nn.conv", "xgrad.nn.norm", "xgrad.nn.layers"])
def test_docstring_examples_run(name: str) -> None:
    result = doctest.testmod(
        importlib.import_module(name), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False
    )
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples failed in {name}"
