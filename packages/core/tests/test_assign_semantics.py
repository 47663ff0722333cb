"""Assign runs once: a pending assign that runs as part of another tensor's realize is not run again on a later read
(of the tensor, of a lazy reader of it, or of a TinyJit step). Oracle: numpy (or torch) doing the same in-place ops."""

from __future__ import annotations

import numpy as np
import torch

from xgrad import TinyJit
from xgrad.tensor import Tensor


def test_an_assign_run_by_another_realize_is_not_run_again_on_read() -> None:
    t = Tensor([1.0]).contiguous().realize()
    t.assign(t + 1)
    assert (t * 2).tolist() == [4.0]
    assert t.tolist() == [2.0]
    assert t.tolist() == [2.0]


def test_a_lazy_reader_of_an_assign_run_by_another_realize_reads_the_written_buffer() -> None:
    a = np.arange(4, dtype=np.float32)
    t = Tensor(a).contiguous().realize()
    t.assign(t * 3)
    reader = t + 1  # built before the assign runs: reads its value
    (t.sum() * 2).realize()
    a *= 3
    np.testing.assert_array_equal(reader.numpy(), a + 1)
    np.testing.assert_array_equal(t.numpy(), a)
    t.assign(t - 2)  # the next assign starts from the value written once
    a -= 2
    np.testing.assert_array_equal(t.numpy(), a)


def test_an_assign_inside_a_jitted_step_runs_once_per_call() -> None:
    t = Tensor([1.0, 10.0]).contiguous().realize()

    @TinyJit
    def step(x: Tensor) -> Tensor:
        t.assign(t + x)
        return (t * 2).realize()

    ref = np.array([1.0, 10.0], dtype=np.float32)
    for i in range(5):
        x = np.array([i, 2 * i], dtype=np.float32)
        out = step(Tensor(x)).numpy()
        ref += x
        np.testing.assert_array_equal(out, 2 * ref)
        np.testing.assert_array_equal(t.numpy(), ref)


def test_a_slice_assign_read_after_another_realize_runs_once() -> None:
    a = np.arange(5, dtype=np.float32)
    x = Tensor(a).contiguous().realize()
    part = x[1:3]
    part.assign(part + 10)
    other = Tensor([1.0, 2.0]).contiguous()
    (other * 2).realize()  # runs the pending view assign first
    a[1:3] += 10
    np.testing.assert_array_equal(part.numpy(), a[1:3])
    np.testing.assert_array_equal(x.numpy(), a)
    (x.sum() + part.sum()).realize()
    np.testing.assert_array_equal(part.numpy(), a[1:3])
    np.testing.assert_array_equal(x.numpy(), a)


def test_a_chain_of_assigns_read_between_realizes_matches_torch() -> None:
    start = np.array([1.0, -2.0, 0.5], dtype=np.float32)
    t = Tensor(start).contiguous().realize()
    ref = torch.tensor(start)
    seen, seen_ref = [], []
    for k in range(1, 5):
        t.assign(t * 2 + k)
        ref.mul_(2).add_(k)
        side = (t - 1).sum()  # realized on its own: runs t's assign inside
        seen.append(side.item())
        seen_ref.append(float((ref - 1).sum()))
        if k % 2:
            np.testing.assert_array_equal(t.numpy(), ref.numpy())
    np.testing.assert_array_equal(t.numpy(), ref.numpy())
    np.testing.assert_allclose(seen, seen_ref, rtol=1e-6)


def test_an_assign_into_a_sharded_tensor_run_by_another_realize_runs_once() -> None:
    a = np.arange(4, dtype=np.float32)
    t = Tensor(a).shard(("CPU", "CPU:1"), axis=0).contiguous().realize()
    t.assign(t + 1)
    reader = t * 3  # built before the assign runs: reads its value
    np.testing.assert_array_equal((t * 2).numpy(), 2 * (a + 1))
    np.testing.assert_array_equal(t.numpy(), a + 1)
    np.testing.assert_array_equal(reader.numpy(), 3 * (a + 1))
    np.testing.assert_array_equal(t.numpy(), a + 1)
