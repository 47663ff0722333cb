"""The AMD device: `AMD`, `AMD:1`, ... one per GPU the HIP runtime sees (under MOCKGPU=1 one emulated gfx1100).

In: kernel ASTs and buffers from the engine. Out: kernels rendered by `HIPRenderer` for the GPU's own arch, built by
clang-19 into code objects, loaded with `hipModuleLoadData` and launched with their arguments packed into one
kernarg buffer: the PARAM pointers (8 bytes each, PARAM index order), then the variables (4-byte ints, program
order), as `xgrad_amd.renderer` declares the kernel. The grid is the `gidx` SPECIALs' sizes (evaluated with the
variables), the workgroup the `lidx` ones'. Memory comes from `hipMalloc` through an allocator that keeps freed
blocks for reuse (hipFree synchronises the device); copies are `hipMemcpy`. A TinyJit replay launches its kernels
through `AMDBatch`: kernarg buffers packed once, the new inputs' pointers and variables patched in. This module runs
unchanged above the real library (`xgrad_amd.driver.HIPLibrary`) and its mock (`xgrad_amd.mock.MockHIP`).
"""

from __future__ import annotations

import ctypes
import struct
import time
from collections.abc import Sequence
from typing import Any

from xgrad.buffer import ProgramInfo
from xgrad.device import parse_device
from xgrad.errors import DeviceError, OutOfMemoryError
from xgrad.uop.ops import UOp
from xgrad_amd.compiler import HIPCompiler
from xgrad_amd.driver import HIP, HIPError, Kernarg, open_hip
from xgrad_amd.renderer import HIPRenderer, kernel_params
from xgrad_codegen.device import BlockCache, CompiledDevice, launch_dims

DEFAULT_CACHE_LIMIT = 1 << 30  # bytes of freed blocks kept for reuse, per device
HIP_ERROR_OUT_OF_MEMORY = 2


# what TinyJit hands `batch` per kernel: the program, its buffer handles (None where an input goes), (handle position,
# input index) pairs and the variable values it was captured with
Launch = tuple[Any, list[Any], tuple[tuple[int, int], ...], dict[str, int]]


class AMDBuffer:
    """A device allocation or a view into one: `ptr` is its device address; `base` the allocation a view is in."""

    __slots__ = ("base", "nbytes", "ptr")

    def __init__(self, ptr: int, nbytes: int, base: AMDBuffer | None = None) -> None:
        self.ptr, self.nbytes, self.base = ptr, nbytes, base

    def __repr__(self) -> str:
        return f"<AMDBuffer {self.ptr:#x} {self.nbytes} bytes>"


class AMDAllocator:
    """hipMalloc'd buffers of one GPU, with an LRU cache of freed blocks by size (most recently freed reused first)."""

    def __init__(self, device: AMDDevice, cache_limit: int = DEFAULT_CACHE_LIMIT) -> None:
        self.device = device
        self._cache: BlockCache[AMDBuffer] = BlockCache(cache_limit)

    @property
    def cached_bytes(self) -> int:
        return self._cache.nbytes

    def alloc(self, nbytes: int) -> AMDBuffer:
        if nbytes < 0:
            raise ValueError(f"cannot allocate a negative number of bytes: {nbytes}")
        if (buf := self._cache.take(nbytes)) is not None:
            return buf
        hip = self.device.use()
        try:
            return AMDBuffer(hip.malloc(nbytes), nbytes)
        except HIPError as e:
            if f"hipError {HIP_ERROR_OUT_OF_MEMORY}:" not in str(e):
                raise
        self.free_cache()
        try:
            return AMDBuffer(hip.malloc(nbytes), nbytes)
        except HIPError as e:
            raise OutOfMemoryError(
                f"{self.device.name}: cannot allocate {nbytes:,} bytes ({e}); free tensors or use smaller batches"
            ) from None

    def free(self, handle: AMDBuffer, nbytes: int) -> None:
        assert handle.base is None, "free the base buffer, not an offset view"
        for block in self._cache.put(handle, nbytes):
            self.device.use().free(block.ptr)

    def free_cache(self) -> None:
        """hipFree every cached block."""
        hip = self.device.use()
        for block in self._cache.clear():
            hip.free(block.ptr)

    def copyin(self, dest: AMDBuffer, src: memoryview) -> None:
        if src.nbytes != dest.nbytes:
            raise ValueError(f"copyin of {src.nbytes} bytes into a buffer of {dest.nbytes} bytes")
        self.device.use().memcpy_htod(dest.ptr, src)

    def copyout(self, dest: memoryview, src: AMDBuffer) -> None:
        if dest.nbytes != src.nbytes:
            raise ValueError(f"copyout of a buffer of {src.nbytes} bytes into {dest.nbytes} bytes")
        hip = self.device.use()
        hip.synchronize()  # kernels run asynchronously; their results must be there first
        hip.memcpy_dtoh(dest, src.ptr)

    def transfer(self, dest: AMDBuffer, src: AMDBuffer, nbytes: int) -> None:
        """Device-to-device copy within this GPU."""
        self.device.use().memcpy_dtod(dest.ptr, src.ptr, nbytes)

    def offset(self, handle: AMDBuffer, offset: int, nbytes: int) -> AMDBuffer:
        if offset < 0 or nbytes < 0 or offset + nbytes > handle.nbytes:
            raise ValueError(f"view [{offset}, {offset + nbytes}) is outside a buffer of {handle.nbytes} bytes")
        return AMDBuffer(handle.ptr + offset, nbytes, handle.base if handle.base is not None else handle)


