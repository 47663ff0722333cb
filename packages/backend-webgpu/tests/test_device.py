"""Real runs on the adapter (lavapipe in CI): packed narrow dtypes, large dispatches, variables, errors."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

from xgrad.device import Device
from xgrad.dtype import dtypes
from xgrad.errors import CompileError, DeviceError
from xgrad.helpers import Context
from xgrad.tensor import Tensor
from xgrad_webgpu.device import cpu_adapter
from xgrad_webgpu.renderer import CpuAdapter


def test_elementwise_and_reduce_match_numpy(webgpu: str) -> None:
    x = np.random.default_rng(0).normal(size=(5, 33)).astype(np.float32)
    t = Tensor(x, device=webgpu)
    np.testing.assert_allclose(((t * 2).exp().sum(1)).numpy(), np.exp(x * 2).sum(1), rtol=1e-5)
    np.testing.assert_allclose((t @ t.permute(1, 0)).numpy(), x @ x.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.bool])
def test_packed_lanes_keep_their_neighbours(webgpu: str, dtype: object) -> None:
    # 13 elements: the last word is partly used; every invocation writes one lane of a shared word
    a = np.arange(13) % 7 - (0 if dtype in (dtypes.uint8, dtypes.uint16, dtypes.bool) else 3)
    t = Tensor(a.tolist(), device=webgpu, dtype=dtype)  # type: ignore[arg-type]
    np_dt = t.numpy().dtype
    want = a.astype(np_dt)
    np.testing.assert_array_equal(t.numpy(), want)
    if dtype == dtypes.bool:
        np.testing.assert_array_equal((t != True).numpy(), ~want)  # noqa: E712
    else:
        np.testing.assert_array_equal((t * 37 + 1).numpy(), (want * np_dt.type(37) + np_dt.type(1)).astype(np_dt))
        np.testing.assert_array_equal(t.flip(0).numpy(), want[::-1])


def test_launch_larger_than_one_dispatch_dimension(webgpu: str) -> None:
    n = 65535 * 64 + 130  # more workgroups of 64 than one dimension allows (padded to 64): spills into y
    t = Tensor.arange(n, device=webgpu) + 1
    out = t.numpy()
    assert out[0] == 1 and out[-1] == n and int(out[65535 * 64]) == 65535 * 64 + 1


def test_empty_and_scalar_kernels(webgpu: str) -> None:
    assert (Tensor.zeros(0, device=webgpu) + 1).tolist() == []
    assert (Tensor(2.5, device=webgpu) * 2).item() == 5.0


def test_rejected_shader_raises_compile_error_with_source_and_log(webgpu: str) -> None:
    dev = Device[webgpu]
    with pytest.raises(CompileError, match="rejected kernel broken") as info:
        dev.build("broken", [], "fn main( {")
    assert info.value.source == "fn main( {"
    assert "error" in info.value.log.lower()


def test_unaligned_views_are_refused(webgpu: str) -> None:
    alloc = Device[webgpu].allocator
    base = alloc.alloc(256)
    assert alloc.offset(base, 0, 16).offset == 0
    with pytest.raises(DeviceError, match="multiples of"):
        alloc.offset(base, 4, 16)


def test_copies_of_odd_sizes_round_trip(webgpu: str) -> None:
    alloc = Device[webgpu].allocator
    buf = alloc.alloc(7)
    alloc.copyin(buf, memoryview(b"abcdefg"))
    out = bytearray(7)
    alloc.copyout(memoryview(out), buf)
    assert bytes(out) == b"abcdefg"


def test_kernels_bind_at_most_the_adapter_limit_of_storage_buffers(
    webgpu: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev = Device[webgpu]
    limit = int(dev.device.limits["max-storage-buffers-per-shader-stage"])
    assert dev.max_kernel_buffers == limit - 1  # one binding stays free for the variables
    bound: list[int] = []
    launch = dev.launch

    def counting_launch(raw: object, bufs: list[object], *args: object) -> object:
        bound.append(len(bufs))
        return launch(raw, bufs, *args)

    monkeypatch.setattr(dev, "launch", counting_launch)
    n = dev.max_kernel_buffers + 9  # more inputs than one kernel may bind
    xs = [np.full(5, i, np.float32) + np.arange(5, dtype=np.float32) for i in range(n)]
    ts = [Tensor(x, device=webgpu).realize() for x in xs]
    bound.clear()
    total = ts[0]
    for t in ts[1:]:
        total = total + t
    np.testing.assert_allclose(total.numpy(), np.sum(xs, axis=0))
    assert len(bound) >= 2 and max(bound) <= dev.max_kernel_buffers


def test_debug_4_prints_the_wgsl_of_each_new_kernel(webgpu: str, capsys: pytest.CaptureFixture[str]) -> None:
    t = Tensor([1.0, 2.0], device=webgpu).realize()
    with Context(DEBUG=4):
        out = (t * 1234.25 + 0.5).numpy()  # a constant no other test uses: a kernel compiled here
    assert out.tolist() == [1234.75, 2469.0]
    printed = capsys.readouterr().out
    assert "@compute @workgroup_size(2, 1, 1)" in printed and "1234.25f" in printed  # 2 elements: one workgroup


def test_shader_rejected_through_tensor_path_raises_compile_error(webgpu: str, monkeypatch: pytest.MonkeyPatch) -> None:
    dev = Device[webgpu]
    render = dev.renderer.render
    monkeypatch.setattr(dev.renderer, "render", lambda name, uops: render(name, uops) + "\nnot wgsl at all;\n")
    with pytest.raises(CompileError) as info:
        (Tensor([1.0, 2.0], device=webgpu) * 4321.5).realize()
    assert "not wgsl at all;" in info.value.source and "fn main" in info.value.source
    assert info.value.log and "error" in info.value.log.lower()
    assert "rejected kernel" in str(info.value)


def test_dispatches_wait_in_one_encoder_until_a_read(webgpu: str) -> None:
    dev = Device[webgpu]
    x = np.array([0.5, -1.0, 2.0], np.float32)
    t = Tensor(x, device=webgpu).realize()
    # start with nothing pending: the 64th pending dispatch would submit a before b is recorded
    gc.collect()
    dev.synchronize()
    a = (t * 3 + 1).contiguous()
    b = (a.exp() - a).contiguous()
    Tensor.realize(a, b)
    assert dev._pending >= 2  # recorded, not submitted yet
    np.testing.assert_allclose(b.numpy(), np.exp(x * 3 + 1) - (x * 3 + 1), rtol=1e-5)  # the read submits first
    assert dev._pending == 0


def test_a_buffer_freed_while_a_dispatch_is_recorded_waits_for_the_submission(
    webgpu: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CI once failed with "Encoding must not have ended": the garbage collector freed a buffer inside `launch`, the free
    # submitted the open encoder, and the dispatch being recorded ended its compute pass on a finished encoder
    import xgrad_webgpu.device as webgpu_device

    x = np.array([1.0, 2.0, 3.0], np.float32)
    dev = Device[webgpu]
    dev.synchronize()
    victim = [(Tensor(x, device=webgpu) + 1).contiguous()]
    reader = (victim[0] * 2).contiguous()
    Tensor.realize(victim[0], reader)  # both recorded, not submitted: reader's dispatch reads victim's buffer
    assert dev._pending >= 2
    record, deferred = webgpu_device._record_dispatch, []

    def record_with_a_free_inside(encoder, pipeline, group, groups, timestamps):  # type: ignore[no-untyped-def]
        victim.clear()  # the last reference goes while the encoder is open: freed now, as by a gc finalizer
        gc.collect()
        deferred.append(len(dev._doomed))
        record(encoder, pipeline, group, groups, timestamps)

    monkeypatch.setattr(webgpu_device, "_record_dispatch", record_with_a_free_inside)
    out = (reader + 1).contiguous().realize()
    monkeypatch.setattr(webgpu_device, "_record_dispatch", record)
    np.testing.assert_array_equal(out.numpy(), (x + 1) * 2 + 1)
    assert deferred[0] >= 1 and not dev._doomed  # the buffer waited, then went with the submission


def test_wide_softmax_uses_workgroup_memory(webgpu: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A 4096-wide row softmax: its reductions run as group reductions (256 threads per row meeting in workgroup
    memory), and it matches numpy."""
    a = np.random.default_rng(3).standard_normal((3, 4096)).astype(np.float32) * 4
    with Context(DEBUG=4):
        got = Tensor(a, device=webgpu).softmax(-1).numpy()
    printed = capsys.readouterr().out
    e = np.exp(a - a.max(-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-9)
    assert printed.count("var<workgroup>") >= 2 and "workgroupBarrier();" in printed
    assert "@compute @workgroup_size(256, 1, 1)" in printed


def test_cpu_adapter_is_read_from_the_adapter_info() -> None:
    """lavapipe's info names its vector width; a GPU's adapter type is not CPU (wgpu's `adapter.info` keys)."""
    threads = os.cpu_count() or 1
    info = {"adapter_type": "CPU", "device": "llvmpipe (LLVM 15.0.6, 256 bits)", "backend_type": "Vulkan"}
    assert cpu_adapter(info) == CpuAdapter(threads=threads, lanes=8)
    assert cpu_adapter({**info, "device": "llvmpipe (LLVM 19.1.7, 512 bits)"}) == CpuAdapter(threads, 16)
    assert cpu_adapter({**info, "device": "some CPU driver"}) == CpuAdapter(threads, 8)
    assert cpu_adapter({"adapter_type": "DiscreteGPU", "device": "NVIDIA GeForce RTX 4090"}) is None


def test_the_device_declares_its_adapters_preferences(webgpu: str) -> None:
    """On lavapipe (CI's adapter) the renderer's workgroups are at least its SIMD lanes wide."""
    dev = Device[webgpu]
    cpu = cpu_adapter(dev.adapter.info)
    if cpu is None:
        assert dev.renderer.min_local == 1
    else:
        assert dev.renderer.min_local == cpu.lanes and dev.renderer.group_max_outputs == cpu.threads * cpu.lanes * 16
