"""xgrad_nv.driver's ctypes binding against a stand-in libcuda (fake_cuda/fake_cuda.c) compiled from the toolkit's
cuda.h, so every function has the C signature the real driver exports: values and pointers cross the boundary
intact (device names, attributes, copies both ways, module images, kernel names, launch dimensions and the packed
kernel parameters), errors carry the call and the CUDA error name, out-of-memory is OutOfMemoryError. Then NVDevice
runs its real-driver path on it: a kernel compiled by NVRTC to a cubin is loaded and launched with the buffers'
pointers and the variables' values."""

from __future__ import annotations

import ctypes
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

from xgrad.errors import OutOfMemoryError
from xgrad_nv import driver as drv_mod
from xgrad_nv.compiler import find_cuda_include
from xgrad_nv.driver import CUDADriver, CUDADriverError, load_libcuda

SRC = pathlib.Path(__file__).parent / "fake_cuda" / "fake_cuda.c"


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    include = find_cuda_include()
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if include is None or not (include / "cuda.h").exists() or cc is None:
        pytest.skip("needs the CUDA toolkit's cuda.h and a C compiler (CI has both)")
    out = tmp_path_factory.mktemp("fakecuda") / "libfakecuda.so"
    subprocess.run([cc, "-shared", "-fPIC", "-Wall", "-Werror", f"-I{include}", str(SRC), "-o", str(out)], check=True)
    return out


@pytest.fixture
def drv(fake_lib: pathlib.Path) -> CUDADriver:
    return CUDADriver(load_libcuda(str(fake_lib)))


def hooks(fake_lib: pathlib.Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(fake_lib))
    lib.fake_param.restype = ctypes.c_longlong
    lib.fake_param.argtypes = [ctypes.c_int]
    lib.fake_dim.restype = ctypes.c_uint
    lib.fake_dim.argtypes = [ctypes.c_int]
    lib.fake_function_name.restype = ctypes.c_char_p
    lib.fake_image_head.restype = ctypes.POINTER(ctypes.c_ubyte)
    lib.fake_func_attr.argtypes = [ctypes.c_int]
    lib.fake_expect.argtypes = [ctypes.c_char_p]
    return lib


def test_devices_and_attributes_cross_the_binding(drv: CUDADriver) -> None:
    assert drv.driver_version() == 13000 and drv.device_count() == 2
    assert drv.device_name(1) == "Fake H200 1"
    assert drv.compute_capability(0) == (9, 0)
    assert drv.attribute(0, drv_mod.ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN) == 232448
    assert drv.total_memory(0) == 141 << 30
    ctx = drv.open_context(1)
    assert ctx == 0x1001
    drv.synchronize()


def test_copies_round_trip_through_device_memory(drv: CUDADriver) -> None:
    drv.open_context(0)
    data = np.arange(1000, dtype=np.float32)
    a, b = drv.mem_alloc(data.nbytes), drv.mem_alloc(data.nbytes)
    drv.copy_htod(a, memoryview(data.tobytes()))  # read-only source: copied first
    drv.copy_dtod(b, a, data.nbytes)
    out = np.zeros_like(data)
    drv.copy_dtoh(memoryview(out), b)
    np.testing.assert_array_equal(out, data)
    free, total = drv.mem_info()
    assert total - free >= 2 * data.nbytes
    drv.mem_free(a)
    drv.mem_free(b)


def test_module_function_launch_and_events(drv: CUDADriver, fake_lib: pathlib.Path) -> None:
    fake = hooks(fake_lib)
    drv.open_context(0)
    mod = drv.load_module(b"\x7fELF-cubin-bytes")
    assert bytes(fake.fake_image_head()[:4]) == b"\x7fELF"
    fn = drv.get_function(mod, "r_32_16_4")
    assert fake.fake_function_name() == b"r_32_16_4"
    drv.set_max_dynamic_shared(fn, 100 * 1024)
    assert (fake.fake_func_attr(0), fake.fake_func_attr(1)) == (drv_mod.FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES, 102400)
    fake.fake_expect(b"ppi")
    ptr = drv.mem_alloc(64)
    drv.launch(fn, (7, 2, 1), (128, 2, 1), 4096, [("ptr", ptr), ("ptr", 2**40 + 8), ("i32", -5)])
    assert [fake.fake_dim(i) for i in range(7)] == [7, 2, 1, 128, 2, 1, 4096]
    assert [fake.fake_param(i) for i in range(3)] == [ptr, 2**40 + 8, -5]
    start, end = drv.event_create(), drv.event_create()
    drv.event_record(start)
    drv.event_record(end)
    drv.event_synchronize(end)
    assert drv.event_elapsed_ms(start, end) == pytest.approx(1.5)
    drv.event_destroy(start)


def test_errors_name_the_call_and_the_cuda_error(drv: CUDADriver) -> None:
    drv.open_context(0)
    with pytest.raises(CUDADriverError, match=r"cuModuleGetFunction failed: CUDA_ERROR_NOT_FOUND \(500\)"):
        drv.get_function(drv.load_module(b"\x7fELF"), "missing")
    with pytest.raises(CUDADriverError, match="UNSUPPORTED_PTX_VERSION.*580 or newer"):
        drv.load_module(b".version 99.0\n")
    with pytest.raises(OutOfMemoryError, match="cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY"):
        drv.mem_alloc(2 << 30)
    with pytest.raises(CUDADriverError, match="cuDeviceGet failed: CUDA_ERROR_INVALID_DEVICE"):
        drv.device_name(7)