class AMDProgram:
    """A loaded kernel: its module and function, and how many pointers and variables its signature takes."""

    def __init__(self, device: AMDDevice, name: str, image: bytes, buffers: int, var_names: tuple[str, ...]) -> None:
        self.device, self.name, self.image = device, name, image
        self.buffers, self.var_names = buffers, var_names
        hip = device.use()
        self.module = hip.module_load(image)
        self.function = hip.module_function(self.module, name)

    def kernarg(self, bufs: list[AMDBuffer | None], vals: dict[str, int]) -> bytes:
        """The packed explicit arguments: `buffers` device pointers (0 for None, a buffer patched in later), then the
        variables as int32 (at `var_offset`)."""
        if len(bufs) < self.buffers:
            raise DeviceError(f"kernel {self.name} takes {self.buffers} buffers, the launch passed {len(bufs)}")
        args = struct.pack(f"<{self.buffers}Q", *(0 if b is None else b.ptr for b in bufs[: self.buffers]))
        return args + struct.pack(f"<{len(self.var_names)}i", *(vals[n] for n in self.var_names))

    def var_offset(self, name: str) -> int:
        """Where variable `name` is in the kernarg buffer."""
        return 8 * self.buffers + 4 * self.var_names.index(name)


class AMDDevice(CompiledDevice):
    """One AMD GPU (`AMD:<index>`): its arch picks the renderer and clang's target."""

    _current: dict[int, int] = {}  # id(hip) -> the device index last made current with hipSetDevice

    def __init__(self, name: str) -> None:
        parsed = parse_device(name)
        self.index = parsed.index
        self.hip: HIP = open_hip()
        count = self.hip.device_count()
        if not 0 <= self.index < count:
            raise DeviceError(f"{name}: the HIP runtime sees {count} AMD GPU(s) (AMD:0 .. AMD:{count - 1})")
        self.arch = self.hip.device_arch(self.index)
        if parsed.arch is not None and parsed.arch != self.arch:
            raise DeviceError(f"{name}: device {self.index} is a {self.arch}, not a {parsed.arch}")
        renderer = HIPRenderer(self.arch)  # DeviceError for an arch clang-19 cannot build (gfx950)
        super().__init__(name, AMDAllocator(self), renderer, HIPCompiler(self.arch), self._no_factory)

    def use(self) -> HIP:
        """The runtime, with this device current (HIP's current device is per thread)."""
        if AMDDevice._current.get(id(self.hip)) != self.index:
            self.hip.set_device(self.index)
            AMDDevice._current[id(self.hip)] = self.index
        return self.hip

    @staticmethod
    def _no_factory(name: str, lib: bytes) -> Any:
        raise AssertionError("AMDDevice.build loads programs itself")

    def build(self, name: str, uops: list[UOp], src: str) -> AMDProgram:
        buffers, var_names = kernel_params(uops)
        return AMDProgram(self, name, self.compiler.compile(src), buffers, var_names)

    def launch(
        self, raw: AMDProgram, bufs: list[Any], info: ProgramInfo, vals: dict[str, int], wait: bool
    ) -> float | None:
        grid, threads = launch_dims(info, vals)
        if min(grid) <= 0:  # no workgroups (an empty tensor): HIP refuses a zero grid, and there is nothing to do
            return 0.0 if wait else None
        kernarg = raw.kernarg(bufs, vals)
        hip = self.use()
        if not wait:
            hip.launch(raw.function, grid, threads, 0, kernarg)
            return None
        start, stop = hip.event_create(), hip.event_create()
        t0 = time.perf_counter()
        hip.event_record(start)
        hip.launch(raw.function, grid, threads, 0, kernarg)
        hip.event_record(stop)
        ms = hip.event_elapsed_ms(start, stop)
        hip.event_destroy(start)
        hip.event_destroy(stop)
        return ms / 1e3 if ms > 0 else time.perf_counter() - t0

    def synchronize(self) -> None:
        self.use().synchronize()

    def batch(self, launches: Sequence[Launch]) -> AMDBatch:
        """TinyJit's replay of consecutive kernels on this GPU (see `AMDBatch`)."""
        return AMDBatch(self, launches)

    def __repr__(self) -> str:
        return f"<AMDDevice {self.name} {self.arch}>"


