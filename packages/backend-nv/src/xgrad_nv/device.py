"""The NV device: kernels rendered as CUDA C (or PTX), compiled to cubin (or PTX), run through the CUDA driver.

`DEV=NV` (or `NV:1`, ...) opens GPU i; `NV:PTX` / `NV:CUDA` pick the renderer (CUDA by default) and `NV::sm_80` the
arch the mock emulates. The driver is `xgrad_nv.driver.CUDADriver` on `libcuda.so.1`, or with `MOCKGPU=1`
`xgrad_nv.mock.MockDriver`, whose kernels run on the PTX interpreter: then CUDA C is compiled to PTX (not cubin) and
PTX is loaded as it is. Everything above the driver is the same code on both.

Buffers are device pointers (`NVBuffer`); freed buffers go to an LRU free list per size (`NVAllocator`). A launch
packs each buffer's pointer and each variable's value (int32) as the kernel's parameters in the renderer's ABI (see
`xgrad_nv.renderer`) and takes grid and block from the program's SPECIAL sizes; a kernel whose shared arrays
exceed the arch's static 48 KiB (`info.extra["shared"]`) launches with that much dynamic shared memory. TinyJit
replays consecutive kernels through `NVDevice.batch` (arguments packed once, inputs and variables patched per replay).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from xgrad.buffer import ProgramInfo
from xgrad.device import parse_device
from xgrad.errors import DeviceError, OutOfMemoryError
from xgrad.helpers import MOCKGPU
from xgrad_codegen.device import BlockCache, CompiledDevice, launch_dims
from xgrad_nv.compiler import CUDACompiler, PTXCompiler
from xgrad_nv.driver import Arg, CUDADriver
from xgrad_nv.renderer import NV_ARCHS, CUDARenderer

DEFAULT_CACHE_LIMIT = 4 << 30  # bytes of freed device memory kept for reuse, per device


@functools.cache
def get_driver(mock_arch: str | None = None) -> Any:
    """The process's driver: the mock (one per emulated arch) under MOCKGPU=1, else libcuda's."""
    if MOCKGPU.value:
        from xgrad_nv.mock import MOCK_ARCH, MockDriver

        return MockDriver(mock_arch or MOCK_ARCH)
    return CUDADriver()


def table_arch(cc: tuple[int, int]) -> str:
    """The NV_ARCHS entry for compute capability `cc`: its own, else the newest one not above it (sm_86 -> sm_80)."""
    fits = [name for name, a in NV_ARCHS.items() if a.compute_capability <= cc]
    if not fits:
        raise DeviceError(f"compute capability {cc[0]}.{cc[1]} is older than sm_80, the oldest the NV backend supports")
    return max(fits, key=lambda n: NV_ARCHS[n].compute_capability)


class NVBuffer:
    """Device memory: `ptr` the device address, `nbytes` the size, `base` the buffer an offset view came from."""

    __slots__ = ("base", "nbytes", "ptr")

    def __init__(self, ptr: int, nbytes: int, base: NVBuffer | None = None) -> None:
        self.ptr, self.nbytes, self.base = ptr, nbytes, base

    def __repr__(self) -> str:
        return f"<NVBuffer {self.ptr:#x} {self.nbytes} bytes{' view' if self.base is not None else ''}>"


class NVAllocator:
    """Device memory of one GPU (its context made current before every call). `free` keeps up to `cache_limit` bytes
    of blocks for the next `alloc` of the same size, most recently freed first; an allocation the GPU cannot serve
    empties that cache and tries once more before raising OutOfMemoryError."""

    def __init__(self, driver: Any, ctx: int, name: str, cache_limit: int = DEFAULT_CACHE_LIMIT) -> None:
        self.driver, self.ctx, self.name = driver, ctx, name
        self._cache: BlockCache[NVBuffer] = BlockCache(cache_limit)

    @property
    def cached_bytes(self) -> int:
        return self._cache.nbytes

    def alloc(self, nbytes: int) -> NVBuffer:
        if nbytes < 0:
            raise ValueError(f"cannot allocate a negative number of bytes: {nbytes}")
        if (buf := self._cache.take(nbytes)) is not None:
            return buf
        self.driver.set_current(self.ctx)
        try:
            return NVBuffer(self.driver.mem_alloc(nbytes), nbytes)
        except OutOfMemoryError:
            self.free_cache()
        try:
            return NVBuffer(self.driver.mem_alloc(nbytes), nbytes)
        except OutOfMemoryError as e:
            raise OutOfMemoryError(f"{self.name}: cannot allocate {nbytes} bytes ({e})") from None

    def free(self, handle: NVBuffer, nbytes: int) -> None:
        assert handle.base is None, "free the base buffer, not an offset view"
        for block in self._cache.put(handle, nbytes):
            self._release(block)

    def _release(self, handle: NVBuffer) -> None:
        self.driver.set_current(self.ctx)
        self.driver.mem_free(handle.ptr)

    def free_cache(self) -> None:
        """Give every cached block back to the GPU."""
        for block in self._cache.clear():
            self._release(block)

    def copyin(self, dest: NVBuffer, src: memoryview) -> None:
        if src.nbytes != dest.nbytes:
            raise ValueError(f"copyin of {src.nbytes} bytes into a buffer of {dest.nbytes} bytes")
        self.driver.set_current(self.ctx)
        self.driver.copy_htod(dest.ptr, src)

    def copyout(self, dest: memoryview, src: NVBuffer) -> None:
        if dest.nbytes != src.nbytes:
            raise ValueError(f"copyout of a buffer of {src.nbytes} bytes into {dest.nbytes} bytes")
        self.driver.set_current(self.ctx)
        self.driver.copy_dtoh(dest, src.ptr)

    def offset(self, handle: NVBuffer, offset: int, nbytes: int) -> NVBuffer:
        if offset < 0 or nbytes < 0 or offset + nbytes > handle.nbytes:
            raise ValueError(f"view [{offset}, {offset + nbytes}) is outside a buffer of {handle.nbytes} bytes")
        return NVBuffer(handle.ptr + offset, nbytes, handle.base if handle.base is not None else handle)


class NVProgram:
    """A kernel loaded into a GPU's context: its module and function handles."""

    def __init__(self, device: NVDevice, name: str, image: bytes) -> None:
        self.device, self.name = device, name
        drv = device.driver
        drv.set_current(device.ctx)
        self.module = drv.load_module(image)
        self.function = drv.get_function(self.module, name)
        self._dynamic: int | None = None

    def dynamic_shared(self, info: ProgramInfo) -> int:
        """Bytes of dynamic shared memory to launch with: the kernel's shared arrays where they exceed the static
        48 KiB (the renderers then declare them dynamic), allowed once per function by cuFuncSetAttribute."""
        if self._dynamic is None:
            shared = int(info.extra.get("shared", 0))
            self._dynamic = shared if shared > self.device.shared_static else 0
            if self._dynamic:
                self.device.driver.set_current(self.device.ctx)
                self.device.driver.set_max_dynamic_shared(self.function, self._dynamic)
        return self._dynamic

    def __repr__(self) -> str:
        return f"<NVProgram {self.name} on {self.device.name}>"


