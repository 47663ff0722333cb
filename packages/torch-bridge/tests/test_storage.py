"""The xgrad buffer on each torch storage: pending in-place writes and their realize."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import xgrad_torch
from xgrad import Tensor


def test_pending_writes_realize_in_the_order_of_first_write(monkeypatch: pytest.MonkeyPatch) -> None:
    # the realize of pending writes takes them in program order, so a loop writing the same tensors each step builds
    # the same graph (and reuses its schedule) every step; a set ordered by address changed it now and then
    xgrad_torch.storage.flush()
    tensors = [torch.zeros(3 + i).to("xgrad") for i in range(24)]
    xgrad_torch.storage.flush()
    order = list(np.random.default_rng(0).permutation(len(tensors)))
    for i in order:
        tensors[i].add_(float(i))
    tensors[order[0]].mul_(2)  # a second write keeps the first one's place
    seen: list[tuple[int, ...]] = []
    realize = Tensor.realize

    def recording(*xs: Tensor, **kwargs: Any) -> Any:
        seen.extend(x.shape for x in xs)
        return realize(*xs, **kwargs)

    monkeypatch.setattr(Tensor, "realize", recording)
    torch.xgrad.synchronize()
    assert seen == [(3 + i,) for i in order]
    for i, t in enumerate(tensors):
        expected = np.full(3 + i, float(i) * (2 if i == order[0] else 1), dtype=np.float32)
        np.testing.assert_array_equal(t.cpu().numpy(), expected)


@pytest.mark.parametrize(
    "view",
    [
        lambda a: a.view(4, 6).t(),
        lambda a: a.view(2, 3, 4).permute(2, 0, 1),
        lambda a: a.view(2, 3, 4).transpose(0, 1),
        lambda a: a.view(2, 1, 3, 4).permute(3, 1, 0, 2),  # a size-1 dim: the general layout path
        lambda a: a.view(4, 6)[:, :3].t(),  # part of the storage
    ],
    ids=["t", "permute", "transpose", "size1", "partial"],
)
def test_permuted_views_read_as_cpu(view: Any) -> None:
    a = torch.arange(24, dtype=torch.float32)
    x = view(a.to("xgrad"))
    assert not x.is_contiguous()
    np.testing.assert_array_equal(x.cpu().numpy(), view(a).numpy())
    np.testing.assert_array_equal((x * 2 + 1).cpu().numpy(), (view(a) * 2 + 1).numpy())
