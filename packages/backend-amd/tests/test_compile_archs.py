"""Compile-only: a CI-sized, representative subset of the op conformance suite's kernels is rendered for every
listed AMD arch (`DEV=NULL:HIP:<arch>`), built into code objects by clang-19/lld-19, and checked in the binary with
llvm-objdump-19: half and bfloat16 matmuls use the tensor cores (v_wmma_* on RDNA3/RDNA4, v_mfma_* on CDNA), kernels
with group reductions use LDS and s_barrier. VGPR counts and spills come from the code objects' metadata
(`xgrad_amd.elf`) and are printed as a table (`pytest -s`); no kernel of the subset may spill VGPRs. Every kernel of
the op suite's run on the emulated gfx1100 is compiled for the other archs too (test_mockgpu.py, amd_arch_check.py)."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from xgrad import Tensor, dtypes
from xgrad.device import Device
from xgrad.dtype import DType
from xgrad_amd.compiler import HIPCompileError, HIPCompiler, numbered, toolchain_problem
from xgrad_amd.elf import load_code_object
from xgrad_amd.renderer import AMD_ARCHS

OBJDUMP = shutil.which("llvm-objdump-19")
_problem = toolchain_problem()
pytestmark = pytest.mark.skipif(
    _problem is not None or OBJDUMP is None,
    reason=_problem or "llvm-objdump-19 not installed (apt-get install llvm-19)",
)

F16, BF16, F32, F64, I32, I8 = (
    dtypes.float16,
    dtypes.bfloat16,
    dtypes.float32,
    dtypes.float64,
    dtypes.int32,
    dtypes.int8,
)


def _e(shape: tuple[int, ...], dtype: DType, dev: str) -> Tensor:
    return Tensor.empty(*shape, dtype=dtype, device=dev)


# name -> the op-suite computation (test_ops / test_reduce) whose kernels are built; run on a NULL:HIP device
CASES: dict[str, Callable[[str], Tensor]] = {
    "unary_f32": lambda d: (_e((1000,), F32, d).exp() + _e((1000,), F32, d).log().sqrt()).sin().reciprocal(),
    "unary_f16": lambda d: (_e((513,), F16, d).exp2() * _e((513,), F16, d)).relu(),
    "binary_bf16": lambda d: _e((300,), BF16, d) * _e((300,), BF16, d) + 1.5,
    "exp_log_f64": lambda d: _e((100,), F64, d).exp2() + _e((100,), F64, d).log2(),
    "int_divmod": lambda d: (_e((257,), I32, d) // _e((257,), I32, d)) + (_e((257,), I32, d) % 7),
    "cast_where": lambda d: (_e((64,), I8, d).cast(F32) > 0).where(_e((64,), F32, d), 2.0),
    "sum_axis": lambda d: _e((33, 65), F32, d).sum(axis=1),
    "max_all": lambda d: _e((4096,), F32, d).max(),
    "softmax": lambda d: _e((8, 2048), F32, d).softmax(axis=-1),
    "argmax": lambda d: _e((16, 100), F32, d).argmax(axis=1),
    "cumsum": lambda d: _e((100,), F32, d).cumsum(),
    "permute_pad_flip": lambda d: (
        _e((3, 4, 5), F32, d).permute(2, 0, 1).pad(((1, 1), (0, 0), (2, 0))).flip(0).contiguous() + 1
    ),
    "conv2d": lambda d: _e((1, 3, 10, 10), F32, d).conv2d(_e((4, 3, 3, 3), F32, d), padding=1),
    "matmul_f32": lambda d: _e((48, 40), F32, d) @ _e((40, 24), F32, d),
    "matmul_f16": lambda d: _e((64, 64), F16, d).matmul(_e((64, 64), F16, d), dtype=F32),
    "matmul_bf16": lambda d: _e((32, 64), BF16, d).matmul(_e((64, 48), BF16, d), dtype=F32),
}
# the matrix instruction a half/bfloat16 matmul must become, by family
MATRIX_OPS = {
    "RDNA3": ("v_wmma_f32_16x16x16_f16", "v_wmma_f32_16x16x16_bf16"),
    "RDNA3.5": ("v_wmma_f32_16x16x16_f16", "v_wmma_f32_16x16x16_bf16"),
    "RDNA4": ("v_wmma_f32_16x16x16_f16", "v_wmma_f32_16x16x16_bf16"),
    "CDNA3": ("v_mfma_f32_16x16x16_f16", "v_mfma_f32_16x16x16_bf16"),
    "CDNA2": ("v_mfma_f32_16x16x16f16", "v_mfma_f32_16x16x16bf16_1k"),
}


@functools.cache
def built(arch: str) -> dict[str, list[tuple[str, str, bytes]]]:
    """case -> [(kernel name, source, code object)] for `arch`."""
    dev = f"NULL:HIP:{arch}"
    compiler = HIPCompiler(arch)
    out: dict[str, list[tuple[str, str, bytes]]] = {}
    for case, fn in CASES.items():
        null = Device[dev]
        null._programs.clear()
        fn(dev).realize()
        progs = [(p.info.name, p.info.src) for p in null._programs.values()]
        out[case] = [(name, src, compiler.compile(src)) for name, src in progs]
    return out


def disassemble(blob: bytes) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.hsaco"
        path.write_bytes(blob)
        assert OBJDUMP is not None
        return subprocess.run([OBJDUMP, "-d", str(path)], check=True, capture_output=True, text=True).stdout


def mnemonics(blob: bytes) -> set[str]:
    return set(re.findall(r"^\s+([sv]_[a-z0-9_]+|ds_[a-z0-9_]+|global_[a-z0-9_]+)", disassemble(blob), re.M))


@pytest.mark.parametrize("arch", list(AMD_ARCHS))
def test_op_subset_compiles_for_arch(arch: str) -> None:
    table = built(arch)
    rows = []
    for case, kernels in table.items():
        assert kernels, f"{case} produced no kernel"
        for name, src, blob in kernels:
            co = load_code_object(blob)
            assert name in co.kernels, f"{case}: code object has {list(co.kernels)}, not {name}"
            k = co.kernels[name]
            assert co.target.split("--")[-1].startswith(arch), co.target
            assert k.wave_size == AMD_ARCHS[arch].wave_size
            rows.append((case, name, k.vgpr_count, k.sgpr_count, k.spills, k.lds_size))
            # VGPR spills go to scratch memory (slow); SGPR spills only to VGPR lanes, reported but allowed
            assert k.spills[0] == 0, f"{case}/{name} spills {k.spills[0]} VGPRs on {arch}:\n{numbered(src)}"
    print(f"\n{arch}: case, kernel, VGPRs, SGPRs, (VGPR, SGPR) spills, LDS bytes")
    for row in rows:
        print("  ", *row)


@pytest.mark.parametrize("arch", list(AMD_ARCHS))
def test_half_matmuls_use_matrix_instructions(arch: str) -> None:
    f16_op, bf16_op = MATRIX_OPS[AMD_ARCHS[arch].family]
    for case, want in (("matmul_f16", f16_op), ("matmul_bf16", bf16_op)):
        kernels = built(arch)[case]
        found = set().union(*(mnemonics(blob) for _, _, blob in kernels))
        assert want in found, f"{case} on {arch}: no {want} in {sorted(m for m in found if 'mma' in m)}"
    f32_found = set().union(*(mnemonics(blob) for _, _, blob in built(arch)["matmul_f32"]))
    assert not any("mma" in m for m in f32_found), "a float32 matmul has no tensor core here"


@pytest.mark.parametrize("arch", ["gfx1100", "gfx942"])
def test_group_reduction_uses_lds_and_barrier(arch: str) -> None:
    found = set().union(*(mnemonics(blob) for _, _, blob in built(arch)["softmax"]))
    assert "s_barrier" in found and any(m.startswith("ds_") for m in found), sorted(found)
    assert any(load_code_object(b).kernels[n].lds_size > 0 for n, _, b in built(arch)["softmax"])


def test_compile_error_shows_clang_message_and_numbered_source() -> None:
    bad = 'extern "C" __attribute__((global)) void k(float* data0) {\n  data0[0] = undefined_name;\n}\n'
    with pytest.raises(HIPCompileError) as e:
        HIPCompiler("gfx1100")._compile(bad)
    text = str(e.value)
    assert "undefined_name" in text and "kernel.hip:2:" in text
    assert "2 |   data0[0] = undefined_name;" in text


def test_cache_key_depends_on_arch_and_source() -> None:
    a, b = HIPCompiler("gfx1100"), HIPCompiler("gfx1201")
    assert a.cache_key("x") != b.cache_key("x")
    assert a.cache_key("x") != a.cache_key("y")
    assert a.cache_key("x") == HIPCompiler("gfx1100").cache_key("x")


def test_arch_check_names_what_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """amd_arch_check (the op suite child run's plugin): a kernel clang refuses is named with its test and clang's
    message, the module's other kernels are still compiled and measured, and a kernel whose source names a matrix
    builtin (here only in a comment) without a matrix instruction in its code is a failure too."""
    import amd_arch_check as check

    good = 'extern "C" __attribute__((global)) void E_4(float* data0) {\n  data0[0] = 1.0f;\n}\n'
    bad = 'extern "C" __attribute__((global)) void E_5(float* data0) {\n  data0[0] = undefined_name;\n}\n'
    fake = good.replace("E_4", "E_6").replace("= 1.0f;", "= 2.0f;  // __builtin_amdgcn_wmma_ in words only")
    kernels = [check.Kernel(n, f"test_{n}", {"gfx942": s}) for n, s in (("E_4", good), ("E_5", bad), ("E_6", fake))]
    monkeypatch.setattr(check, "kernels", kernels)
    monkeypatch.setattr(check, "results", check.Results())
    monkeypatch.setattr(check, "kernel_of", {})
    check.compile_arch("gfx942")
    assert sorted(b.kernel.name for b in check.results.built["gfx942"]) == ["E_4", "E_6"]
    assert all(b.vgprs >= 1 and b.spills == (0, 0) for b in check.results.built["gfx942"])
    (refused, no_matrix) = sorted(check.results.failures)
    assert refused.startswith("gfx942: E_5 (built by test_E_5) does not compile") and "undefined_name" in refused
    assert no_matrix.startswith("gfx942: E_6 (built by test_E_6) calls a matrix builtin, but its code has no")
