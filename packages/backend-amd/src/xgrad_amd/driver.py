"""The HIP runtime (libamdhip64) through ctypes: the only module of the backend that names C functions.

`HIPLibrary` wraps the calls the device needs, one method per HIP function (devices, memory, copies, modules,
launches, events, synchronisation); every failed call raises `HIPError` with `hipGetErrorString`'s text.
`xgrad_amd.mock.MockHIP` has the same methods over the RDNA3 emulator; `open_hip()` returns one or the other
(`MOCKGPU=1`), and `hip_available()` says, without raising, whether either can run kernels here and if not, why.

Kernel arguments go to `hipModuleLaunchKernel` as one packed kernarg buffer through `extra`
(HIP_LAUNCH_PARAM_BUFFER_POINTER / HIP_LAUNCH_PARAM_BUFFER_SIZE), laid out by `xgrad_amd.device`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import importlib
import re
from typing import Any, NoReturn, Protocol

from xgrad.errors import DeviceError
from xgrad.helpers import MOCKGPU

LIBRARY_NAMES = ("libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.7", "/opt/rocm/lib/libamdhip64.so")
NO_LIBRARY = (
    "libamdhip64.so (ROCm's HIP runtime) not found: install ROCm (https://rocm.docs.amd.com; e.g. apt-get install "
    "rocm-hip-runtime) or add its lib folder to LD_LIBRARY_PATH; MOCKGPU=1 runs the backend on its RDNA3 emulator"
)
HIP_MEMCPY_HOST_TO_DEVICE, HIP_MEMCPY_DEVICE_TO_HOST, HIP_MEMCPY_DEVICE_TO_DEVICE = 1, 2, 3
HIP_LAUNCH_PARAM_BUFFER_POINTER, HIP_LAUNCH_PARAM_BUFFER_SIZE, HIP_LAUNCH_PARAM_END = 1, 2, 3
PROPERTIES_BYTES = 8192  # more than any hipDeviceProp_t revision; only the arch name is read from it
ARCH_NAME = re.compile(rb"gfx[0-9a-f]{3,4}(?::[a-z]+[+-])*\x00")


class HIPError(DeviceError):
    """A HIP runtime call failed: the function, the error code and HIP's description."""


class HIPUnavailableError(DeviceError):
    """The HIP runtime cannot be used here: the library is missing or there is no AMD GPU."""


Kernarg = ctypes.Array[ctypes.c_char]  # a kernarg buffer packed once and patched in place (`HIP.prepare`)


def _kernarg_extra(buf: Kernarg, nbytes: int) -> tuple[ctypes.Array[ctypes.c_void_p], ctypes.c_size_t]:
    """hipModuleLaunchKernel's `extra` array passing the kernarg buffer `buf` of `nbytes` whole, and the size it
    points to (the caller keeps both alive until the launch)."""
    size = ctypes.c_size_t(nbytes)
    extra = (ctypes.c_void_p * 5)(
        HIP_LAUNCH_PARAM_BUFFER_POINTER,
        ctypes.addressof(buf),
        HIP_LAUNCH_PARAM_BUFFER_SIZE,
        ctypes.addressof(size),
        HIP_LAUNCH_PARAM_END,
    )
    return extra, size


class HIP(Protocol):
    """What `xgrad_amd.device` needs of the HIP runtime (the real library or the mock). Pointers are ints."""

    def device_count(self) -> int: ...
    def set_device(self, index: int) -> None: ...
    def device_arch(self, index: int) -> str: ...
    def device_name(self, index: int) -> str: ...
    def malloc(self, nbytes: int) -> int: ...
    def free(self, ptr: int) -> None: ...
    def memcpy_htod(self, dst: int, src: memoryview) -> None: ...
    def memcpy_dtoh(self, dst: memoryview, src: int) -> None: ...
    def memcpy_dtod(self, dst: int, src: int, nbytes: int) -> None: ...
    def module_load(self, image: bytes) -> Any: ...
    def module_function(self, module: Any, name: str) -> Any: ...
    def module_unload(self, module: Any) -> None: ...
    def launch(
        self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int], shared: int, kernarg: bytes
    ) -> None: ...
    def prepare(
        self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int], shared: int, kernarg: Kernarg
    ) -> Any: ...
    def launch_prepared(self, prepared: Any) -> None: ...
    def event_create(self) -> Any: ...
    def event_record(self, event: Any) -> None: ...
    def event_elapsed_ms(self, start: Any, stop: Any) -> float: ...
    def event_destroy(self, event: Any) -> None: ...
    def synchronize(self) -> None: ...


def _load_library() -> ctypes.CDLL:
    names = [n for n in (ctypes.util.find_library("amdhip64"),) if n] + list(LIBRARY_NAMES)
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise HIPUnavailableError(NO_LIBRARY)