def kernel_args(bufs: Sequence[Any], info: ProgramInfo, vals: dict[str, int]) -> list[Arg]:
    """The kernel's parameters: every buffer's pointer (PARAM order), then every variable's value (program order)."""
    return [("ptr", b.ptr) for b in bufs] + [("i32", int(vals[n])) for n in info.var_names]


class NVDevice(CompiledDevice):
    """One NVIDIA GPU (or a mock one under MOCKGPU=1); see the module docstring."""

    def __init__(self, name: str) -> None:
        parsed = parse_device(name)
        renderer_name = (parsed.renderer or "CUDA").upper()
        if renderer_name not in ("CUDA", "PTX"):
            raise DeviceError(f"{name}: NV renders CUDA or PTX, not {parsed.renderer!r} (DEV=NV:CUDA or DEV=NV:PTX)")
        driver = get_driver(parsed.arch)
        count = driver.device_count()
        if not 0 <= parsed.index < count:
            raise DeviceError(f"{name}: this machine has {count} NVIDIA GPU(s) (NV:0 .. NV:{count - 1})")
        self.driver, self.ordinal = driver, parsed.index
        self.ctx = driver.open_context(parsed.index)
        major, minor = driver.compute_capability(parsed.index)
        self.compile_arch = f"sm_{major}{minor}"
        if parsed.arch is not None and parsed.arch != self.compile_arch:
            raise DeviceError(f"{name}: GPU {parsed.index} is {self.compile_arch}, not {parsed.arch}")
        arch = table_arch((major, minor))
        self.shared_static = NV_ARCHS[arch].shared_static  # past it the renderers declare dynamic shared memory
        renderer: Any
        if renderer_name == "PTX":
            from xgrad_nv.ptx import PTXRenderer  # type: ignore[import-not-found,unused-ignore]

            renderer = PTXRenderer(arch)
        else:
            renderer = CUDARenderer(arch)
        compiler: Any
        if driver.loads == "ptx":  # the mock runs PTX: CUDA C compiles to PTX, PTX is loaded as it is
            compiler = CUDACompiler(self.compile_arch, ptx=True) if renderer_name == "CUDA" else _PTXText()
        else:
            compiler = CUDACompiler(self.compile_arch) if renderer_name == "CUDA" else PTXCompiler(self.compile_arch)
        allocator = NVAllocator(driver, self.ctx, name)
        super().__init__(name, allocator, renderer, compiler, self._load)
        self._start, self._end = driver.event_create(), driver.event_create()

    def _load(self, name: str, image: bytes) -> NVProgram:
        return NVProgram(self, name, image)

    def target(self) -> str:
        return f"{super().target()}:{self.compile_arch}:{self.driver.kind}"

    def launch(
        self, raw: NVProgram, bufs: list[Any], info: ProgramInfo, vals: dict[str, int], wait: bool
    ) -> float | None:
        grid, block = launch_dims(info, vals)
        if 0 in grid:  # an empty tensor's kernel: CUDA refuses a grid without blocks, and there is nothing to do
            return 0.0 if wait else None
        drv = self.driver
        drv.set_current(self.ctx)
        if wait:
            drv.event_record(self._start)
        drv.launch(raw.function, grid, block, raw.dynamic_shared(info), kernel_args(bufs, info, vals))
        if not wait:
            return None
        drv.event_record(self._end)
        drv.event_synchronize(self._end)
        return float(drv.event_elapsed_ms(self._start, self._end)) / 1000.0

    def synchronize(self) -> None:
        self.driver.set_current(self.ctx)
        self.driver.synchronize()

    def batch(self, launches: list[tuple[Any, list[Any], tuple[tuple[int, int], ...], dict[str, int]]]) -> NVBatch:
        """TinyJit's replay of consecutive kernels on this GPU (see `NVBatch`)."""
        return NVBatch(self, launches)

    def __repr__(self) -> str:
        return f"<NVDevice {self.name} {self.compile_arch} {self.renderer.name} on {self.driver.kind}>"


