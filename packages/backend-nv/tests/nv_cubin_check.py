"""A pytest plugin for a child run of the core op suite on the mock GPU (`-p nv_cubin_check`, this folder on
PYTHONPATH): every kernel the NV device builds is also rendered for sm_80, sm_90 and sm_120 by the same renderer and
compiled to a cubin (CUDA C: NVRTC; PTX: ptxas), so the suite's kernels are proven to compile for real GPUs while
the mock runs their PTX. A compile error fails the test that made the kernel."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

ARCHS = ("sm_80", "sm_90", "sm_120")
built: list[str] = []
POOL = ThreadPoolExecutor(len(ARCHS))


def pytest_configure(config: pytest.Config) -> None:
    from xgrad_codegen.device import CompiledDevice
    from xgrad_nv.compiler import CUDACompiler, PTXCompiler
    from xgrad_nv.device import NVDevice

    def cubin(renderer: Any, name: str, uops: list[Any], src: str, arch: str) -> None:
        arch_src = type(renderer)(arch).render(name, uops) if uops else src
        if renderer.name == "PTX":
            compiler: Any = PTXCompiler(arch)
            assert compiler.ptxas is not None, "ptxas is needed to compile PTX to cubin"
        else:
            compiler = CUDACompiler(arch)
        assert compiler.compile(arch_src)[:4] == b"\x7fELF", f"{name}: no cubin for {arch}"

    def build(self: NVDevice, name: str, uops: list[Any], src: str) -> Any:
        # the three archs at once: NVRTC (through ctypes) and ptxas (a process) run without the GIL
        jobs = [POOL.submit(cubin, self.renderer, name, uops, src, arch) for arch in ARCHS]
        program = CompiledDevice.build(self, name, uops, src)
        for job in jobs:
            job.result()
        built.append(name)
        return program

    NVDevice.build = build  # type: ignore[method-assign]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    terminalreporter.write_line(f"nv_cubin_check: {len(built)} kernels compiled to cubin for {', '.join(ARCHS)}")