_vp, _int, _uint, _size = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_size_t
# name -> argument types (every HIP call returns hipError_t, an int)
SIGNATURES: dict[str, list[Any]] = {
    "hipGetDeviceCount": [ctypes.POINTER(_int)],
    "hipSetDevice": [_int],
    "hipDeviceGetName": [ctypes.c_char_p, _int, _int],
    "hipGetDevicePropertiesR0600": [_vp, _int],
    "hipMalloc": [ctypes.POINTER(_vp), _size],
    "hipFree": [_vp],
    "hipMemcpy": [_vp, _vp, _size, _int],
    "hipModuleLoadData": [ctypes.POINTER(_vp), _vp],
    "hipModuleGetFunction": [ctypes.POINTER(_vp), _vp, ctypes.c_char_p],
    "hipModuleUnload": [_vp],
    "hipModuleLaunchKernel": [_vp, _uint, _uint, _uint, _uint, _uint, _uint, _uint, _vp, _vp, _vp],
    "hipEventCreate": [ctypes.POINTER(_vp)],
    "hipEventRecord": [_vp, _vp],
    "hipEventSynchronize": [_vp],
    "hipEventElapsedTime": [ctypes.POINTER(ctypes.c_float), _vp, _vp],
    "hipEventDestroy": [_vp],
    "hipDeviceSynchronize": [],
}


class HIPLibrary:
    """libamdhip64 through ctypes (see the module docstring). Opening it loads the library, nothing more."""

    def __init__(self, lib: ctypes.CDLL | None = None) -> None:
        self.lib = lib if lib is not None else _load_library()
        self._fns: dict[str, Any] = {}
        for name, argtypes in SIGNATURES.items():
            fn = getattr(self.lib, name, None)
            if fn is None:
                if name == "hipGetDevicePropertiesR0600":  # HIP < 6 names it without the revision
                    fn = getattr(self.lib, "hipGetDeviceProperties", None)
                if fn is None:
                    raise HIPUnavailableError(f"{self.lib._name} has no {name}: ROCm 6 or newer is needed")
            fn.argtypes, fn.restype = argtypes, _int
            self._fns[name] = fn
        self.lib.hipGetErrorString.argtypes, self.lib.hipGetErrorString.restype = [_int], ctypes.c_char_p
        self._launch_raw = self.lib["hipModuleLaunchKernel"]  # no argtypes: `prepare` converts the arguments once
        self._launch_raw.restype = _int

    def _call(self, name: str, *args: Any) -> None:
        if (status := self._fns[name](*args)) != 0:
            self._call_failed(name, status)

    def _call_failed(self, name: str, status: int) -> NoReturn:
        text = self.lib.hipGetErrorString(status)
        why = text.decode(errors="replace") if text else "unknown error"
        raise HIPError(f"{name} failed with hipError {status}: {why}")

    # ---- devices ----
    def device_count(self) -> int:
        n = _int(0)
        self._call("hipGetDeviceCount", ctypes.byref(n))
        return n.value

    def set_device(self, index: int) -> None:
        self._call("hipSetDevice", index)

    def device_name(self, index: int) -> str:
        buf = ctypes.create_string_buffer(256)
        self._call("hipDeviceGetName", buf, len(buf), index)
        return buf.value.decode(errors="replace")

    def device_arch(self, index: int) -> str:
        """The device's target id (`gcnArchName`, e.g. "gfx1100" or "gfx90a:sramecc+:xnack-"), found in its
        properties struct by its form: the struct's layout changes between ROCm releases, the name's form does not."""
        props = ctypes.create_string_buffer(PROPERTIES_BYTES)
        self._call("hipGetDevicePropertiesR0600", props, index)
        found = ARCH_NAME.search(props.raw, 256)  # after `name[256]`, the marketing name
        if found is None:
            raise HIPError(f"device {index}: no gfx target name in hipGetDeviceProperties")
        return found.group(0)[:-1].decode()

    # ---- memory ----
    def malloc(self, nbytes: int) -> int:
        ptr = _vp()
        self._call("hipMalloc", ctypes.byref(ptr), max(nbytes, 1))
        return int(ptr.value or 0)

    def free(self, ptr: int) -> None:
        self._call("hipFree", _vp(ptr))

    def memcpy_htod(self, dst: int, src: memoryview) -> None:
        flat = src if src.format == "B" and src.ndim == 1 else src.cast("B")
        copy = (ctypes.c_char * flat.nbytes).from_buffer_copy(flat) if flat.readonly else None  # kept alive here
        host = ctypes.cast(copy, _vp) if copy is not None else _address_of(flat)
        self._call("hipMemcpy", _vp(dst), host, flat.nbytes, HIP_MEMCPY_HOST_TO_DEVICE)

    def memcpy_dtoh(self, dst: memoryview, src: int) -> None:
        self._call("hipMemcpy", _address_of(dst), _vp(src), dst.nbytes, HIP_MEMCPY_DEVICE_TO_HOST)

    def memcpy_dtod(self, dst: int, src: int, nbytes: int) -> None:
        self._call("hipMemcpy", _vp(dst), _vp(src), nbytes, HIP_MEMCPY_DEVICE_TO_DEVICE)

    # ---- code ----
    def module_load(self, image: bytes) -> Any:
        module = _vp()
        self._call("hipModuleLoadData", ctypes.byref(module), ctypes.c_char_p(image))
        return module

    def module_function(self, module: Any, name: str) -> Any:
        fn = _vp()
        self._call("hipModuleGetFunction", ctypes.byref(fn), module, name.encode())
        return fn

    def module_unload(self, module: Any) -> None:
        self._call("hipModuleUnload", module)

    def launch(
        self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int], shared: int, kernarg: bytes
    ) -> None:
        buf = ctypes.create_string_buffer(kernarg, max(len(kernarg), 1))
        extra, _size_kept = _kernarg_extra(buf, len(kernarg))
        self._call("hipModuleLaunchKernel", function, *grid, *block, shared, None, None, extra)

    def prepare(
        self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int], shared: int, kernarg: Kernarg
    ) -> tuple[tuple[Any, ...], Any]:
        """A launch of `function` whose C arguments are converted once, for `launch_prepared`; it reads `kernarg`
        when launched, so the buffer may be patched in place between launches (a TinyJit replay's new inputs)."""
        extra, size = _kernarg_extra(kernarg, len(kernarg))
        dims = [_uint(int(x)) for x in (*grid, *block, shared)]
        return (function, *dims, None, None, extra), (size, kernarg)  # the second part is kept alive

    def launch_prepared(self, prepared: tuple[tuple[Any, ...], Any]) -> None:
        if (status := self._launch_raw(*prepared[0])) != 0:
            self._call_failed("hipModuleLaunchKernel", status)

    # ---- events and synchronisation ----
    def event_create(self) -> Any:
        event = _vp()
        self._call("hipEventCreate", ctypes.byref(event))
        return event

    def event_record(self, event: Any) -> None:
        self._call("hipEventRecord", event, None)

    def event_elapsed_ms(self, start: Any, stop: Any) -> float:
        self._call("hipEventSynchronize", stop)
        ms = ctypes.c_float(0.0)
        self._call("hipEventElapsedTime", ctypes.byref(ms), start, stop)
        return float(ms.value)

    def event_destroy(self, event: Any) -> None:
        self._call("hipEventDestroy", event)

    def synchronize(self) -> None:
        self._call("hipDeviceSynchronize")


