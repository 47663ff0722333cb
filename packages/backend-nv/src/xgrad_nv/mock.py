"""An in-process stand-in for the CUDA driver (MOCKGPU=1): `xgrad_nv.driver.CUDADriver`'s interface on the project's
PTX interpreter (`xgrad_nv.emulate`), so the NV device's whole runtime path (allocation, copies, module loading,
argument packing, launch dimensions, events) runs in CI without a GPU.

What it models: `MOCK_DEVICES` devices of one arch (`MOCK_ARCH`; the device name's arch overrides it: NV::sm_80),
one flat device memory per device (`DeviceMemory`: allocations with gaps between them, so an out-of-bounds access
faults and names the address), modules that are PTX text (a cubin is refused: the device compiles to PTX under
MOCKGPU), launches that run at once on the interpreter (so events and synchronize only read the clock), the
>48 KiB dynamic shared memory attribute checked against the arch's opt-in limit.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from xgrad_nv.driver import (
    ATTR_COMPUTE_CAPABILITY_MAJOR,
    ATTR_COMPUTE_CAPABILITY_MINOR,
    ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
    ATTR_MULTIPROCESSOR_COUNT,
    Arg,
    CUDADriverError,
    PackedArgs,
)
from xgrad_nv.renderer import NV_ARCHS

MOCK_DEVICES = 2  # NV:0 and NV:1, so multi-device code paths run too
MOCK_ARCH = "sm_90"
MOCK_DRIVER_VERSION = 13000  # CUDA 13.0 (driver 580)
MOCK_MEMORY = 16 << 30  # bytes each mock device reports


@dataclass
class _Context:
    ordinal: int
    mem: Any  # xgrad_nv.emulate.DeviceMemory
    allocated: dict[int, int] = field(default_factory=dict)  # address -> bytes


class MockDriver:
    """`CUDADriver`'s interface, run by the PTX interpreter. Contexts are ordinals + 1 (0 is no context)."""

    kind = "mock"
    loads = "ptx"

    def __init__(self, arch: str = MOCK_ARCH, devices: int = MOCK_DEVICES) -> None:
        from xgrad_nv.emulate import DeviceMemory

        self.arch = arch
        self._contexts = [_Context(i, DeviceMemory()) for i in range(devices)]
        self._current: _Context | None = None
        self._handles = itertools.count(1)
        self._modules: dict[int, Any] = {}
        self._functions: dict[int, tuple[Any, str, int]] = {}  # handle -> (module, kernel name, max dynamic shared)
        self._events: dict[int, float] = {}
        self.launches = 0  # kernels run (tests count them)

    def _fail(self, call: str, name: str, code: int, desc: str) -> CUDADriverError:
        return CUDADriverError(call, code, name, f"{desc} (mock driver)")

    def _ctx(self, call: str) -> _Context:
        if self._current is None:
            raise self._fail(call, "CUDA_ERROR_INVALID_CONTEXT", 201, "no context is current")
        return self._current

    # ---- devices ----
    def driver_version(self) -> int:
        return MOCK_DRIVER_VERSION

    def device_count(self) -> int:
        return len(self._contexts)

    def _check_ordinal(self, call: str, ordinal: int) -> None:
        if not 0 <= ordinal < len(self._contexts):
            raise self._fail(call, "CUDA_ERROR_INVALID_DEVICE", 101, f"device {ordinal} of {len(self._contexts)}")

    def device_name(self, ordinal: int) -> str:
        self._check_ordinal("cuDeviceGetName", ordinal)
        return f"xgrad mock GPU ({self.arch}, PTX interpreter)"

    def attribute(self, ordinal: int, attr: int) -> int:
        self._check_ordinal("cuDeviceGetAttribute", ordinal)
        spec = NV_ARCHS[self.arch]
        values = {
            ATTR_COMPUTE_CAPABILITY_MAJOR: spec.compute_capability[0],
            ATTR_COMPUTE_CAPABILITY_MINOR: spec.compute_capability[1],
            ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: spec.shared_optin,
            ATTR_MULTIPROCESSOR_COUNT: 1,
        }
        if attr not in values:
            raise self._fail("cuDeviceGetAttribute", "CUDA_ERROR_INVALID_VALUE", 1, f"attribute {attr} is not mocked")
        return values[attr]

    def compute_capability(self, ordinal: int) -> tuple[int, int]:
        return (
            self.attribute(ordinal, ATTR_COMPUTE_CAPABILITY_MAJOR),
            self.attribute(ordinal, ATTR_COMPUTE_CAPABILITY_MINOR),
        )

    def total_memory(self, ordinal: int) -> int:
        self._check_ordinal("cuDeviceTotalMem_v2", ordinal)
        return MOCK_MEMORY

    # ---- contexts ----
    def open_context(self, ordinal: int) -> int:
        self._check_ordinal("cuDevicePrimaryCtxRetain", ordinal)
        self.set_current(ordinal + 1)
        return ordinal + 1

    def set_current(self, ctx: int) -> None:
        if not 1 <= ctx <= len(self._contexts):
            raise self._fail("cuCtxSetCurrent", "CUDA_ERROR_INVALID_CONTEXT", 201, f"context {ctx} does not exist")
        self._current = self._contexts[ctx - 1]

    def synchronize(self) -> None:
        self._ctx("cuCtxSynchronize")

    # ---- memory ----
    def mem_alloc(self, nbytes: int) -> int:
        ctx = self._ctx("cuMemAlloc_v2")
        if sum(ctx.allocated.values()) + nbytes > MOCK_MEMORY:
            from xgrad_nv.driver import CUDAOutOfMemoryError

            raise CUDAOutOfMemoryError("cuMemAlloc_v2", 2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory (mock driver)")
        addr: int = ctx.mem.alloc(max(nbytes, 1))
        ctx.allocated[addr] = nbytes
        return addr

    def mem_free(self, ptr: int) -> None:
        ctx = self._ctx("cuMemFree_v2")
        if ctx.allocated.pop(ptr, None) is None:
            raise self._fail("cuMemFree_v2", "CUDA_ERROR_INVALID_VALUE", 1, f"{ptr:#x} is not an allocation")
        ctx.mem.free(ptr)

    def mem_info(self) -> tuple[int, int]:
        ctx = self._ctx("cuMemGetInfo_v2")
        return MOCK_MEMORY - sum(ctx.allocated.values()), MOCK_MEMORY

    def copy_htod(self, dst: int, src: memoryview) -> None:
        if src.nbytes:
            self._ctx("cuMemcpyHtoD_v2").mem.write(dst, src.cast("B") if src.format != "B" or src.ndim != 1 else src)

    def copy_dtoh(self, dst: memoryview, src: int) -> None:
        flat = dst.cast("B") if dst.format != "B" or dst.ndim != 1 else dst
        if flat.nbytes:
            flat[:] = self._ctx("cuMemcpyDtoH_v2").mem.read(src, flat.nbytes)

    def copy_dtod(self, dst: int, src: int, nbytes: int) -> None:
        if nbytes:
            mem = self._ctx("cuMemcpyDtoD_v2").mem
            mem.write(dst, mem.read(src, nbytes))

    # ---- modules and launches ----
    def load_module(self, image: bytes) -> int:
        from xgrad_nv.emulate import load_ptx

        self._ctx("cuModuleLoadData")
        if image[:4] == b"\x7fELF":
            raise self._fail("cuModuleLoadData", "CUDA_ERROR_INVALID_IMAGE", 200, "the mock driver loads PTX text only")
        handle = next(self._handles)
        self._modules[handle] = load_ptx(image.rstrip(b"\0").decode())
        return handle

    def unload_module(self, module: int) -> None:
        self._modules.pop(module, None)

    def get_function(self, module: int, name: str) -> int:
        mod = self._modules.get(module)
        if mod is None or name not in mod.kernels:
            raise self._fail(
                "cuModuleGetFunction", "CUDA_ERROR_NOT_FOUND", 500, f"no kernel {name!r} in module {module}"
            )
        handle = next(self._handles)
        self._functions[handle] = (mod, name, 48 * 1024)
        return handle

    def set_max_dynamic_shared(self, function: int, nbytes: int) -> None:
        mod, name, _ = self._functions[function]
        if nbytes > NV_ARCHS[self.arch].shared_optin:
            limit = NV_ARCHS[self.arch].shared_optin
            raise self._fail(
                "cuFuncSetAttribute", "CUDA_ERROR_INVALID_VALUE", 1, f"{nbytes} > {limit} bytes on {self.arch}"
            )
        self._functions[function] = (mod, name, nbytes)

    def launch(
        self, function: int, grid: Sequence[int], block: Sequence[int], shared: int, args: Sequence[Arg]
    ) -> None:
        ctx = self._ctx("cuLaunchKernel")
        mod, name, max_shared = self._functions[function]
        spec = NV_ARCHS[self.arch]
        threads = block[0] * block[1] * block[2]
        bad = threads > spec.max_threads or any(b > m for b, m in zip(block, spec.local_max))
        if bad or any(g < 1 or g > m for g, m in zip(grid, spec.global_max)) or shared > max_shared:
            raise self._fail(
                "cuLaunchKernel",
                "CUDA_ERROR_INVALID_VALUE",
                1,
                f"launch of {name} with grid {tuple(grid)}, "
                f"block {tuple(block)}, {shared} bytes of dynamic shared memory exceeds {self.arch}'s limits",
            )
        self.launches += 1
        mod.launch(
            name, grid=tuple(grid), block=tuple(block), args=[v for _, v in args], mem=ctx.mem, dynamic_shared=shared
        )

    def pack(self, args: Sequence[Arg]) -> PackedArgs:
        return PackedArgs(args)

    def launch_packed(
        self, function: int, grid: Sequence[int], block: Sequence[int], shared: int, packed: PackedArgs
    ) -> None:
        self.launch(function, grid, block, shared, packed.args)

    def prepare(
        self, function: int, grid: Sequence[int], block: Sequence[int], shared: int, packed: PackedArgs
    ) -> tuple[Any, ...]:
        return (function, tuple(grid), tuple(block), shared, packed)

    def launch_prepared(self, prepared: tuple[Any, ...]) -> None:
        self.launch_packed(*prepared)

    # ---- events: launches run at once, so an event is the time it was recorded ----
    def event_create(self) -> int:
        handle = next(self._handles)
        self._events[handle] = 0.0
        return handle

    def event_record(self, event: int) -> None:
        self._events[event] = time.perf_counter()

    def event_synchronize(self, event: int) -> None:
        pass

    def event_elapsed_ms(self, start: int, end: int) -> float:
        return (self._events[end] - self._events[start]) * 1000.0

    def event_destroy(self, event: int) -> None:
        self._events.pop(event, None)


__all__ = ["MockDriver", "MOCK_ARCH", "MOCK_DEVICES", "MOCK_DRIVER_VERSION"]
