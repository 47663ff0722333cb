"""A buffer is freed once no live tensor refers to it: the engine's caches (the graph the latest realize keeps for a
loop that builds it again, the walks of lazy tensors) must not hold it. Checked by `GlobalCounters.mem_used_per_device`
(what the allocator handed out and not yet got back) and by weak references to the Buffers themselves."""

from __future__ import annotations

import gc
import pathlib
import weakref
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from xgrad import Tensor, TinyJit
from xgrad.buffer import Buffer, buffer_of
from xgrad.helpers import GlobalCounters

DEVICES = ["CPU", "PYTHON"]


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> Iterator[str]:
    from xgrad.device import Device

    if request.param not in Device.get_available_devices(runs_kernels_only=True):
        pytest.skip(f"{request.param} is not available")
    yield request.param


def _settled(device: str) -> int:
    """The memory in use on `device` once what earlier tests left is gone: a realize of a graph that reads no buffer
    replaces the graph the engine keeps, and the cyclic GC runs."""
    (Tensor.zeros(1, device=device) + 1).realize()
    gc.collect()
    return GlobalCounters.mem_used_per_device.get(device, 0)


def _used(device: str) -> int:
    return GlobalCounters.mem_used_per_device.get(device, 0)


def _buffer_ref(t: Tensor) -> weakref.ref[Buffer]:
    return weakref.ref(buffer_of(t.uop))


def test_a_dropped_source_is_freed_after_a_derived_tensor_is_realized(device: str) -> None:
    """The issue's repro: a realized copy, a tensor computed from it and realized, then the copy dropped. The graph the
    realize kept (for a loop that builds it again) held the copy's buffer until the next realize."""
    n = 34 << 17 if device == "CPU" else 34 * 64  # 4.5 MB on CPU; PYTHON interprets every element
    data = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8)
    before = _settled(device)
    raw = Tensor(data, device=device).contiguous().realize()
    # the upload the copy was made from is not held by anything: only the copy is allocated
    assert _used(device) == before + n
    raw_buf = _buffer_ref(raw)
    out = (raw.reshape(-1, 34)[:, 2:].cast("float32") * 2).contiguous().realize()
    assert _used(device) == before + n + out.nbytes()
    del raw
    gc.collect()  # (this collection may also free a few bytes an earlier test left behind a reference cycle)
    assert raw_buf() is None
    assert before - 64 <= _used(device) - out.nbytes() <= before
    want = data.reshape(-1, 34)[:, 2:].astype(np.float32) * 2
    np.testing.assert_array_equal(out.numpy(), want)


def test_a_dropped_source_is_freed_without_the_cyclic_gc(device: str) -> None:
    """Reference counting alone frees it, at the `del`: no cyclic GC, no later realize."""
    _settled(device)
    gc.disable()
    try:
        raw = Tensor(np.arange(340, dtype=np.float32), device=device).contiguous().realize()
        ref = _buffer_ref(raw)
        out = (raw.reshape(-1, 34)[:, 2:] + 1).contiguous().realize()
        assert ref() is not None
        del raw
        assert ref() is None
    finally:
        gc.enable()
    np.testing.assert_array_equal(out.numpy(), np.arange(340, dtype=np.float32).reshape(-1, 34)[:, 2:] + 1)


def test_a_buffer_read_by_a_live_lazy_tensor_stays_until_that_tensor_goes(device: str) -> None:
    """A lazy tensor still reading the dropped copy keeps it (it is computed from it later); realizing it, or dropping
    it, frees the copy, even after another realize walked its graph (the engine keeps the walks of live lazy tensors).
    `numpy()` would not do: it reads a contiguous copy and leaves the tensor lazy."""
    _settled(device)
    gc.disable()
    try:
        raw = Tensor(np.arange(64, dtype=np.float32), device=device).contiguous().realize()
        ref = _buffer_ref(raw)
        lazy = raw * 3
        (raw + 1).realize()  # walks `lazy` (it may read what a realize computes)
        del raw
        assert ref() is not None
        lazy.realize()
        assert ref() is None  # realized: `lazy` reads its own buffer now
        np.testing.assert_array_equal(lazy.numpy(), np.arange(64, dtype=np.float32) * 3)
        raw = Tensor(np.arange(64, dtype=np.float32), device=device).contiguous().realize()
        ref = _buffer_ref(raw)
        lazy = raw * 3
        (raw + 1).realize()
        del raw
        assert ref() is not None
        del lazy
        assert ref() is None
    finally:
        gc.enable()


def test_the_latest_graph_is_still_kept_while_its_inputs_live(device: str) -> None:
    """The fast path stays: while every buffer the latest realize read is held by a live tensor, building the same
    graph again finds the same (hash-consed) nodes, so a loop does not build and size them anew."""
    _settled(device)
    x = Tensor(np.arange(16, dtype=np.float32), device=device).realize()
    lazy = x * 2 + 1
    root = weakref.ref(lazy.uop)
    lazy.realize()
    del lazy
    assert root() is not None and (x * 2 + 1).uop is root()
    del x
    assert root() is None  # the input went: so did the graph