class NVBatch:
    """Kernels to launch in order: per kernel (program, buffer handles with None where an input goes, (handle
    position, input index) pairs, captured variable values). Each launch's parameter array is packed once
    (`driver.pack`); a call patches in the inputs' pointers and the variables' values (and the grids that depend on
    them) and launches all."""

    def __init__(
        self,
        device: NVDevice,
        launches: Sequence[tuple[Any, list[Any], tuple[tuple[int, int], ...], dict[str, int]]],
    ):
        self.device = device
        drv = device.driver
        self._items: list[tuple[int, tuple[int, int, int], tuple[int, int, int], int, Any]] = []
        self._inputs: list[tuple[Any, int, int]] = []  # (packed args, position, input index)
        self._vars: list[tuple[Any, int, str]] = []  # (packed args, position, variable name)
        self._sized: list[tuple[int, ProgramInfo, dict[str, int]]] = []  # launches whose grid depends on variables
        for i, (program, handles, from_inputs, var_vals) in enumerate(launches):
            info: ProgramInfo = program.info
            args: list[Arg] = [("ptr", 0 if h is None else h.ptr) for h in handles]
            args += [("i32", int(var_vals[n])) for n in info.var_names]
            packed = drv.pack(args)
            self._inputs += [(packed, k, s) for k, s in from_inputs]
            self._vars += [(packed, len(handles) + j, n) for j, n in enumerate(info.var_names)]
            grid, block = launch_dims(info, var_vals)
            launch = info.extra.get("launch") if info.extra else None
            if launch is not None and any(not isinstance(g, int) for g in launch[0]):
                self._sized.append((i, info, var_vals))
            self._items.append((program.raw.function, grid, block, program.raw.dynamic_shared(info), packed))
        self._prepared = [drv.prepare(fn, g, b, sh, p) for fn, g, b, sh, p in self._items if 0 not in g]

    def __call__(self, inputs: list[Any], var_vals: dict[str, int]) -> None:
        for packed, k, s in self._inputs:
            packed.set(k, inputs[s].ptr)
        if var_vals:
            for packed, k, name in self._vars:
                if name in var_vals:
                    packed.set(k, int(var_vals[name]))
            if self._sized:
                for i, info, captured in self._sized:
                    fn, _, block, shared, packed = self._items[i]
                    grid, _ = launch_dims(info, {**captured, **var_vals})
                    self._items[i] = (fn, grid, block, shared, packed)
                drv = self.device.driver
                self._prepared = [drv.prepare(fn, g, b, sh, p) for fn, g, b, sh, p in self._items if 0 not in g]
        drv = self.device.driver
        drv.set_current(self.device.ctx)
        launch = drv.launch_prepared
        for prepared in self._prepared:
            launch(prepared)


class _PTXText:
    """The mock's "compiler" of PTX: the text is the module image."""

    def compile(self, src: str) -> bytes:
        return src.encode()


__all__ = ["NVDevice", "NVAllocator", "NVBuffer", "NVBatch", "NVProgram", "get_driver", "launch_dims", "table_arch"]
