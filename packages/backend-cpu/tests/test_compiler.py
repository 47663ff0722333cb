import ctypes
import multiprocessing
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from xgrad import Device
from xgrad.errors import CompileError, XgradError
from xgrad.helpers import KNOBS, Context
from xgrad_cpu.compiler import CCompiler, CompilerNotFoundError, TargetError, knows_evex512, predefined_macros
from xgrad_cpu.plugin import COMPILER_CANDIDATES
from xgrad_cpu.program import load_library

SRC = "void k(void** restrict bufs, const int* restrict vars, int start, int end) { ((int*)bufs[0])[0] = 42; }\n"


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path: Path) -> Iterator[Path]:
    with Context(XGRAD_CACHE_DIR=str(tmp_path)):
        yield tmp_path


def cached_files(root: Path) -> list[Path]:
    folder = root / "cpu"
    return sorted(folder.glob("*.so")) if folder.exists() else []


def test_compile_returns_elf_shared_object_default_compiler() -> None:
    lib = CCompiler().compile(SRC)
    assert lib[:4] == b"\x7fELF"


def test_compiler_picks_first_candidate_on_path_when_cc_unset() -> None:
    with Context(CC=""):
        expected = next(path for name in COMPILER_CANDIDATES if (path := shutil.which(name)) is not None)
        assert CCompiler().cmd == [expected]


def test_compiler_uses_cc_knob_when_set() -> None:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no gcc/cc on PATH")
    with Context(CC=gcc):
        assert CCompiler().cmd == [gcc]


def test_name_has_family_and_major_version_any_compiler() -> None:
    c = CCompiler()
    assert re.fullmatch(r"(gcc|clang)-\d+", c.name), c.name


# two kernels gcc 12 miscompiled at -O2, so the CPU backend turns gcc's vectorizers off. A vector WHERE split into
# lanes and summed into an accumulator, as codegen renders interpolate's gathers (its SLP vectorizer, with AVX-512VL):
LANE_SELECT_SRC = """
typedef float float4 __attribute__((vector_size(16)));
typedef unsigned char bool4 __attribute__((vector_size(4)));
void k(void** restrict bufs, const int* restrict vars, int start, int end) {
  float* restrict out = (float*)bufs[0];
  const float* restrict a = (const float*)bufs[1];
  const float* restrict b = (const float*)bufs[2];
  const int* restrict pick = (const int*)bufs[3];
  for (int row = start; row < end; row++) {
    const float w = row * 0.25f;
    const float4 w0 = {w, w, w, w}, w1 = {1.0f - w, 1.0f - w, 1.0f - w, 1.0f - w}, zero = {0.0f, 0.0f, 0.0f, 0.0f};
    float4 acc = zero;
    for (int j = 0; j < 2; j++) {
      const _Bool hit = (pick[row] == j);
      const bool4 m = {hit, hit, hit, hit};
      float4 va, vb;
      __builtin_memcpy(&va, a + j * 4, 16);
      __builtin_memcpy(&vb, b + j * 4, 16);
      const float4 v = va * w0 + vb * w1;
      acc = acc + (float4){(m[0] ? v[0] : zero[0]), (m[1] ? v[1] : zero[1]), (m[2] ? v[2] : zero[2]),
                           (m[3] ? v[3] : zero[3])};
    }
    __builtin_memcpy(out + row * 4, &acc, 16);
  }
}
"""


def test_per_lane_select_summed_into_a_vector_is_compiled_right() -> None:
    rows = 12
    a, b = np.arange(1, 9, dtype=np.float32).reshape(2, 4), np.arange(10, 90, 10, dtype=np.float32).reshape(2, 4)
    pick = (np.arange(rows) % 3).astype(np.int32)  # 2 picks nothing: zeros
    out = np.full((rows, 4), np.nan, np.float32)
    fn = load_library(CCompiler().compile(LANE_SELECT_SRC)).k
    ptrs = (ctypes.c_void_p * 4)(out.ctypes.data, a.ctypes.data, b.ctypes.data, pick.ctypes.data)
    fn(ptrs, None, 0, rows)
    w = (np.arange(rows, dtype=np.float32) * 0.25)[:, None]
    want = np.stack([a[p] * w[r] + b[p] * (1 - w[r]) if p < 2 else np.zeros(4, np.float32) for r, p in enumerate(pick)])
    np.testing.assert_allclose(out, want, rtol=1e-6)


