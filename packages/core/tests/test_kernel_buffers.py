"""MAX_KERNEL_BUFFERS: the scheduler realizes inputs early so that no kernel binds more buffers than its device's
limit (the knob, else the device's `max_kernel_buffers`)."""

from __future__ import annotations

import numpy as np
import pytest

from xgrad.engine.kernel_buffers import kernel_buffer_limit
from xgrad.engine.schedule import create_schedule
from xgrad.engine.schedule_cache import cached_schedule
from xgrad.helpers import Context
from xgrad.tensor import Tensor


def _inputs(n: int) -> list[np.ndarray]:
    base = np.arange(15, dtype=np.float32).reshape(3, 5)
    return [base * (i % 7) - i for i in range(n)]


def _sum_of(ts: list[Tensor]) -> Tensor:
    out = ts[0]
    for t in ts[1:]:
        out = out + t
    return out


@pytest.mark.parametrize("limit", [4, 7])
def test_sum_of_40_tensors_fits_the_buffer_limit_when_the_knob_is_set(xgrad_device: str, limit: int) -> None:
    xs = _inputs(40)
    ts = [Tensor(x, device=xgrad_device).realize() for x in xs]
    with Context(MAX_KERNEL_BUFFERS=limit, SCACHE=0):
        total = _sum_of(ts)
        items, _ = create_schedule([total.uop])
        assert len(items) > 1 and all(len(it.bufs) <= limit for it in items)
        np.testing.assert_allclose(total.numpy(), np.sum(xs, axis=0), rtol=1e-6)


def test_reduce_and_where_of_many_inputs_fit_the_buffer_limit(xgrad_device: str) -> None:
    xs = _inputs(12)
    ts = [Tensor(x, device=xgrad_device).realize() for x in xs]
    with Context(MAX_KERNEL_BUFFERS=4, SCACHE=0):
        mixed = (ts[0] > ts[1]).where(_sum_of(ts[2:7]), _sum_of(ts[7:]) * ts[1]).sum(1)
        items, _ = create_schedule([mixed.uop])
        assert all(len(it.bufs) <= 4 for it in items)
        want = np.where(xs[0] > xs[1], np.sum(xs[2:7], axis=0), np.sum(xs[7:], axis=0) * xs[1]).sum(1)
        np.testing.assert_allclose(mixed.numpy(), want, rtol=1e-5)


def test_small_graphs_fuse_as_before_under_the_limit() -> None:
    with Context(DEV="NULL", MAX_KERNEL_BUFFERS=4, SCACHE=0):
        a, b, c = Tensor.empty(8), Tensor.empty(8), Tensor.empty(8)
        items, _ = create_schedule([((a + b) * c).uop])
        assert len(items) == 1 and len(items[0].bufs) == 4


def test_limit_is_the_knob_else_the_device_attribute() -> None:
    with Context(MAX_KERNEL_BUFFERS=5):
        assert kernel_buffer_limit("NULL") == 5
    with Context(MAX_KERNEL_BUFFERS=0):
        assert kernel_buffer_limit("NULL") is None  # the NULL device declares no limit


def test_schedule_cache_keeps_schedules_made_under_different_limits_apart() -> None:
    xs = _inputs(10)
    ts = [Tensor(x, device="CPU").realize() for x in xs]
    with Context(MAX_KERNEL_BUFFERS=0):
        _sum_of(ts).realize()  # cached with the device's own (absent) limit: one kernel of 11 buffers
    with Context(MAX_KERNEL_BUFFERS=4):
        total = _sum_of(ts)
        items, _ = cached_schedule([total.uop])
        assert len(items) > 1 and all(len(it.bufs) <= 4 for it in items)
        np.testing.assert_allclose(total.numpy(), np.sum(xs, axis=0), rtol=1e-6)
