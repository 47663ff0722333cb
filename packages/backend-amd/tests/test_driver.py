"""The HIP runtime path without a GPU: `xgrad_amd.driver.HIPLibrary` (ctypes) over a stand-in libamdhip64 built from
fake_hip.c with the same C signatures (device memory is host memory; launches are recorded, not run), with
`xgrad_amd.device.AMDDevice` on top through the device registry. What a launch passed (grid, block, the packed
kernarg buffer) is read back from the stand-in and checked against the buffers' addresses and the code object's own
argument layout (its amdhsa metadata, read by `xgrad_amd.elf`)."""

from __future__ import annotations

import ctypes
import ctypes.util
import shutil
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from xgrad import Tensor, Variable, dtypes
from xgrad.device import Device
from xgrad.engine.schedule import buffer_of
from xgrad.errors import DeviceError
from xgrad.helpers import Context
from xgrad.plugin import reset_registry
from xgrad_amd import device as device_mod
from xgrad_amd import driver
from xgrad_amd.compiler import toolchain_problem
from xgrad_amd.elf import load_code_object

CLANG = shutil.which("clang-19") or shutil.which("clang")
_problem = toolchain_problem()
pytestmark = pytest.mark.skipif(
    CLANG is None or _problem is not None, reason=_problem or "no clang to build fake_hip.c"
)


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    out = tmp_path_factory.mktemp("fakehip") / "libfakehip.so"
    assert CLANG is not None
    subprocess.run([CLANG, "-shared", "-fPIC", "-O1", str(Path(__file__).with_name("fake_hip.c")), "-o", str(out)],
                   check=True, capture_output=True)  # fmt: skip
    lib = ctypes.CDLL(str(out))
    lib.fake_function.restype = ctypes.c_char_p
    lib.fake_kernarg.restype = ctypes.c_size_t
    return lib


@pytest.fixture
def amd(fake_lib: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch) -> Iterator[driver.HIPLibrary]:
    """Devices AMD (a gfx1100) and AMD:1 (a gfx942) on the stand-in library, through the registry."""
    hip = driver.HIPLibrary(fake_lib)
    monkeypatch.setattr(device_mod, "open_hip", lambda: hip)
    monkeypatch.setattr(driver, "hip_available", lambda: (True, ""))
    device_mod.AMDDevice._current.clear()
    with Context(MOCKGPU=0, DEV=""):
        reset_registry()
        yield hip
    reset_registry()


def last_launch(lib: ctypes.CDLL) -> tuple[list[int], bytes]:
    dims = (ctypes.c_uint * 7)()
    lib.fake_launch_dims(dims)
    buf = ctypes.create_string_buffer(4096)
    n = lib.fake_kernarg(buf)
    return list(dims), buf.raw[:n]


def test_missing_library_is_named_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver, "LIBRARY_NAMES", ("/nonexistent/libamdhip64.so",))
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    driver._real_hip.cache_clear()
    try:
        with Context(MOCKGPU=0):
            ok, why = driver.hip_available()
        assert not ok and "libamdhip64.so" in why and "install ROCm" in why and "MOCKGPU=1" in why
        with pytest.raises(driver.HIPUnavailableError, match="libamdhip64"):
            driver.HIPLibrary()
    finally:
        driver._real_hip.cache_clear()


def test_devices_arch_and_errors_through_ctypes(amd: driver.HIPLibrary, fake_lib: ctypes.CDLL) -> None:
    assert amd.device_count() == 2
    assert amd.device_arch(0) == "gfx1100"  # not the "gfx9999" inside the marketing name
    assert amd.device_arch(1) == "gfx942:sramecc+:xnack-"
    assert amd.device_name(1) == "Fake Radeon 1"
    with pytest.raises(driver.HIPError, match="hipSetDevice failed with hipError 101: invalid device ordinal"):
        amd.set_device(5)
    with pytest.raises(driver.HIPError, match="hipModuleLoadData"):
        amd.module_load(b"not an elf")


def test_copies_round_trip_and_devices_switch(amd: driver.HIPLibrary, fake_lib: ctypes.CDLL) -> None:
    a = np.arange(10, dtype=np.float32)
    t0 = Tensor(a, device="AMD").realize()
    t1 = Tensor(a * 2, device="AMD:1").realize()
    assert fake_lib.fake_current() == 1
    np.testing.assert_array_equal(t0.numpy(), a)
    assert fake_lib.fake_copy_kind() == driver.HIP_MEMCPY_DEVICE_TO_HOST
    assert fake_lib.fake_current() == 0
    np.testing.assert_array_equal(t1.numpy(), a * 2)
    assert repr(Device["AMD:1"]).endswith("gfx942:sramecc+:xnack->") and Device["AMD:1"].renderer.wave_size == 64


def test_device_index_beyond_count_is_refused(amd: driver.HIPLibrary) -> None:
    with pytest.raises(DeviceError, match=r"sees 2 AMD GPU\(s\) \(AMD:0 .. AMD:1\)"):
        device_mod.AMDDevice("AMD:2")