# and a scalar dot product whose unrolled terms come odd lane first (its loop vectorizer; an svd's gradient):
PAIRS_DOT_SRC = """
void k(void** restrict bufs, const int* restrict vars, int start, int end) {
  const float* restrict b = (const float*)bufs[2];
  const float* restrict a = (const float*)bufs[1];
  float* restrict out = (float*)bufs[0];
  float acc = 0.0f;
  for (int i = 0; i < 4; i++) {
    acc = acc + b[i * 2 + 1] * a[i * 2 + 1];
    acc = acc + b[i * 2] * a[i * 2];
  }
  out[0] = acc;
}
"""


def test_a_dot_product_unrolled_out_of_order_is_compiled_right() -> None:
    a = np.array([2.79, -0.039, 0.206, 0.525, 0.931, -0.365, 0.365, 0.931], np.float32)
    b = np.array([-0.084, 0.1, -0.006, -1.357, 0, 0, 0, 0], np.float32)
    out = np.full(1, np.nan, np.float32)
    fn = load_library(CCompiler().compile(PAIRS_DOT_SRC)).k
    fn((ctypes.c_void_p * 3)(out.ctypes.data, a.ctypes.data, b.ctypes.data), None, 0, 1)
    np.testing.assert_allclose(out[0], np.dot(a.astype(np.float64), b), rtol=1e-5)  # gcc 12 gave 25% off


def test_vector_width_follows_the_compilers_target() -> None:
    c = CCompiler()
    macros = subprocess.run(
        [*c.cmd, *c.flags, "-dM", "-E", "-x", "c", "/dev/null"], capture_output=True, text=True, check=True
    ).stdout
    wide = "#define __AVX512F__ 1" in macros and ("#define __EVEX512__ 1" in macros or not knows_evex512(c.name))
    assert c.vector_bytes() == (64 if wide else 32)
    assert Device["CPU"].renderer.max_vector_width == c.vector_bytes() // 4


x86_only = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 -march targets")


@x86_only
def test_cpu_march_sets_the_target_its_vector_width_and_the_cache_key() -> None:
    native, avx2 = CCompiler(march="native"), CCompiler(march="x86-64-v3")
    assert "-march=native" in native.flags and "-march=x86-64-v3" in avx2.flags
    assert avx2.vector_bytes() == 32  # AVX2 without AVX-512, whatever the host has
    assert native.cache_key(SRC) != avx2.cache_key(SRC)
    with Context(CPU_MARCH="x86-64-v3"):
        assert CCompiler().flags == avx2.flags


def test_cpu_march_the_compiler_does_not_know_raises_target_error() -> None:
    with Context(CPU_MARCH="no-such-cpu"), pytest.raises(TargetError, match="no-such-cpu.*set CPU_MARCH"):
        CCompiler()


@x86_only
def test_cpu_march_with_instructions_this_cpu_lacks_raises_target_error() -> None:
    # AMD's SSE4A is on no Intel CPU, Intel's AMX on no AMD one: kernels for the other vendor's CPU would die of an
    # illegal instruction here. The vendor is the host's: under CPU_MARCH=x86-64-v3 (CI's AVX2 pass) the compiler's
    # own macros name no SSE4A even on an AMD host
    c = CCompiler(march="native")
    amd = "__SSE4A__" in predefined_macros(tuple(c.cmd), c.flags)
    with pytest.raises(TargetError, match=f"{'AMX' if amd else 'SSE4A'}.*this CPU lacks"):
        CCompiler(march="sapphirerapids" if amd else "znver3")


