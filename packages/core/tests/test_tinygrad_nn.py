"""tinygrad compatibility, nn: GroupNorm and InstanceNorm with tinygrad's attribute names and with weights set after
construction (how tinygrad code loads them), conv padding strings as tinygrad's layers take them, and the error types
tinygrad raises for bad ones. Values are checked against torch (CPU)."""

from __future__ import annotations

import numpy as np
import pytest

from xgrad import Tensor, nn
from xgrad.nn.state import get_state_dict, load_state_dict

torch = pytest.importorskip("torch")


def _affine(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)


@pytest.mark.parametrize("shape", [(2, 6, 5, 4), (3, 6, 7), (2, 6, 2, 3, 2)])
def test_groupnorm_weights_set_after_construction_like_torch(shape: tuple[int, ...]) -> None:
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32) * 3 + 1
    w, b = _affine(6, 1)
    m = nn.GroupNorm(3, 6, eps=1e-4)
    assert (m.num_groups, m.num_channels, m.eps) == (3, 6, 1e-4)
    m.weight, m.bias = Tensor(w), Tensor(b)
    ref = torch.nn.GroupNorm(3, 6, eps=1e-4)
    ref.weight.data, ref.bias.data = torch.tensor(w), torch.tensor(b)
    np.testing.assert_allclose(m(Tensor(x)).numpy(), ref(torch.tensor(x)).detach().numpy(), rtol=1e-4, atol=1e-4)


def test_groupnorm_without_affine_and_its_state_dict() -> None:
    x = np.random.default_rng(2).standard_normal((2, 4, 3)).astype(np.float32)
    m = nn.GroupNorm(2, 4, affine=False)
    assert m.weight is None and m.bias is None and get_state_dict(m) == {}
    want = torch.nn.functional.group_norm(torch.tensor(x), 2)
    np.testing.assert_allclose(m(Tensor(x)).numpy(), want.numpy(), rtol=1e-4, atol=1e-5)
    assert sorted(get_state_dict(nn.GroupNorm(2, 4))) == ["bias", "weight"]


@pytest.mark.parametrize(("shape", "ref_cls"), [((2, 5, 6, 7), "InstanceNorm2d"), ((3, 5, 9), "InstanceNorm1d")])
def test_instancenorm_loaded_weights_like_torch(shape: tuple[int, ...], ref_cls: str) -> None:
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32) * 2 - 1
    w, b = _affine(5, 4)
    m = nn.InstanceNorm(5)
    assert (m.num_features, m.eps) == (5, 1e-5)
    load_state_dict(m, {"weight": Tensor(w), "bias": Tensor(b)})
    ref = getattr(torch.nn, ref_cls)(5, affine=True)
    ref.weight.data, ref.bias.data = torch.tensor(w), torch.tensor(b)
    np.testing.assert_allclose(m(Tensor(x)).numpy(), ref(torch.tensor(x)).detach().numpy(), rtol=1e-4, atol=1e-4)


def test_instancenorm_without_affine() -> None:
    x = np.random.default_rng(5).standard_normal((2, 3, 8)).astype(np.float32)
    m = nn.InstanceNorm(3, affine=False)
    assert m.weight is None and m.bias is None
    want = torch.nn.functional.instance_norm(torch.tensor(x))
    np.testing.assert_allclose(m(Tensor(x)).numpy(), want.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("kernel", "dilation"), [(3, 1), (4, 1), (2, 3), ((2, 5), 1)])
def test_conv2d_layer_padding_same_like_torch(kernel: int | tuple[int, int], dilation: int) -> None:
    x = np.random.default_rng(6).standard_normal((2, 3, 9, 8)).astype(np.float32)
    for spelling in ("same", "SAME", "Same"):
        layer = nn.Conv2d(3, 4, kernel, padding=spelling, dilation=dilation)
        ref = torch.nn.Conv2d(3, 4, kernel, padding="same", dilation=dilation)
        ref.weight.data, ref.bias.data = torch.tensor(layer.weight.numpy()), torch.tensor(layer.bias.numpy())
        want = ref(torch.tensor(x)).detach().numpy()
        got = layer(Tensor(x)).numpy()
        assert got.shape == x.shape[:1] + (4,) + x.shape[2:]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_conv1d_layer_padding_same_like_torch() -> None:
    x = np.random.default_rng(7).standard_normal((1, 2, 11)).astype(np.float32)
    layer = nn.Conv1d(2, 3, 4, padding="same")
    ref = torch.nn.Conv1d(2, 3, 4, padding="same")
    ref.weight.data, ref.bias.data = torch.tensor(layer.weight.numpy()), torch.tensor(layer.bias.numpy())
    np.testing.assert_allclose(layer(Tensor(x)).numpy(), ref(torch.tensor(x)).detach().numpy(), rtol=1e-4, atol=1e-4)


def test_padding_same_with_stride_raises_value_error() -> None:
    # tinygrad's layer refuses it when built; so does Tensor.conv2d, whichever way the stride is given
    with pytest.raises(ValueError, match="stride 1"):
        nn.Conv2d(16, 32, kernel_size=2, stride=2, padding="same")
    with pytest.raises(ValueError, match="stride 1"):
        nn.Conv2d(16, 32, kernel_size=3, stride=(1, 2), padding="same")
    with pytest.raises(ValueError, match="stride 1"):
        Tensor.ones(1, 2, 7, 7).conv2d(Tensor.ones(3, 2, 3, 3), padding="same", stride=2)


def test_invalid_padding_strings_raise_value_error() -> None:
    with pytest.raises(ValueError, match="not a padding string"):
        nn.Conv2d(16, 32, kernel_size=2, stride=1, padding="not_same")
    with pytest.raises(RuntimeError):  # as torch's F.conv2d
        Tensor.ones(1, 2, 5, 5).conv2d(Tensor.ones(3, 2, 3, 3), padding="full")
    with pytest.raises(ValueError, match="only conv2d takes padding strings"):
        Tensor.ones(1, 2, 5, 5).conv_transpose2d(Tensor.ones(2, 3, 3, 3), padding="same")
    with pytest.raises(ValueError, match="only conv2d takes padding strings"):
        Tensor.ones(1, 2, 5, 5).max_pool2d(padding="same")
