"""The CUDA driver API (`libcuda.so.1`) through ctypes: the only module of the backend that names C functions.

`CUDADriver` wraps the ~25 functions the NV device needs (init, devices and their attributes, primary contexts,
memory, copies, module loading, function attributes, launch, events, sync, error strings) behind a small Python
interface of ints and bytes. `xgrad_nv.mock.MockDriver` offers the same interface in-process (MOCKGPU=1), so
`xgrad_nv.device` runs unchanged above either. Every failing call raises `CUDADriverError` naming the call and the
CUDA error (name and description).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from xgrad.errors import DeviceError, OutOfMemoryError

# CUresult values the backend treats specially (cuda.h)
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222
# CUdevice_attribute / CUfunction_attribute values (cuda.h)
ATTR_MULTIPROCESSOR_COUNT = 16
ATTR_COMPUTE_CAPABILITY_MAJOR = 75
ATTR_COMPUTE_CAPABILITY_MINOR = 76
ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
DRIVER_HINT = "install the NVIDIA driver (580 or newer for CUDA 13.0, whose NVRTC emits PTX ISA 9.0)"

Arg = tuple[str, int]  # a kernel argument: ("ptr", device address) or ("i32", value)


class CUDADriverError(DeviceError):
    """A CUDA driver call failed: `call` is the function, `code` the CUresult, `name` its CUDA error name."""

    def __init__(self, call: str, code: int, name: str, description: str, hint: str = "") -> None:
        self.call, self.code, self.name = call, code, name
        super().__init__(f"{call} failed: {name} ({code}): {description}{'; ' + hint if hint else ''}")


class CUDAOutOfMemoryError(CUDADriverError, OutOfMemoryError):
    """cuMemAlloc found no memory (CUDA_ERROR_OUT_OF_MEMORY)."""


_vp, _i, _u, _sz, _u64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_size_t, ctypes.c_uint64
_P = ctypes.POINTER
PROTOTYPES: dict[str, list[Any]] = {
    "cuInit": [_u],
    "cuDriverGetVersion": [_P(_i)],
    "cuDeviceGetCount": [_P(_i)],
    "cuDeviceGet": [_P(_i), _i],
    "cuDeviceGetName": [ctypes.c_char_p, _i, _i],
    "cuDeviceGetAttribute": [_P(_i), _i, _i],
    "cuDeviceTotalMem_v2": [_P(_sz), _i],
    "cuDevicePrimaryCtxRetain": [_P(_vp), _i],
    "cuCtxSetCurrent": [_vp],
    "cuCtxSynchronize": [],
    "cuMemAlloc_v2": [_P(_u64), _sz],
    "cuMemFree_v2": [_u64],
    "cuMemGetInfo_v2": [_P(_sz), _P(_sz)],
    "cuMemcpyHtoD_v2": [_u64, _vp, _sz],
    "cuMemcpyDtoH_v2": [_vp, _u64, _sz],
    "cuMemcpyDtoD_v2": [_u64, _u64, _sz],
    "cuMemcpyHtoDAsync_v2": [_u64, _vp, _sz, _vp],
    "cuMemcpyDtoHAsync_v2": [_vp, _u64, _sz, _vp],
    "cuModuleLoadData": [_P(_vp), ctypes.c_char_p],
    "cuModuleUnload": [_vp],
    "cuModuleGetFunction": [_P(_vp), _vp, ctypes.c_char_p],
    "cuFuncSetAttribute": [_vp, _i, _i],
    "cuLaunchKernel": [_vp, _u, _u, _u, _u, _u, _u, _u, _vp, _P(_vp), _P(_vp)],
    "cuEventCreate": [_P(_vp), _u],
    "cuEventRecord": [_vp, _vp],
    "cuEventSynchronize": [_vp],
    "cuEventElapsedTime": [_P(ctypes.c_float), _vp, _vp],
    "cuEventDestroy_v2": [_vp],
    "cuGetErrorName": [_i, _P(ctypes.c_char_p)],
    "cuGetErrorString": [_i, _P(ctypes.c_char_p)],
}


# functions whose versioned symbol (what cuda.h's #define picks) newer drivers export first, and older ones only plain
VERSIONED = {"cuEventElapsedTime": "cuEventElapsedTime_v2"}  # _v2 since CUDA 12.8


def load_libcuda(name: str = "libcuda.so.1") -> ctypes.CDLL:
    """libcuda with the backend's prototypes; OSError when the driver is not installed, AttributeError naming a
    function it lacks."""
    lib = ctypes.CDLL(name)
    for fn_name, args in PROTOTYPES.items():
        versioned = VERSIONED.get(fn_name)
        fn = getattr(lib, versioned) if versioned is not None and hasattr(lib, versioned) else getattr(lib, fn_name)
        fn.argtypes, fn.restype = args, ctypes.c_int
        setattr(lib, fn_name, fn)
    return lib


def host_pointer(mv: memoryview) -> tuple[int, Any]:
    """The address of `mv`'s bytes and an object to keep alive while it is used (a copy when `mv` is read-only)."""
    flat = mv if mv.format == "B" and mv.ndim == 1 and mv.contiguous else mv.cast("B")
    if flat.readonly:
        buf: Any = (ctypes.c_char * flat.nbytes).from_buffer_copy(flat)
    else:
        buf = (ctypes.c_char * flat.nbytes).from_buffer(flat)
    return ctypes.addressof(buf), buf