@x86_only
def test_a_device_built_for_avx2_runs_16_lane_kernels_through_their_fallbacks() -> None:
    """The CPU device under CPU_MARCH=x86-64-v3 takes 8 lanes; forced to 16 (a width its target lacks) its kernels
    still compile, warnings and all, and compute what numpy does; its programs are not the native device's."""
    code = """
import numpy as np
from xgrad import Device, Tensor
from xgrad.helpers import KNOBS, Context
from xgrad_cpu.device import _PROGRAMS
dev = Device["CPU"]
assert dev.renderer.max_vector_width == 8, dev.renderer.max_vector_width
dev.renderer.max_vector_width = 16
a = np.random.default_rng(0).uniform(-1, 1, (37, 56)).astype(np.float32)
b = np.random.default_rng(1).uniform(-1, 1, (56, 45)).astype(np.float32)
np.testing.assert_allclose((Tensor(a) @ Tensor(b)).relu().numpy(), np.maximum(a @ b, 0), rtol=1e-5, atol=1e-5)
with Context(CPU_MARCH="native"):
    other = Device["CPU:1"]
assert other._programs is not dev._programs and len(_PROGRAMS) == 2
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if k not in KNOBS}
    env.update(CPU_MARCH="x86-64-v3", CACHELEVEL="0", CC=CCompiler().cmd[0])
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


@pytest.mark.parametrize(
    "name,macros,width",
    [
        ("clang-19", "#define __AVX512F__ 1\n#define __EVEX512__ 1\n", 64),
        ("clang-19", "#define __AVX512F__ 1\n#define __AVX10_1__ 1\n", 32),  # -mno-avx512f on an AVX10 host
        ("gcc-12", "#define __AVX512F__ 1\n", 64),  # gcc 12 has no __EVEX512__
        ("gcc-14", "#define __AVX512F__ 1\n", 32),  # -mno-evex512
        ("clang-19", "#define __AVX2__ 1\n", 32),
    ],
)
def test_vector_width_needs_512_bit_registers_not_only_avx512_instructions(
    monkeypatch: pytest.MonkeyPatch, name: str, macros: str, width: int
) -> None:
    c = CCompiler()
    monkeypatch.setattr(c, "name", name)
    monkeypatch.setattr("xgrad_cpu.compiler.predefined_macros", lambda cmd, flags: macros)
    assert c.vector_bytes() == width


def test_compile_hits_disk_cache_second_time() -> None:
    c = CCompiler()
    first = c.compile(SRC)
    second = c.compile(SRC)
    assert c.compiles == 1
    assert first == second
    fresh = CCompiler()  # a new instance (as in a new process) must find it on disk
    assert fresh.compile(SRC) == first
    assert fresh.compiles == 0


def test_compile_stores_binary_under_cache_dir_cpu(cache_in_tmp: Path) -> None:
    c = CCompiler()
    lib = c.compile(SRC)
    path = cache_in_tmp / "cpu" / f"{c.cache_key(SRC)}.so"
    assert path.read_bytes() == lib


def test_compile_bypasses_disk_cache_when_cachelevel_0(cache_in_tmp: Path) -> None:
    c = CCompiler()
    with Context(CACHELEVEL=0):
        c.compile(SRC)
        c.compile(SRC)
    assert c.compiles == 2
    assert cached_files(cache_in_tmp) == []


def test_cache_key_changes_with_source_flags_and_compile_knobs() -> None:
    c = CCompiler()
    key = c.cache_key(SRC)
    assert key == CCompiler().cache_key(SRC)
    assert key != c.cache_key(SRC + "\n")
    assert key != CCompiler(extra_flags=("-DX=1",)).cache_key(SRC)
    with Context(CPU_MARCH="x86-64"):  # declared COMPILE: part of the key
        assert key != c.cache_key(SRC)
    with Context(NOOPT=1):  # declared CODEGEN: it acts through the source, which the key holds already
        assert key == c.cache_key(SRC)


def test_compile_raises_compile_error_with_source_and_log_on_syntax_error() -> None:
    bad = "void k(void** bufs, const int* vars, int start, int end) { int x = ; }\n"
    c = CCompiler()
    with pytest.raises(CompileError) as info:
        c.compile(bad)
    err = info.value
    assert err.source == bad
    assert "error" in err.log
    assert "kernel.c" in err.log  # the compiler's message names the file and line
    assert bad in str(err) and err.log in str(err)


def test_compile_error_is_not_cached() -> None:
    bad = "this is not C\n"
    c = CCompiler()
    for _ in range(2):
        with pytest.raises(CompileError):
            c.compile(bad)
    assert c.compiles == 2


def test_missing_compiler_raises_install_hint_when_cc_not_found() -> None:
    with Context(CC="/nonexistent/xgrad-cc"), pytest.raises(CompilerNotFoundError) as info:
        CCompiler()
    assert isinstance(info.value, XgradError)
    assert "CC" in str(info.value)


def test_missing_compiler_raises_install_hint_when_none_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with Context(CC=""), pytest.raises(CompilerNotFoundError) as info:
        CCompiler()
    msg = str(info.value)
    assert "gcc" in msg and "clang" in msg and "CC" in msg


def _compile_in_child(cache: str) -> bytes:
    with Context(XGRAD_CACHE_DIR=cache):
        return CCompiler().compile(SRC + "/* parallel */\n")


def test_compile_cache_consistent_when_processes_race(cache_in_tmp: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        libs = pool.map(_compile_in_child, [str(cache_in_tmp)] * 8)
    assert all(lib == libs[0] for lib in libs)
    assert len(cached_files(cache_in_tmp)) == 1
    assert list((cache_in_tmp / "cpu").glob("*.tmp")) == []
