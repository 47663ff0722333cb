"""Compile-only: the kernels of a representative op subset (nv_ops.OPS), rendered by each NV renderer for sm_80, sm_90
and sm_120 (DEV=NULL:<renderer>:<arch>, which runs nothing), compile with the real toolchain (NVRTC to cubin; ptxas
for PTX); a float16 matmul's SASS holds HMMA (nvdisasm); hot kernels do not spill (ptxas -v).

Parametrised by renderer: RENDERERS lists those whose module is installed (the PTX renderer joins when
xgrad_nv.ptx exists).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from nv_ops import OPS, op_params

from xgrad.device import Device
from xgrad.dtype import dtypes
from xgrad.plugin import module_exists
from xgrad.tensor import Tensor
from xgrad_nv.compiler import CUDACompiler, PTXCompiler, disassemble, find_tool, ptxas_resources

ARCHS = ["sm_80", "sm_90", "sm_120"]
RENDERERS = ["CUDA", *(["PTX"] if module_exists("xgrad_nv.ptx") else [])]


def kernel_sources(device: str, fn: Any) -> list[tuple[str, str]]:
    """(kernel name, source) of every kernel realizing `fn(device)` compiles on NULL device `device`."""
    dev = Device[device]
    seen: list[tuple[str, str]] = []
    orig = dev.compile

    def spy(ast: Any) -> Any:
        prg = orig(ast)
        seen.append((prg.info.name, prg.info.src))
        return prg

    dev.compile = spy
    try:
        fn(device).realize()
    finally:
        del dev.compile
    return seen


def binary(renderer: str, arch: str, src: str) -> bytes:
    """The cubin of `src`: CUDA C through NVRTC, PTX through ptxas."""
    if renderer == "CUDA":
        return CUDACompiler(arch).compile(src)
    compiler = PTXCompiler(arch)
    assert compiler.ptxas is not None
    return compiler.compile(src)


def ptx_of(renderer: str, arch: str, src: str) -> str:
    return CUDACompiler(arch, ptx=True).compile(src).decode() if renderer == "CUDA" else src


@pytest.fixture(scope="module", autouse=True)
def toolchain() -> None:
    if find_tool("ptxas") is None:
        pytest.skip("ptxas is not installed (CI has it from the CUDA 13 toolkit)")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("renderer", RENDERERS)
@pytest.mark.parametrize("op", op_params())
def test_op_kernels_compile_to_cubin(op: Any, renderer: str, arch: str) -> None:
    sources = kernel_sources(f"NULL:{renderer}:{arch}", op.build)
    assert sources, f"{op.name} made no kernel"
    for name, src in sources:
        cubin = binary(renderer, arch, src)
        assert cubin[:4] == b"\x7fELF", f"{name}: not an ELF cubin"


def sass(cubin: bytes) -> str:
    if find_tool("nvdisasm") is None:
        pytest.skip("nvdisasm is not installed (pip install nvidia-cuda-nvdisasm)")
    return disassemble(cubin)


def half_matmul(dtype: Any) -> Any:
    def build(device: str) -> Tensor:
        x = Tensor(np.ones((64, 64), np.float32), device=device).cast(dtype).realize()
        y = Tensor(np.ones((64, 32), np.float32), device=device).cast(dtype).realize()
        return x.matmul(y, dtype=dtypes.float32)

    return build


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("renderer", RENDERERS)
@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=["f16", "bf16"])
def test_half_matmul_sass_uses_tensor_cores(dtype: Any, renderer: str, arch: str) -> None:
    *_, (name, src) = kernel_sources(f"NULL:{renderer}:{arch}", half_matmul(dtype))
    code = sass(binary(renderer, arch, src))
    want = "HMMA.16816.F32" + (".BF16" if dtype == dtypes.bfloat16 else "")
    assert want in code, f"{name} for {arch}: no {want} in\n{code[:3000]}"


def test_sass_check_sees_a_kernel_without_tensor_cores() -> None:
    """The HMMA check can fail: a float32 matmul has none."""
    x = lambda d: Tensor(np.ones((64, 64), np.float32), device=d) @ Tensor(np.ones((64, 32), np.float32), device=d)  # noqa: E731
    ((_, src),) = kernel_sources("NULL:CUDA:sm_90", x)
    assert "HMMA" not in sass(binary("CUDA", "sm_90", src))


HOT = {
    "matmul_f32": lambda d: Tensor(np.ones((512, 512), np.float32), device=d)
    @ Tensor(np.ones((512, 512), np.float32), device=d),
    "matmul_f16": lambda d: Tensor(np.ones((512, 512), np.float16), device=d).matmul(
        Tensor(np.ones((512, 512), np.float16), device=d), dtype=dtypes.float32
    ),
    "softmax": lambda d: Tensor(np.ones((256, 1024), np.float32), device=d).softmax(-1),
    "conv2d": lambda d: Tensor(np.ones((8, 32, 32, 32), np.float32), device=d).conv2d(
        Tensor(np.ones((64, 32, 3, 3), np.float32), device=d), padding=1
    ),
}  # fmt: skip


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("renderer", RENDERERS)
@pytest.mark.parametrize("hot", list(HOT))
def test_hot_kernels_do_not_spill(hot: str, renderer: str, arch: str) -> None:
    for _, src in kernel_sources(f"NULL:{renderer}:{arch}", HOT[hot]):
        for kernel, res in ptxas_resources(ptx_of(renderer, arch, src), arch).items():
            assert res.spill_stores == 0 and res.spill_loads == 0, f"{hot}: {kernel} for {arch} spills: {res}"
            assert res.registers <= 255


def test_ops_list_covers_the_dtype_families() -> None:
    names = {op.name for op in OPS}
    assert {"cast_half", "cast_bf16", "cast_fp8", "float64", "matmul_f16_tc", "matmul_bf16_tc", "conv2d"} <= names


def test_ptx_goes_to_the_driver_jit_when_ptxas_is_older_than_its_isa() -> None:
    """A ptxas of CUDA 12.8 (triton's) cannot read PTX ISA 9.0: the PTX itself is the image, for the driver's JIT."""
    compiler = PTXCompiler("sm_90")
    ptx = CUDACompiler("sm_90", ptx=True).compile('extern "C" __global__ void k(float* a) { a[0] = 1.0f; }').decode()
    assert ".version 9" in ptx and binary("PTX", "sm_90", ptx)[:4] == b"\x7fELF"
    compiler.version = "Cuda compilation tools, release 12.8, V12.8.93"
    assert compiler.compile(ptx) == ptx.encode() + b"\0"