def test_launch_packs_pointers_and_variables_as_clang_lays_them_out(
    amd: driver.HIPLibrary, fake_lib: ctypes.CDLL
) -> None:
    x = Tensor(np.arange(64, dtype=np.float32).reshape(8, 8), device="AMD").realize()
    n = Variable("n", 1, 8)
    before = fake_lib.fake_launches()
    out = (x.shrink((None, (0, n.bind(5)))) * 2).contiguous().realize()
    assert fake_lib.fake_launches() == before + 1
    dims, kernarg = last_launch(fake_lib)
    (prg,) = [p for p in Device["AMD"]._programs.values() if p.info.var_names]
    co = load_code_object(prg.raw.image)
    kernel = co.kernels[prg.raw.name]
    visible = [(off, size, kind) for off, size, kind in kernel.args if not kind.startswith("hidden_")]
    assert [k for _, _, k in visible] == ["global_buffer", "global_buffer", "by_value"]
    assert len(kernarg) == visible[-1][0] + visible[-1][1]  # exactly the explicit arguments
    ptrs = [struct.unpack_from("<Q", kernarg, off)[0] for off, _, k in visible if k == "global_buffer"]
    assert ptrs == [buffer_of(out.uop).handle.ptr, buffer_of(x.uop).handle.ptr]
    assert struct.unpack_from("<i", kernarg, visible[2][0])[0] == 5
    groups, threads = prg.info.extra["launch"]
    assert dims[3:6] == list(threads) and dims[3] * dims[4] * dims[5] <= kernel.max_flat_workgroup_size
    # the grid's x is the symbolic n, evaluated for the launch (how the 8 rows split between the grid and the
    # workgroup is the heuristic's choice); every one of the 5 x 8 outputs has a thread; no dynamic LDS
    assert dims[:3] == [g if isinstance(g, int) else 5 for g in groups] and dims[0] == 5 and dims[6] == 0
    assert dims[0] * dims[1] * dims[2] * dims[3] * dims[4] * dims[5] >= 5 * 8
    assert fake_lib.fake_function().decode() == prg.raw.name


def test_timed_launch_reads_the_events(amd: driver.HIPLibrary) -> None:
    x = Tensor(np.ones(16, np.float32), device="AMD").realize()
    y = (x + 41).realize()
    (prg,) = [p for p in Device["AMD"]._programs.values() if "41" in p.info.src]
    handles = [buffer_of(y.uop).handle, buffer_of(x.uop).handle]
    assert prg(handles, {}, wait=True) == pytest.approx(0.25e-3)  # the stand-in's hipEventElapsedTime: 0.25 ms


def test_allocator_reuses_freed_blocks_and_reports_oom(amd: driver.HIPLibrary) -> None:
    alloc = Device["AMD"].allocator
    a = alloc.alloc(1000)
    alloc.free(a, 1000)
    assert alloc.alloc(1000) is a and alloc.cached_bytes == 0
    view = alloc.offset(a, 8, 16)
    assert view.ptr == a.ptr + 8 and view.base is a
    from xgrad.errors import OutOfMemoryError

    with pytest.raises(OutOfMemoryError, match="cannot allocate"):
        alloc.alloc(1 << 41)
    assert Tensor([1, 2], dtype=dtypes.int32, device="AMD").tolist() == [1, 2]


def test_jit_replay_patches_the_packed_kernarg_and_grid(
    amd: driver.HIPLibrary, fake_lib: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TinyJit's replays on the real library's path (`AMDDevice.batch`, `HIPLibrary.prepare`/`launch_prepared`):
    each launch reads the kernarg buffer packed at capture, with the new input's pointer and the variable's value
    patched in, and the grid that depends on the variable is re-prepared."""
    from xgrad import TinyJit
    from xgrad.uop.ops import UOp

    prepared: list[int] = []
    launch_prepared = driver.HIPLibrary.launch_prepared

    def spy(self: driver.HIPLibrary, p: tuple) -> None:  # type: ignore[type-arg]
        prepared.append(1)
        launch_prepared(self, p)

    monkeypatch.setattr(driver.HIPLibrary, "launch_prepared", spy)

    @TinyJit
    def step(x: Tensor, n: UOp) -> Tensor:
        total = x.sum().contiguous()  # a kernel before the one that reads the input and the variable
        return (x.shrink((None, (0, n))) * 2 + total).contiguous().realize()

    n = Variable("n", 1, 8)
    for i, k in enumerate((2, 3, 5, 7)):
        x = Tensor(np.full((8, 8), i, np.float32), device="AMD").realize()
        before = fake_lib.fake_launches()
        step(x, n.bind(k))
        assert fake_lib.fake_launches() == before + 2
        dims, kernarg = last_launch(fake_lib)
        ptrs = struct.unpack_from("<3Q", kernarg)
        assert buffer_of(x.uop).handle.ptr in ptrs
        assert struct.unpack_from("<i", kernarg, 24)[0] == k
        assert dims[0] == k  # the grid's x is the variable's range, one workgroup a column
    assert len(prepared) == 4  # the two replays, two kernels each, went through the prepared launches