def _address_of(mv: memoryview) -> Any:
    """A pointer to a writable memoryview's bytes (no copy)."""
    flat = mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")
    return ctypes.cast((ctypes.c_char * flat.nbytes).from_buffer(flat), _vp) if flat.nbytes else None


@functools.cache
def _real_hip() -> HIPLibrary:
    return HIPLibrary()


@functools.cache
def _mock_hip() -> HIP:
    mock = importlib.import_module("xgrad_amd.mock")
    hip: HIP = mock.MockHIP()
    return hip


def open_hip() -> HIP:
    """The process's HIP runtime: the in-process mock over the emulator under MOCKGPU=1, else libamdhip64.
    Raises HIPUnavailableError when the library is missing."""
    return _mock_hip() if MOCKGPU.value else _real_hip()


def hip_available() -> tuple[bool, str]:
    """(True, "") when `open_hip()` has at least one device, else (False, why). Never raises."""
    if MOCKGPU.value:
        try:
            importlib.import_module("xgrad_amd.mock")
            emulate = importlib.import_module("xgrad_amd.emulate")
        except Exception as e:
            return False, f"MOCKGPU=1, but the RDNA3 emulator failed to import: {type(e).__name__}: {e}"
        if not hasattr(emulate, "launch"):
            return False, "MOCKGPU=1, but the RDNA3 emulator (xgrad_amd.emulate.launch) is not built yet"
        return True, ""
    try:
        count = _real_hip().device_count()
    except HIPUnavailableError as e:
        return False, str(e)
    except Exception as e:  # e.g. hipErrorNoDevice from a driver without GPUs
        return False, f"the HIP runtime found no usable AMD GPU: {type(e).__name__}: {e}"
    if count == 0:
        return False, "libamdhip64 is installed but hipGetDeviceCount found no AMD GPU"
    return True, ""


__all__ = ["HIP", "HIPLibrary", "Kernarg", "HIPError", "HIPUnavailableError", "open_hip", "hip_available", "NO_LIBRARY"]
