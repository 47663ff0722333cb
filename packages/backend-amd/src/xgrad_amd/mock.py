"""An in-process stand-in for libamdhip64 (MOCKGPU=1): the methods of `xgrad_amd.driver.HIPLibrary`, over this
package's RDNA3 emulator, so that `xgrad_amd.device` and the kernels clang builds run in CI without a GPU.

One emulated device, a gfx1100. Memory is `xgrad_codegen.devmem.DeviceMemory` (flat addresses, faults name the address);
`module_load` parses the code object with `xgrad_amd.elf.load_code_object`; `launch` takes the packed explicit
arguments as hipModuleLaunchKernel's `extra` buffer does, adds the hidden arguments the kernel's metadata asks for
(`Kernel.pack_kernargs`) and runs every workgroup with `xgrad_amd.emulate.launch`. Launches run synchronously, so
events measure host time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from xgrad.errors import DeviceError
from xgrad_amd import emulate
from xgrad_amd.driver import HIPError, Kernarg
from xgrad_amd.elf import CodeObject, load_code_object
from xgrad_codegen.devmem import DeviceMemory  # what xgrad_amd.emulate re-exports: the emulator's global memory

MOCK_ARCH = "gfx1100"
MOCK_NAME = "xgrad emulated AMD gfx1100 (MOCKGPU)"


@dataclass(frozen=True)
class MockFunction:
    """What hipModuleGetFunction returns here: the code object and the kernel's name."""

    module: CodeObject
    name: str


class MockHIP:
    """The HIP runtime's calls on the emulator (one device, index 0)."""

    def __init__(self) -> None:
        self.mem = DeviceMemory()
        self.launches = 0  # kernels run (tests check that work reached the emulator)
        self._device = 0

    # ---- devices ----
    def device_count(self) -> int:
        return 1

    def _check(self, index: int) -> None:
        if index != 0:
            raise HIPError(f"hipSetDevice failed with hipError 101: invalid device ordinal {index} (MOCKGPU has 1)")

    def set_device(self, index: int) -> None:
        self._check(index)
        self._device = index

    def device_arch(self, index: int) -> str:
        self._check(index)
        return MOCK_ARCH

    def device_name(self, index: int) -> str:
        self._check(index)
        return MOCK_NAME

    # ---- memory ----
    def malloc(self, nbytes: int) -> int:
        return self.mem.alloc(nbytes)

    def free(self, ptr: int) -> None:
        self.mem.free(ptr)

    def memcpy_htod(self, dst: int, src: memoryview) -> None:
        self.mem.write(dst, src if src.format == "B" and src.ndim == 1 else src.cast("B"))

    def memcpy_dtoh(self, dst: memoryview, src: int) -> None:
        flat = dst if dst.format == "B" and dst.ndim == 1 else dst.cast("B")
        flat[:] = self.mem.read(src, flat.nbytes)

    def memcpy_dtod(self, dst: int, src: int, nbytes: int) -> None:
        self.mem.write(dst, self.mem.read(src, nbytes))

    # ---- code ----
    def module_load(self, image: bytes) -> CodeObject:
        co = load_code_object(image)
        if not co.target.split("--")[-1].startswith(MOCK_ARCH):
            raise HIPError(
                f"hipModuleLoadData failed with hipError 209: no kernel image for {MOCK_ARCH} in {co.target}"
            )
        return co

    def module_function(self, module: CodeObject, name: str) -> MockFunction:
        if name not in module.kernels:
            raise HIPError(f"hipModuleGetFunction failed with hipError 500: no kernel {name!r} in the module")
        return MockFunction(module, name)

    def module_unload(self, module: Any) -> None:
        pass

    def launch(
        self,
        function: MockFunction,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared: int,
        kernarg: bytes,
    ) -> None:
        kernel = function.module.kernels[function.name]
        visible = [a for a in kernel.args if not a[2].startswith("hidden_")]
        end = max((off + size for off, size, _ in visible), default=0)
        if len(kernarg) < end:
            raise DeviceError(
                f"kernel {function.name}: {len(kernarg)} bytes of arguments, its explicit ones need {end}"
            )
        explicit: list[int | float | bytes] = [kernarg[off : off + size] for off, size, _ in visible]
        full = kernel.pack_kernargs(explicit, grid, block, dynamic_lds=shared)
        emulate.launch(function.module, function.name, grid=grid, block=block, kernarg=full, mem=self.mem,
                       dynamic_lds=shared)  # fmt: skip
        self.launches += 1

    def prepare(
        self, function: MockFunction, grid: tuple[int, int, int], block: tuple[int, int, int], shared: int,
        kernarg: Kernarg,
    ) -> tuple[MockFunction, tuple[int, int, int], tuple[int, int, int], int, Kernarg]:  # fmt: skip
        """A launch to repeat (`launch_prepared`); `kernarg` is read when it runs, so it may be patched in between."""
        return function, grid, block, shared, kernarg

    def launch_prepared(
        self, prepared: tuple[MockFunction, tuple[int, int, int], tuple[int, int, int], int, Kernarg]
    ) -> None:
        function, grid, block, shared, kernarg = prepared
        self.launch(function, grid, block, shared, kernarg.raw)

    # ---- events and synchronisation (launches are synchronous) ----
    def event_create(self) -> list[float]:
        return [0.0]

    def event_record(self, event: list[float]) -> None:
        event[0] = time.perf_counter()

    def event_elapsed_ms(self, start: list[float], stop: list[float]) -> float:
        return (stop[0] - start[0]) * 1e3

    def event_destroy(self, event: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


__all__ = ["MockHIP", "MockFunction", "MOCK_ARCH"]