def test_nodes_that_do_not_read_a_dropped_buffer_stay_kept(device: str) -> None:
    """A dropped input takes only the kept nodes that read it: the rest of the graph (here the weight's transpose,
    which a training step builds again with the next batch) stays in the UOp cache until its own inputs go."""
    _settled(device)
    w = Tensor(np.arange(16, dtype=np.float32).reshape(4, 4), device=device).realize()
    x = Tensor(np.arange(4, dtype=np.float32), device=device).realize()
    gc.disable()
    try:
        out = (x @ (w.T * 2)).realize()
        part = weakref.ref((w.T * 2).uop)  # the kept node, found again (hash-consed)
        root = weakref.ref((x @ (w.T * 2)).uop)
        assert part() is not None and root() is not None
        del x
        assert root() is None and part() is not None
        del w
        assert part() is None
    finally:
        gc.enable()
    want = np.arange(4, dtype=np.float32) @ (np.arange(16, dtype=np.float32).reshape(4, 4).T * 2)
    np.testing.assert_array_equal(out.numpy(), want)


def _model(device: str) -> tuple[Tensor, Tensor, Callable[[Tensor], Tensor]]:
    rng = np.random.default_rng(1)
    w1 = Tensor(rng.standard_normal((16, 32), dtype=np.float32), device=device).realize()
    w2 = Tensor(rng.standard_normal((32, 8), dtype=np.float32), device=device).realize()

    def step(x: Tensor) -> Tensor:
        return x.linear(w1).relu().linear(w2).softmax(-1).contiguous().realize()

    return w1, w2, step


def _run_steps(device: str, step: Callable[[Tensor], Tensor], w1: Tensor, w2: Tensor) -> tuple[list[int], list[bool]]:
    rng = np.random.default_rng(2)
    used, inputs = [], []
    for _ in range(50):
        xs = rng.standard_normal((4, 16), dtype=np.float32)
        x = Tensor(xs, device=device).realize()
        inputs.append(_buffer_ref(x))
        out = step(x)
        want = np.maximum(xs @ w1.numpy(), 0) @ w2.numpy()
        want = np.exp(want - want.max(-1, keepdims=True))
        np.testing.assert_allclose(out.numpy(), want / want.sum(-1, keepdims=True), rtol=1e-4, atol=1e-6)
        del x, out
        used.append(_used(device))
    return used, [r() is not None for r in inputs]


def test_memory_stays_flat_over_50_realize_steps(device: str) -> None:
    """A model-like step realized 50 times on new inputs: the memory in use after each step is the same (the weights),
    and every step's input is freed when the loop drops it."""
    w1, w2, step = _model(device)
    before = _settled(device)
    gc.disable()
    try:
        used, alive = _run_steps(device, step, w1, w2)
    finally:
        gc.enable()
    assert used == [before] * 50
    assert not any(alive)


def test_memory_stays_flat_over_50_jit_steps(device: str) -> None:
    """The same with TinyJit: after the capture (step 2) the memory in use stays where it is (the capture's own
    buffers, reused by every replay), and the replays' inputs are freed."""
    w1, w2, step = _model(device)
    jit_step = TinyJit(step)
    before = _settled(device)
    gc.disable()
    try:
        used, alive = _run_steps(device, jit_step, w1, w2)
    finally:
        gc.enable()
    assert used[0] == before
    assert used[1:] == [used[1]] * 49
    assert not any(alive[2:])


def test_a_dropped_copy_of_a_disk_slice_is_freed(device: str, tmp_path: pathlib.Path) -> None:
    """xgrad_llm's loader: a slice of a file copied to the device, computed from and dropped. The file's mapping stays
    (the DISK tensor is alive); the copy on the device goes at the `del`."""
    data = np.random.default_rng(3).integers(0, 256, 34 * 96, dtype=np.uint8)
    path = tmp_path / "blob.bin"
    path.write_bytes(data.tobytes())
    disk = Tensor(path)
    before = _settled(device)
    outs = []
    for k in range(3):
        copy = disk[k * 34 * 32 : (k + 1) * 34 * 32].to(device).contiguous().realize()
        outs.append((copy.reshape(-1, 34)[:, 2:].cast("float32") * 2).contiguous().realize())
        del copy
        assert _used(device) == before + sum(o.nbytes() for o in outs)
    for k, out in enumerate(outs):
        want = data[k * 34 * 32 : (k + 1) * 34 * 32].reshape(-1, 34)[:, 2:].astype(np.float32) * 2
        np.testing.assert_array_equal(out.numpy(), want)
