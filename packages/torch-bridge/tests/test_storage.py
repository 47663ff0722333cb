"""The xgrad buffer on each torch storage: pending in-place writes and their realize."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import xgrad_torch
from xgrad import GlobalCounters, Tensor


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


def test_flush_of_writes_realizes_the_live_results_made_since_the_last() -> None:
    # a training step's gradients: read by the optimizer's pending writes, alive after them; realized with the writes
    a = torch.arange(8, dtype=torch.float32).to("xgrad")
    w = torch.zeros(8).to("xgrad")
    torch.xgrad.synchronize()
    kept = a * 2
    w.add_(kept)
    w.add_(a * 3)  # a temporary: dead before the flush, fused into the write
    assert _kernels(torch.xgrad.synchronize) >= 1
    assert _kernels(lambda: kept.cpu()) == 0, "realized with the writes"
    np.testing.assert_array_equal(kept.cpu().numpy(), np.arange(8) * 2)
    np.testing.assert_array_equal(w.cpu().numpy(), np.arange(8) * 5)
    later = a + 1  # made after that flush: with no pending write, a flush runs nothing
    assert _kernels(torch.xgrad.synchronize) == 0
    assert _kernels(lambda: later.cpu()) == 1


def _kernels(fn: Any) -> int:
    GlobalCounters.reset()
    fn()
    return int(GlobalCounters.kernel_count)
