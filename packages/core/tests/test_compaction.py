"""The log-step compaction behind nonzero / masked_select / bool-mask indexing (xgrad/mixin/indexing.py
`_select_rows`), forced on small inputs by lowering COMPACT_MIN, against torch on every device."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

import xgrad.mixin.indexing as indexing
from xgrad.errors import ShapeError
from xgrad.tensor import Tensor

rng = np.random.default_rng(11)

MASKS = {
    "random": rng.random(13) < 0.4,
    "all": np.ones(9, dtype=bool),
    "none": np.zeros(7, dtype=bool),
    "last_only": np.eye(1, 16, 15, dtype=bool)[0],
    "alternating": np.arange(17) % 2 == 1,
}


@pytest.fixture(autouse=True)
def _compact_always() -> Iterator[None]:
    old = indexing.COMPACT_MIN
    indexing.COMPACT_MIN = 0
    yield
    indexing.COMPACT_MIN = old


@pytest.mark.parametrize("name", list(MASKS))
def test_masked_select_compacts_like_torch(xgrad_device: str, name: str) -> None:
    mask = MASKS[name]
    values = rng.standard_normal(mask.shape).astype(np.float32)
    got = Tensor(values, device=xgrad_device).masked_select(Tensor(mask, device=xgrad_device))
    want = torch.masked_select(torch.from_numpy(values), torch.from_numpy(mask))
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_nonzero_2d_matches_torch(xgrad_device: str) -> None:
    x = (rng.random((4, 5)) < 0.5).astype(np.int32) * rng.integers(1, 9, (4, 5)).astype(np.int32)
    got = Tensor(x, device=xgrad_device).nonzero()
    np.testing.assert_array_equal(got.numpy(), torch.nonzero(torch.from_numpy(x)).numpy())


def test_masked_select_fixed_size_cuts_or_fills(xgrad_device: str) -> None:
    mask = MASKS["random"]
    values = np.arange(mask.size, dtype=np.int32)
    x, m = Tensor(values, device=xgrad_device), Tensor(mask, device=xgrad_device)
    kept = values[mask]
    np.testing.assert_array_equal(x.masked_select(m, size=2).numpy(), kept[:2])
    filled = np.concatenate([kept, np.full(mask.size + 2 - kept.size, -1, np.int32)])
    np.testing.assert_array_equal(x.masked_select(m, size=mask.size + 2, fill_value=-1).numpy(), filled)


def test_bool_mask_index_matches_torch(xgrad_device: str) -> None:
    x = rng.standard_normal((6, 3)).astype(np.float32)
    mask = np.array([True, False, True, True, False, True])
    got = Tensor(x, device=xgrad_device)[Tensor(mask, device=xgrad_device)]
    np.testing.assert_array_equal(got.numpy(), torch.from_numpy(x)[torch.from_numpy(mask)].numpy())


def test_masked_select_negative_size_raises() -> None:
    with pytest.raises(ShapeError, match="non-negative"):
        Tensor([1, 2]).masked_select(Tensor([True, False]), size=-1)


def test_compaction_moves_far_at_odd_length() -> None:
    # a length that is not a power of two, the kept elements far from their places (every shift stage is used)
    n = 1000
    mask = np.zeros(n, dtype=bool)
    mask[[3, 500, 501, 998, 999]] = True
    values = rng.standard_normal(n).astype(np.float32)
    got = Tensor(values).masked_select(Tensor(mask))
    np.testing.assert_array_equal(got.numpy(), values[mask])


def test_bool_mask_over_leading_axes_selects_rows_with_gradient(xgrad_device: str) -> None:
    x = rng.standard_normal((3, 4, 2)).astype(np.float32)
    mask = rng.random((3, 4)) < 0.5
    xt = Tensor(x, device=xgrad_device).is_param_()
    upstream = rng.standard_normal((int(mask.sum()), 2)).astype(np.float32)
    out = xt[Tensor(mask, device=xgrad_device)]
    (out * Tensor(upstream, device=xgrad_device)).sum().backward()
    tx = torch.from_numpy(x).requires_grad_()
    want = tx[torch.from_numpy(mask)]
    (want * torch.from_numpy(upstream)).sum().backward()
    np.testing.assert_array_equal(out.numpy(), want.detach().numpy())
    assert xt.grad is not None and tx.grad is not None
    np.testing.assert_allclose(xt.grad.numpy(), tx.grad.numpy())


def test_bool_mask_selecting_nothing_or_from_empty(xgrad_device: str) -> None:
    x = Tensor(np.arange(6, dtype=np.float32).reshape(3, 2), device=xgrad_device)
    assert x[Tensor(np.zeros(3, dtype=bool), device=xgrad_device)].shape == (0, 2)
    empty = Tensor(np.zeros((0, 2), dtype=np.float32), device=xgrad_device)
    assert empty[Tensor(np.zeros(0, dtype=bool), device=xgrad_device)].shape == (0, 2)