def test_nv_device_launches_a_cubin_with_its_buffers_and_variables(
    fake_lib: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVDevice on the real-driver path: NVRTC builds a cubin for the GPU's sm_90, the driver gets it, and a
    launch packs the output's and input's pointers and the variable's value, with grid and block from the kernel."""
    from xgrad import Tensor, Variable
    from xgrad_nv import device as dev_mod
    from xgrad_nv.compiler import load_nvrtc

    if load_nvrtc() is None:
        pytest.skip("NVRTC is not installed (pip install nvidia-cuda-nvrtc==13.0.*)")
    fake = hooks(fake_lib)
    monkeypatch.setattr(dev_mod, "get_driver", lambda arch=None: CUDADriver(load_libcuda(str(fake_lib))))
    dev = dev_mod.NVDevice("NV:1")
    assert dev.compile_arch == "sm_90" and dev.ctx == 0x1001 and dev.driver.kind == "cuda"
    n = Variable("n", 1, 64)
    x = Tensor.ones(4, 64, device="NULL:CUDA:sm_90").contiguous()
    ast = kernel_ast(lambda: (x.shrink((None, (0, n.bind(40)))) * 3).sum(1))
    prg = dev.compile(ast)
    assert bytes(fake.fake_image_head()[:4]) == b"\x7fELF" and fake.fake_function_name() == prg.info.name.encode()
    out, inp = dev.allocator.alloc(16), dev.allocator.alloc(4 * 64 * 4)
    fake.fake_expect(b"ppi")
    assert prg([out, inp], {"n": 40}, wait=True) == pytest.approx(1.5e-3)
    assert [fake.fake_param(i) for i in range(3)] == [out.ptr, inp.ptr, 40]
    groups, threads = prg.info.extra["launch"]
    assert [fake.fake_dim(i) for i in range(6)] == [*groups, *threads]
    data = np.arange(4, dtype=np.float32)
    dev.allocator.copyin(out, memoryview(data))
    back = np.zeros(4, np.float32)
    dev.allocator.copyout(memoryview(back), out)
    np.testing.assert_array_equal(back, data)


def kernel_ast(fn: object) -> object:
    """The AST of the kernel `fn()` realizes on a NULL device (captured at its compile)."""
    from xgrad.device import Device

    null = Device["NULL:CUDA:sm_90"]
    seen: list[object] = []
    orig = null.compile

    def spy(ast: object) -> object:
        seen.append(ast)
        return orig(ast)

    null.compile = spy
    try:
        fn().realize()  # type: ignore[operator]
    finally:
        del null.compile
    return seen[-1]


def test_availability_on_a_working_driver_lists_the_gpus(
    fake_lib: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xgrad.helpers import Context
    from xgrad_nv.compiler import load_nvrtc
    from xgrad_nv.plugin import nv_available

    if load_nvrtc() is None:
        pytest.skip("NVRTC is not installed (pip install nvidia-cuda-nvrtc==13.0.*)")
    monkeypatch.setattr(drv_mod, "load_libcuda", lambda name="libcuda.so.1": load_libcuda(str(fake_lib)))
    with Context(MOCKGPU=0):
        ok, why = nv_available()
    assert ok and why.startswith("2 GPU(s): Fake H200 0, Fake H200 1; CUDA 13.0; NVRTC 13.0 at ")


def test_jit_batch_patches_inputs_variables_and_grids(fake_lib: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVDevice.batch packs each launch's parameters once; a replay patches the new input's pointer, the variable's
    value and the grid that depends on it, and launches every kernel with them."""
    from xgrad.buffer import ProgramInfo
    from xgrad.uop.ops import UOp
    from xgrad_nv import device as dev_mod

    fake = hooks(fake_lib)
    monkeypatch.setattr(dev_mod, "get_driver", lambda arch=None: CUDADriver(load_libcuda(str(fake_lib))))
    dev = dev_mod.NVDevice("NV")
    n = UOp.variable("n", 1, 4096)

    class Program:
        def __init__(self, function: int, groups: tuple[object, ...]) -> None:
            self.info = ProgramInfo("k", "", 0, 0, 1, ("n",), (0,), {"launch": (groups, (128, 1, 1))})
            # an NVProgram's function handle, and no dynamic shared memory (info.extra has no "shared")
            self.raw = type("Raw", (), {"function": function, "dynamic_shared": lambda raw, info: 0})()

    out, weight, x1, x2 = (dev.allocator.alloc(64) for _ in range(4))
    batch = dev.batch(
        [
            (Program(0x3000, (4, 1, 1)), [out, weight], (), {"n": 5}),
            (Program(0x3001, ((n + 127) // 128, 1, 1)), [None, out], ((0, 0),), {"n": 5}),
        ]
    )
    fake.fake_expect(b"ppi")
    for x, value in ((x1, 300), (x2, 1000)):
        batch([x], {"n": value})  # the fake keeps the last launch's parameters and dimensions
        assert [fake.fake_param(i) for i in range(3)] == [x.ptr, out.ptr, value]
        assert [fake.fake_dim(i) for i in range(4)] == [-(-value // 128), 1, 1, 128]
