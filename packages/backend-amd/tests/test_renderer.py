"""The HIP renderer: its arch table, the RDNA4 tensor-core layout against AMD's documented lane formulas, and what a
rendered kernel is made of (checked in the source; test_compile_archs.py checks the binaries)."""

from __future__ import annotations

import numpy as np
import pytest

from xgrad import Tensor, dtypes
from xgrad.device import Device
from xgrad.errors import DeviceError
from xgrad_amd.renderer import AMD_ARCHS, RDNA4_TENSOR_CORES, HIPRenderer, arch_info
from xgrad_codegen.pydevice import TENSOR_CORES


def sources(arch: str, fn: object) -> str:
    dev = f"NULL:HIP:{arch}"
    null = Device[dev]
    null._programs.clear()
    assert callable(fn)
    fn(dev).realize()
    return "\n".join(p.info.src for p in null._programs.values())


def test_arch_table_wave_sizes_and_tensor_cores() -> None:
    assert {a: AMD_ARCHS[a].wave_size for a in AMD_ARCHS} == {
        "gfx90a": 64, "gfx942": 64, "gfx1100": 32, "gfx1151": 32, "gfx1200": 32, "gfx1201": 32,
    }  # fmt: skip
    for arch, info in AMD_ARCHS.items():
        assert all(tc.threads == info.wave_size for tc in info.tensor_cores), arch
    assert AMD_ARCHS["gfx1100"].tensor_cores == TENSOR_CORES["gfx1100"]
    assert AMD_ARCHS["gfx942"].tensor_cores == TENSOR_CORES["gfx942"]
    assert AMD_ARCHS["gfx1201"].tensor_cores == RDNA4_TENSOR_CORES


def test_unknown_and_unsupported_archs_are_refused_with_the_list() -> None:
    with pytest.raises(DeviceError, match="clang-19 does not know gfx950.*use one of gfx90a, gfx942"):
        HIPRenderer("gfx950")
    with pytest.raises(DeviceError, match="not a target this backend knows"):
        arch_info("gfx803")
    assert HIPRenderer("gfx90a:xnack-").target.name == "gfx90a"


@pytest.mark.parametrize("tc", RDNA4_TENSOR_CORES, ids=lambda tc: tc.name)
def test_rdna4_layout_is_amds_lane_formula(tc: object) -> None:
    """RDNA4 WMMA 16x16x16 (wave32): lane l holds A[l % 16][8 (l // 16) + i], B[8 (l // 16) + i][l % 16] and
    D[8 (l // 16) + i][l % 16], i = 0..7: each of the 256 positions exactly once (no copies, unlike RDNA3)."""
    from xgrad_codegen.renderer import TensorCore

    assert isinstance(tc, TensorCore)
    for lane in range(32):
        for i in range(8):
            assert tc.place("a", lane, i) == (lane % 16, 8 * (lane // 16) + i)
            assert tc.place("b", lane, i) == (8 * (lane // 16) + i, lane % 16)
            assert tc.place("c", lane, i) == (8 * (lane // 16) + i, lane % 16)
    for operand in "abc":
        assert len({tc.place(operand, lane, i) for lane in range(32) for i in range(8)}) == 256


def test_rdna4_tensor_cores_compute_a_matmul_in_the_reference_executor(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gfx12 layout drives codegen's tensor-core lowering and the PYTHON executor's warp step to numpy's matmul
    (a fresh PYTHON:7::gfx1100 instance made with the RDNA4 tensor cores in place of RDNA3's)."""
    monkeypatch.setitem(TENSOR_CORES, "gfx1100", RDNA4_TENSOR_CORES)
    dev = "PYTHON:7::gfx1100"
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((32, 16)).astype(np.float16), rng.standard_normal((16, 16)).astype(np.float16)
    got = Tensor(a, device=dev).matmul(Tensor(b, device=dev), dtype=dtypes.float32).numpy()
    assert Device[dev].renderer.tensor_cores == RDNA4_TENSOR_CORES
    assert any("WMMA" in p.info.src for p in Device[dev]._programs.values())
    np.testing.assert_allclose(got, a.astype(np.float32) @ b.astype(np.float32), rtol=1e-5, atol=1e-5)


def test_kernel_uses_clang_builtins_only() -> None:
    src = sources("gfx1100", lambda d: Tensor.empty(8, 2048, device=d).softmax(-1))
    assert "__builtin_amdgcn_workgroup_id_x()" in src and "__builtin_amdgcn_workitem_id_x()" in src
    assert "__attribute__((shared, aligned(16)))" in src and "__builtin_amdgcn_s_barrier()" in src
    assert '__builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup")' in src
    assert "amdgpu_flat_work_group_size(1, " in src and "__builtin_exp2f" in src
    assert "__ockl" not in src and "__ocml" not in src and "#include" not in src


def test_sin_and_float64_exp_are_approximated_not_called() -> None:
    src = sources(
        "gfx942", lambda d: Tensor.empty(64, device=d).sin() + Tensor.empty(64, dtype=dtypes.float64, device=d).exp2()
    )
    assert "__builtin_sinf" not in src and "__builtin_exp2(" not in src
    assert "__builtin_exp2f" not in src  # the float64 path stays in float64


def test_half_and_bfloat16_are_native_and_matmul_calls_the_arch_builtin() -> None:
    src = sources("gfx1201", lambda d: Tensor.empty(32, 32, dtype=dtypes.bfloat16, device=d).matmul(
        Tensor.empty(32, 32, dtype=dtypes.bfloat16, device=d), dtype=dtypes.float32))  # fmt: skip
    assert "__bf16" in src and "__builtin_amdgcn_wmma_f32_16x16x16_bf16_w32_gfx12" in src
    src = sources("gfx942", lambda d: Tensor.empty(32, 32, dtype=dtypes.float16, device=d).matmul(
        Tensor.empty(32, 32, dtype=dtypes.float16, device=d), dtype=dtypes.float32))  # fmt: skip
    assert "typedef _Float16 half;" in src and "__builtin_amdgcn_mfma_f32_16x16x16f16" in src