class AMDBatch:
    """Kernels to launch in order (`Launch`es). Each kernel's kernarg buffer is packed once and its launch prepared
    once (`HIP.prepare`); a call patches the inputs' pointers and the variables' values into the buffers in place,
    re-prepares the launches whose grid depends on a variable, and launches all."""

    def __init__(self, device: AMDDevice, launches: Sequence[Launch]) -> None:
        self.device = device
        hip = device.use()
        self._items: list[tuple[AMDProgram, ProgramInfo, Kernarg, dict[str, int]]] = []
        self._prepared: list[Any] = []  # per kernel, None when its grid is empty (nothing to launch)
        self._inputs: list[tuple[Kernarg, int, int]] = []  # (kernarg, byte offset, input index)
        self._vars: list[tuple[Kernarg, int, str]] = []  # (kernarg, byte offset, variable name)
        self._sized: list[int] = []  # kernels whose grid depends on a variable
        for i, (program, handles, from_inputs, var_vals) in enumerate(launches):
            raw: AMDProgram = program.raw
            info: ProgramInfo = program.info
            packed = raw.kernarg(handles, var_vals)
            kernarg = ctypes.create_string_buffer(packed, max(len(packed), 1))
            self._inputs += [(kernarg, 8 * k, s) for k, s in from_inputs if k < raw.buffers]
            self._vars += [(kernarg, raw.var_offset(n), n) for n in raw.var_names]
            groups = info.extra.get("launch", ((1, 1, 1),))[0]
            if any(not isinstance(g, int) for g in groups):
                self._sized.append(i)
            self._items.append((raw, info, kernarg, dict(var_vals)))
            self._prepared.append(self._prepare(hip, i, var_vals))

    def _prepare(self, hip: HIP, i: int, vals: dict[str, int]) -> Any:
        raw, info, kernarg, _ = self._items[i]
        grid, threads = launch_dims(info, vals)
        return None if min(grid) <= 0 else hip.prepare(raw.function, grid, threads, 0, kernarg)

    def __call__(self, inputs: list[Any], var_vals: dict[str, int]) -> None:
        for kernarg, offset, s in self._inputs:
            struct.pack_into("<Q", kernarg, offset, inputs[s].ptr)
        hip = self.device.use()
        if var_vals:
            for kernarg, offset, name in self._vars:
                if name in var_vals:
                    struct.pack_into("<i", kernarg, offset, var_vals[name])
            for i in self._sized:
                self._prepared[i] = self._prepare(hip, i, {**self._items[i][3], **var_vals})
        for prepared in self._prepared:
            if prepared is not None:
                hip.launch_prepared(prepared)


__all__ = ["AMDDevice", "AMDAllocator", "AMDBatch", "AMDBuffer", "AMDProgram", "launch_dims"]