class PackedArgs:
    """A launch's `kernelParams`, built once: one u64 per pointer and one s32 per int, and the array of their
    addresses that cuLaunchKernel reads. `set` changes one value in place (a TinyJit replay's new input)."""

    __slots__ = ("args", "params", "values")

    def __init__(self, args: Sequence[Arg]) -> None:
        self.args = list(args)
        self.values = [ctypes.c_uint64(v) if kind == "ptr" else ctypes.c_int32(v) for kind, v in args]
        self.params = (ctypes.c_void_p * max(len(self.values), 1))(*[ctypes.addressof(v) for v in self.values])

    def set(self, i: int, value: int) -> None:
        self.values[i].value = value
        self.args[i] = (self.args[i][0], value)


class CUDADriver:
    """The CUDA driver of this machine. Handles (contexts, modules, functions, events) are ints; device memory is
    addressed by ints (CUdeviceptr). `kind` says what runs the kernels (here: "cuda")."""

    kind = "cuda"
    loads = "cubin"  # the module images it loads (a cubin; PTX text works too, JIT-compiled by the driver)

    def __init__(self, lib: ctypes.CDLL | None = None) -> None:
        self.lib = lib if lib is not None else load_libcuda()
        self.check("cuInit", self.lib.cuInit(0))
        self._launch_raw = self.lib["cuLaunchKernel"]  # without argtypes: for `prepare`'s converted arguments
        self._launch_raw.restype = ctypes.c_int

    def error_text(self, code: int) -> tuple[str, str]:
        name, desc = ctypes.c_char_p(), ctypes.c_char_p()
        self.lib.cuGetErrorName(code, ctypes.byref(name))
        self.lib.cuGetErrorString(code, ctypes.byref(desc))
        return (name.value or b"CUDA_ERROR_UNKNOWN").decode(), (desc.value or b"unknown error").decode()

    def check(self, call: str, code: int) -> None:
        if code == 0:
            return
        name, desc = self.error_text(code)
        if code == CUDA_ERROR_OUT_OF_MEMORY:
            raise CUDAOutOfMemoryError(call, code, name, desc, "free tensors or use a smaller batch")
        hint = {
            CUDA_ERROR_NO_DEVICE: "no NVIDIA GPU is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)",
            CUDA_ERROR_UNSUPPORTED_PTX_VERSION: f"the driver is older than the PTX ISA of this kernel: {DRIVER_HINT}",
        }.get(code, "")
        raise CUDADriverError(call, code, name, desc, hint)

    # ---- devices ----
    def driver_version(self) -> int:
        """CUDA version the driver supports, as 1000 * major + 10 * minor (13000 for 13.0)."""
        v = ctypes.c_int()
        self.check("cuDriverGetVersion", self.lib.cuDriverGetVersion(ctypes.byref(v)))
        return v.value

    def device_count(self) -> int:
        n = ctypes.c_int()
        self.check("cuDeviceGetCount", self.lib.cuDeviceGetCount(ctypes.byref(n)))
        return n.value

    def _device(self, ordinal: int) -> int:
        dev = ctypes.c_int()
        self.check("cuDeviceGet", self.lib.cuDeviceGet(ctypes.byref(dev), ordinal))
        return dev.value

    def device_name(self, ordinal: int) -> str:
        buf = ctypes.create_string_buffer(256)
        self.check("cuDeviceGetName", self.lib.cuDeviceGetName(buf, 256, self._device(ordinal)))
        return buf.value.decode()

    def attribute(self, ordinal: int, attr: int) -> int:
        v = ctypes.c_int()
        self.check("cuDeviceGetAttribute", self.lib.cuDeviceGetAttribute(ctypes.byref(v), attr, self._device(ordinal)))
        return v.value

    def compute_capability(self, ordinal: int) -> tuple[int, int]:
        return (
            self.attribute(ordinal, ATTR_COMPUTE_CAPABILITY_MAJOR),
            self.attribute(ordinal, ATTR_COMPUTE_CAPABILITY_MINOR),
        )

    def total_memory(self, ordinal: int) -> int:
        v = ctypes.c_size_t()
        self.check("cuDeviceTotalMem_v2", self.lib.cuDeviceTotalMem_v2(ctypes.byref(v), self._device(ordinal)))
        return v.value

    # ---- contexts ----
    def open_context(self, ordinal: int) -> int:
        """The device's primary context (retained), made current."""
        ctx = ctypes.c_void_p()
        self.check(
            "cuDevicePrimaryCtxRetain", self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), self._device(ordinal))
        )
        self.set_current(ctx.value or 0)
        return ctx.value or 0

    def set_current(self, ctx: int) -> None:
        self.check("cuCtxSetCurrent", self.lib.cuCtxSetCurrent(ctx))

    def synchronize(self) -> None:
        self.check("cuCtxSynchronize", self.lib.cuCtxSynchronize())

    # ---- memory ----
    def mem_alloc(self, nbytes: int) -> int:
        ptr = ctypes.c_uint64()
        self.check("cuMemAlloc_v2", self.lib.cuMemAlloc_v2(ctypes.byref(ptr), max(nbytes, 1)))
        return ptr.value

    def mem_free(self, ptr: int) -> None:
        self.check("cuMemFree_v2", self.lib.cuMemFree_v2(ptr))

    def mem_info(self) -> tuple[int, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.check("cuMemGetInfo_v2", self.lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)))
        return free.value, total.value

    def copy_htod(self, dst: int, src: memoryview) -> None:
        ptr, keep = host_pointer(src)
        self.check("cuMemcpyHtoD_v2", self.lib.cuMemcpyHtoD_v2(dst, ptr, src.nbytes))
        del keep

    def copy_dtoh(self, dst: memoryview, src: int) -> None:
        ptr, keep = host_pointer(dst)
        if dst.readonly:
            raise DeviceError("copy from the GPU into a read-only buffer")
        self.check("cuMemcpyDtoH_v2", self.lib.cuMemcpyDtoH_v2(ptr, src, dst.nbytes))
        del keep

    def copy_dtod(self, dst: int, src: int, nbytes: int) -> None:
        self.check("cuMemcpyDtoD_v2", self.lib.cuMemcpyDtoD_v2(dst, src, nbytes))

    # ---- modules and launches ----
    def load_module(self, image: bytes) -> int:
        mod = ctypes.c_void_p()
        self.check("cuModuleLoadData", self.lib.cuModuleLoadData(ctypes.byref(mod), image))
        return mod.value or 0

    def unload_module(self, module: int) -> None:
        self.check("cuModuleUnload", self.lib.cuModuleUnload(module))

    def get_function(self, module: int, name: str) -> int:
        fn = ctypes.c_void_p()
        self.check("cuModuleGetFunction", self.lib.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()))
        return fn.value or 0

    def set_max_dynamic_shared(self, function: int, nbytes: int) -> None:
        """Allow `function` more than 48 KiB of dynamic shared memory (up to the arch's opt-in limit)."""
        code = self.lib.cuFuncSetAttribute(function, FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes)
        self.check("cuFuncSetAttribute", code)

    def pack(self, args: Sequence[Arg]) -> PackedArgs:
        """`args` as a kernel's parameter array, to launch many times (`launch_packed`) and patch in place."""
        return PackedArgs(args)

    def launch_packed(
        self, function: int, grid: Sequence[int], block: Sequence[int], shared: int, packed: PackedArgs
    ) -> None:
        """Launch `function` on the null stream with the parameters `packed` holds now."""
        code = self.lib.cuLaunchKernel(function, *grid, *block, shared, None, packed.params, None)
        if code:
            self.check("cuLaunchKernel", code)

    def launch(
        self, function: int, grid: Sequence[int], block: Sequence[int], shared: int, args: Sequence[Arg]
    ) -> None:
        """Launch `function` on the null stream; `args` are packed as the kernel's parameters (u64 pointers, s32)."""
        self.launch_packed(function, grid, block, shared, PackedArgs(args))

    def prepare(
        self, function: int, grid: Sequence[int], block: Sequence[int], shared: int, packed: PackedArgs
    ) -> tuple[Any, ...]:
        """A launch whose C arguments are converted once (`launch_prepared` calls cuLaunchKernel with them as they
        are: 1.6 instead of 4 us a call); `packed` may still be patched in place."""
        u = ctypes.c_uint
        dims = [u(int(x)) for x in (*grid, *block, shared)]
        return (ctypes.c_void_p(function), *dims, None, packed.params, None)

    def launch_prepared(self, prepared: tuple[Any, ...]) -> None:
        if code := self._launch_raw(*prepared):
            self.check("cuLaunchKernel", code)

    # ---- events ----
    def event_create(self) -> int:
        ev = ctypes.c_void_p()
        self.check("cuEventCreate", self.lib.cuEventCreate(ctypes.byref(ev), 0))
        return ev.value or 0

    def event_record(self, event: int) -> None:
        self.check("cuEventRecord", self.lib.cuEventRecord(event, None))

    def event_synchronize(self, event: int) -> None:
        self.check("cuEventSynchronize", self.lib.cuEventSynchronize(event))

    def event_elapsed_ms(self, start: int, end: int) -> float:
        ms = ctypes.c_float()
        self.check("cuEventElapsedTime", self.lib.cuEventElapsedTime(ctypes.byref(ms), start, end))
        return ms.value

    def event_destroy(self, event: int) -> None:
        self.check("cuEventDestroy_v2", self.lib.cuEventDestroy_v2(event))


__all__ = [
    "Arg",
    "CUDADriver",
    "CUDADriverError",
    "CUDAOutOfMemoryError",
    "DRIVER_HINT",
    "PackedArgs",
    "PROTOTYPES",
    "host_pointer",
    "load_libcuda",
]
