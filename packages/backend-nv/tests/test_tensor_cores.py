"""The CUDA renderer's tensor cores: m16n8k16 f16/bf16 on every arch (codegen's layout), and the opt-in tf32 m16n8k8
(CUDARenderer(tf32=True)): its register layout covers each matrix once, a float32 matmul then compiles to HMMA.1688
tf32 (nvdisasm) and equals numpy's product of the tf32-truncated operands on the mock GPU's interpreter."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from xgrad import Tensor
from xgrad.device import Device
from xgrad_nv.compiler import CUDACompiler, disassemble, find_tool, load_nvrtc
from xgrad_nv.renderer import NV_ARCHS, CUDARenderer


@pytest.fixture(autouse=True)
def nvrtc() -> Iterator[None]:
    if load_nvrtc() is None:
        pytest.skip("NVRTC is not installed (pip install nvidia-cuda-nvrtc==13.0.*)")
    yield


def test_every_arch_has_the_half_tensor_cores_and_tf32_only_on_request() -> None:
    for arch, spec in NV_ARCHS.items():
        names = [tc.name for tc in CUDARenderer(arch).tensor_cores]
        assert names == ["mma_m16n8k16_float16", "mma_m16n8k16_bfloat16"], arch
        assert [tc.name for tc in CUDARenderer(arch, tf32=True).tensor_cores][-1] == "mma_m16n8k8_tf32"
        assert spec.shared_static == 48 * 1024


def test_tf32_layout_covers_each_matrix_once() -> None:
    (tc,) = NV_ARCHS["sm_90"].tf32_cores
    m, n, k = tc.dims
    for operand, shape in (("a", (m, k)), ("b", (k, n)), ("c", (m, n))):
        seen = [tc.place(operand, lane, e) for lane in range(32) for e in range(tc.elements(operand))]
        assert sorted(seen) == [(r, c) for r in range(shape[0]) for c in range(shape[1])], operand


def f32_matmul_ast() -> Any:
    x = Tensor(np.ones((32, 16), np.float32), device="NULL:CUDA:sm_90").contiguous()
    y = Tensor(np.ones((16, 24), np.float32), device="NULL:CUDA:sm_90").contiguous()
    null = Device["NULL:CUDA:sm_90"]
    seen: list[Any] = []
    orig = null.compile

    def spy(ast: Any) -> Any:
        seen.append(ast)
        return orig(ast)

    null.compile = spy
    try:
        (x @ y).realize()
    finally:
        del null.compile
    return seen[-1]


def test_tf32_matmul_sass_has_hmma_1688() -> None:
    if find_tool("nvdisasm") is None:
        pytest.skip("nvdisasm is not installed (pip install nvidia-cuda-nvdisasm)")
    src = CUDARenderer("sm_90", tf32=True).compile_only(f32_matmul_ast())
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in src
    sass = disassemble(CUDACompiler("sm_90").compile(src))
    assert "HMMA.1688.F32.TF32" in sass
    assert "mma" not in CUDARenderer("sm_90").compile_only(f32_matmul_ast())  # off by default


def test_tf32_matmul_runs_on_the_mock_gpu(mockgpu: None) -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((32, 16), dtype=np.float32), rng.standard_normal((16, 24), dtype=np.float32)
    dev = Device["NV:CUDA:sm_90"]  # opened in the fixture's registry: its renderer is swapped for the tf32 one
    dev.renderer = CUDARenderer("sm_90", tf32=True)
    got = (Tensor(a, device=dev.name) @ Tensor(b, device=dev.name)).numpy()
    assert any("m16n8k8" in p.info.src for p in dev._programs.values())

    def tf32(v: np.ndarray) -> np.ndarray:
        return (v.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)

    np.testing.assert_allclose(got, tf32(a) @ tf32(b), rtol=1e-5, atol=1e-5)
    assert np.abs(got - a.astype(np.float64) @ b.astype(np.float64)).max() > 1e-5  # tf32, not float32 precision
