"""The NV device on the mock driver (MOCKGPU=1: xgrad_nv.mock over the PTX interpreter): allocation with its LRU free
list, copies, views, launch dimensions and argument packing (symbolic shapes), timing, multi-GPU NV:0/NV:1, TinyJit
replay through NVDevice.batch, and the driver's errors. Results are compared with numpy."""

from __future__ import annotations

import numpy as np
import pytest

from xgrad import Device, Tensor, TinyJit, Variable
from xgrad.errors import DeviceError, OutOfMemoryError
from xgrad_nv.device import NVAllocator, NVDevice, get_driver, launch_dims, table_arch
from xgrad_nv.driver import CUDADriverError
from xgrad_nv.mock import MOCK_ARCH, MockDriver


@pytest.fixture(autouse=True)
def _mock(mockgpu: None) -> None:
    """Every test here runs on the mock GPU (conftest's `mockgpu`)."""


def test_mock_device_runs_on_the_ptx_interpreter() -> None:
    dev = Device["NV"]
    assert isinstance(dev, NVDevice) and dev.driver.kind == "mock" and dev.compile_arch == MOCK_ARCH
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal((Tensor(a, device="NV") * 2 + 1).numpy(), a * 2 + 1)


def test_allocator_reuses_freed_blocks_and_copies_round_trip() -> None:
    drv = MockDriver()
    ctx = drv.open_context(0)
    alloc = NVAllocator(drv, ctx, "NV", cache_limit=1024)
    a = alloc.alloc(256)
    alloc.copyin(a, memoryview(bytes(range(256))))
    view = alloc.offset(a, 16, 32)
    out = bytearray(32)
    alloc.copyout(memoryview(out), view)
    assert bytes(out) == bytes(range(16, 48))
    alloc.free(a, 256)
    assert alloc.alloc(256).ptr == a.ptr  # from the free list, not the driver
    b, c = alloc.alloc(512), alloc.alloc(512)
    alloc.free(b, 512)
    alloc.free(c, 512)
    alloc.alloc(600)  # a new size: the cache keeps at most 1024 bytes
    assert alloc.cached_bytes == 1024
    big = alloc.alloc(2048)
    alloc.free(big, 2048)  # above the limit: back to the driver at once
    assert alloc.cached_bytes == 1024 and big.ptr not in drv._contexts[0].allocated


def test_out_of_memory_names_the_device_and_size() -> None:
    drv = MockDriver()
    alloc = NVAllocator(drv, drv.open_context(0), "NV:0")
    with pytest.raises(OutOfMemoryError, match=r"NV:0: cannot allocate \d+ bytes.*CUDA_ERROR_OUT_OF_MEMORY"):
        alloc.alloc(1 << 40)


def test_symbolic_shape_packs_the_variable_and_sizes_the_grid() -> None:
    a = np.arange(3 * 40, dtype=np.float32).reshape(3, 40)
    t = Tensor(a, device="NV").realize()
    n = Variable("n", 1, 40)
    for k in (5, 17, 40):
        out = (t.shrink((None, (0, n.bind(k)))) * 3).sum(1)
        np.testing.assert_allclose(out.numpy(), (a[:, :k] * 3).sum(1), rtol=1e-6)


def test_launch_with_wait_returns_the_kernel_time() -> None:
    dev = Device["NV"]
    x = Tensor(np.ones((64, 64), np.float32), device="NV").realize()
    (x + 1).realize()
    prg = next(iter(dev._programs.values()))
    bufs = [dev.allocator.alloc(64 * 64 * 4) for _ in range(2)]
    t = prg(bufs, {}, wait=True)
    assert isinstance(t, float) and t >= 0


def test_two_gpus_compute_and_copy_between_them() -> None:
    a = np.arange(16, dtype=np.float32)
    x0 = Tensor(a, device="NV:0") + 1
    x1 = x0.to("NV:1") * 2
    assert Device["NV:1"].ctx != Device["NV:0"].ctx
    np.testing.assert_array_equal(x1.numpy(), (a + 1) * 2)
    with pytest.raises(DeviceError, match=r"NV:0 \.\. NV:1"):
        Device["NV:5"]


def test_jit_replay_launches_through_the_batch() -> None:
    drv = get_driver(None)
    calls: list[int] = []
    orig = NVDevice.batch

    def spy(self: NVDevice, launches: list) -> object:  # type: ignore[type-arg]
        calls.append(len(launches))
        return orig(self, launches)

    NVDevice.batch = spy  # type: ignore[method-assign]
    try:
        step = TinyJit(lambda x: ((x * 2).exp() + 1).softmax(-1).realize())
        rng = np.random.default_rng(0)
        for i in range(4):
            a = rng.uniform(-1, 1, (4, 16)).astype(np.float32)
            before = drv.launches
            got = step(Tensor(a, device="NV")).numpy()
            e = np.exp(np.exp(a * 2) + 1 - (np.exp(a * 2) + 1).max(-1, keepdims=True))
            np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
            if i >= 2:
                assert drv.launches > before
    finally:
        NVDevice.batch = orig  # type: ignore[method-assign]
    assert calls and calls[0] >= 2  # the softmax's kernels replayed as one batch


def test_mock_refuses_a_cubin_and_errors_name_the_call() -> None:
    drv = MockDriver()
    drv.open_context(0)
    with pytest.raises(CUDADriverError, match="cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE"):
        drv.load_module(b"\x7fELF" + bytes(60))
    with pytest.raises(CUDADriverError, match="cuMemFree_v2 failed"):
        drv.mem_free(12345)


def test_launch_limits_of_the_arch_are_enforced() -> None:
    drv = MockDriver("sm_80")
    drv.open_context(0)
    mod = drv.load_module(b".version 9.0\n.target sm_80\n.address_size 64\n.visible .entry k()\n{\nret;\n}\n")
    fn = drv.get_function(mod, "k")
    drv.launch(fn, (1, 1, 1), (1024, 1, 1), 0, [])
    with pytest.raises(CUDADriverError, match="exceeds sm_80's limits"):
        drv.launch(fn, (1, 1, 1), (1025, 1, 1), 0, [])
    with pytest.raises(CUDADriverError, match="166912 bytes on sm_80"):
        drv.set_max_dynamic_shared(fn, 200 * 1024)


def test_arch_table_lookup_for_other_compute_capabilities() -> None:
    assert table_arch((9, 0)) == "sm_90" and table_arch((8, 6)) == "sm_80" and table_arch((12, 1)) == "sm_120"
    with pytest.raises(DeviceError, match="older than sm_80"):
        table_arch((7, 5))


def test_kernel_without_thread_indexes_is_one_thread() -> None:
    from xgrad.buffer import ProgramInfo

    assert launch_dims(ProgramInfo("k"), {}) == ((1, 1, 1), (1, 1, 1))
