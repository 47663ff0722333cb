"""Laziness: torch ops on `xgrad` build xgrad graphs that fuse as native xgrad's do (kernel counts)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 (torch's own spelling)

import xgrad_torch
from xgrad import GlobalCounters, Tensor


def _kernels(fn: object) -> int:
    xgrad_torch.storage.flush()
    GlobalCounters.reset()
    fn()  # type: ignore[operator]
    return GlobalCounters.kernel_count


def test_elementwise_chain_is_one_kernel() -> None:
    a, b, c = (torch.randn(16, 16).to("xgrad") for _ in range(3))
    torch.xgrad.synchronize()
    out = (a + b).relu() * c
    assert _kernels(lambda: torch.xgrad.synchronize()) == 0, "nothing runs before torch needs data"
    assert _kernels(lambda: out.cpu()) == 1
    expected = (torch.relu(a.cpu() + b.cpu()) * c.cpu()).numpy()
    np.testing.assert_allclose(out.cpu().numpy(), expected, rtol=1e-6)


def test_conv_bias_relu_fuses_as_native_xgrad() -> None:
    x, w, b = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4)
    xs, ws, bs = x.to("xgrad"), w.to("xgrad"), b.to("xgrad")
    torch.xgrad.synchronize()
    y = F.relu(F.conv2d(xs, ws, bs))
    bridge = _kernels(lambda: y.cpu())
    xn, wn, bn = Tensor(x.numpy()).realize(), Tensor(w.numpy()).realize(), Tensor(b.numpy()).realize()
    native = _kernels(lambda: xn.conv2d(wn, bn).relu().numpy())
    assert bridge == native == 1
    np.testing.assert_allclose(y.cpu().numpy(), F.relu(F.conv2d(x, w, b)).numpy(), atol=1e-5)


def test_in_place_writes_stay_lazy_until_read() -> None:
    a = torch.zeros(8, 8).to("xgrad")
    torch.xgrad.synchronize()
    GlobalCounters.reset()
    a[2:4].add_(1)
    a.mul_(3)
    a[:, 0].fill_(5)
    assert GlobalCounters.kernel_count == 0
    assert a.sum().item() == 2 * 8 * 3 + 5 * 8 - 2 * 3
