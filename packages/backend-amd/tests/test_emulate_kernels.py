"""Kernels clang-19 compiles for gfx1100 from small HIP sources, run on the emulator and compared with numpy:
elementwise math, doubles, integer division, half and packed half, an LDS tree reduction with barriers across 8
waves, divergent branches and loops, dispatch-pointer sizes, constant tables through relocations, and WMMA."""

from __future__ import annotations

import gc
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from xgrad_amd.elf import CodeObject, load_code_object
from xgrad_amd.emulate import DeviceMemory, EmulatorError, MemoryFaultError, dispatch, launch, load, unload

CLANG = shutil.which("clang-19")
pytestmark = pytest.mark.skipif(CLANG is None, reason="clang-19 not installed")

SOURCE = r"""
typedef _Float16 half;
typedef half half2 __attribute__((ext_vector_type(2)));
typedef half half16 __attribute__((ext_vector_type(16)));
typedef float float8 __attribute__((ext_vector_type(8)));
#define K extern "C" __attribute__((global))
#define TID __builtin_amdgcn_workitem_id_x()
#define GID __builtin_amdgcn_workgroup_id_x()
K void elementwise(float* o, const float* a, const float* b, int n) {
  int i = GID * 64 + TID;
  if (i < n) o[i] = __builtin_amdgcn_exp2f(a[i]) * b[i] + __builtin_sqrtf(b[i]) - __builtin_amdgcn_logf(a[i]) / b[i];
}
K void divide(float* o, const float* a, const float* b) { int i = TID; o[i] = a[i] / b[i]; }
K void doubles(double* o, const double* a, long long* l, int n) {
  int i = TID;
  if (i < n) { o[i] = a[i] * 3.0 / (a[i] + 1.0) + __builtin_floor(a[i]); l[i] = (l[i] >> 3) * (long long)a[i]; }
}
K void ints(int* o, const int* a, unsigned* u, int n) {
  int i = TID;
  o[i] = a[i] / (n + 1) + a[i] % 7 + __builtin_popcount(u[i]) + __builtin_clz(u[i] | 1) + (u[i] >> (a[i] & 31));
  u[i] = (unsigned)a[i] * 2654435761u + (u[i] < 5 ? 3 : 9);
}
K void halves(half* o, const half* a, const half2* p, half2* q) {
  int i = TID;
  o[i] = a[i] * (half)2.5 + (half)1.0 / a[i];
  q[i] = p[i] * p[i] + (half2){1.0, -2.0};
}
K void reduce(float* o, const float* a) {
  __attribute__((shared)) float sh[256];
  int i = TID;
  sh[i] = a[GID * 256 + i];
  __builtin_amdgcn_s_barrier();
  for (int s = 128; s > 0; s >>= 1) {
    if (i < s) sh[i] += sh[i + s];
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
  }
  if (i == 0) o[GID] = sh[0];
}
K void per_group_loop(float* o, const float* a) {
  __attribute__((shared)) float sh[64];
  int g = GID, t = TID;
  float acc = 0.0f;
  for (int k = 0; k <= g % 4; k++) {  // a scalar loop whose trip count differs between workgroups
    sh[t] = a[g * 64 + t] * (k + 1);
    __builtin_amdgcn_s_barrier();
    acc += sh[63 - t];
    __builtin_amdgcn_s_barrier();
  }
  o[g * 64 + t] = acc;
}
K void scratch(float* o, const int* idx) {
  float arr[64];  // indexed by a value known only at run time: the array goes to scratch memory
  int t = TID;
  for (int i = 0; i < 64; i++) arr[i] = o[t * 64 + i] * i;
  __builtin_amdgcn_s_barrier();  // every lane has read its row before lanes 0..47 overwrite o[t]
  o[t] = arr[idx[t] & 63];
}
K void branchy(float* o, const float* a, int n) {
  int i = TID;
  float x = a[i], acc = 0.0f;
  if (x > 0.5f) { for (int k = 0; k < n; k++) acc += x * k; } else { acc = -x; }
  o[i] = acc;
}
K void trig(float* o, const float* a) { int i = TID; o[i] = __builtin_amdgcn_sinf(a[i]) + __builtin_amdgcn_cosf(a[i]); }
K void ids(int* o) {
  int i = (__builtin_amdgcn_workitem_id_z() * 4 + __builtin_amdgcn_workitem_id_y()) * 8 + TID;
  int g = (__builtin_amdgcn_workgroup_id_z() * 3 + __builtin_amdgcn_workgroup_id_y()) * 2 + GID;
  const unsigned short* d = (const unsigned short*)__builtin_amdgcn_dispatch_ptr();
  o[g * 96 + i] = g * 1000 + i + d[2] * 100000;
}
__attribute__((constant)) float tbl[4] = {1.0f, 2.0f, 3.0f, 4.0f};
__attribute__((constant)) float tbl2[4] = {5.0f, 6.0f, 7.0f, 8.0f};
__attribute__((constant)) float* ptrs[2] = {tbl, tbl2};
K void table(float* o, int n) { int i = TID; o[i] = ptrs[(i >> 2) & 1][i & 3] * n; }
K void wmma(float* o, const half* a, const half* b, const float* c) {
  int l = TID;
  half16 av, bv;
  for (int k = 0; k < 16; k++) { av[k] = a[(l % 16) * 16 + k]; bv[k] = b[k * 16 + (l % 16)]; }
  float8 acc;
  for (int r = 0; r < 8; r++) acc[r] = c[(2 * r + l / 16) * 16 + (l % 16)];
  acc = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(av, bv, acc);
  for (int r = 0; r < 8; r++) o[(2 * r + l / 16) * 16 + (l % 16)] = acc[r];
}
typedef short short16 __attribute__((ext_vector_type(16)));
K void wmma_bf16(float* o, const short* a, const short* b) {
  int l = TID;
  short16 av, bv;
  for (int k = 0; k < 16; k++) { av[k] = a[(l % 16) * 16 + k]; bv[k] = b[k * 16 + (l % 16)]; }
  float8 acc = {};
  acc = __builtin_amdgcn_wmma_f32_16x16x16_bf16_w32(av, bv, acc);
  for (int r = 0; r < 8; r++) o[(2 * r + l / 16) * 16 + (l % 16)] = acc[r];
}
"""


@pytest.fixture(scope="module")
def co(tmp_path_factory: pytest.TempPathFactory) -> CodeObject:
    tmp = tmp_path_factory.mktemp("emu")
    src, out = tmp / "k.hip", tmp / "k.co"
    src.write_text(SOURCE)
    cmd = [CLANG, "-x", "hip", "--cuda-device-only", "-nogpulib", "-nogpuinc", "--no-gpu-bundle-output",
           "--offload-arch=gfx1100", "-O3", str(src), "-o", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return load_code_object(Path(out).read_bytes())


class Run:
    """Buffers in a fresh DeviceMemory, a launch, the outputs back."""

    def __init__(self, co: CodeObject) -> None:
        self.co = co
        self.mem = DeviceMemory()

    def buf(self, arr: np.ndarray) -> int:
        addr = self.mem.alloc(arr.nbytes)
        self.mem.write(addr, arr)
        return addr

    def get(self, addr: int, like: np.ndarray) -> np.ndarray:
        return np.frombuffer(self.mem.read(addr, like.nbytes), like.dtype).reshape(like.shape)

    def __call__(
        self, name: str, args: list[int | float | bytes], grid: tuple[int, int, int], block: tuple[int, int, int]
    ) -> None:
        k = self.co.kernels[name]
        launch(self.co, name, grid, block, k.pack_kernargs(args, grid, block), self.mem)


def test_elementwise_over_several_workgroups_with_tail(co: CodeObject) -> None:
    rng = np.random.default_rng(0)
    n = 200
    a = rng.uniform(0.1, 4, n).astype(np.float32)
    b = rng.uniform(0.5, 3, n).astype(np.float32)
    r = Run(co)
    o = r.buf(np.zeros(n + 56, np.float32))
    r("elementwise", [o, r.buf(a), r.buf(b), n], (4, 1, 1), (64, 1, 1))
    got = r.get(o, np.zeros(n + 56, np.float32))
    want = np.exp2(a) * b + np.sqrt(b) - np.log2(a) / b
    np.testing.assert_allclose(got[:n], want, rtol=2e-6)
    assert not got[n:].any(), "lanes past n wrote"


def test_division_is_correctly_rounded(co: CodeObject) -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal(64).astype(np.float32) * np.float32(1e3)
    b = rng.standard_normal(64).astype(np.float32)
    b[:6] = [0.0, -0.0, np.inf, 1e-30, 1e-40, -3e-42]  # zeros, infinity, tiny, denormal denominators
    a[4] = np.nan
    r = Run(co)
    o = r.buf(np.zeros(64, np.float32))
    r("divide", [o, r.buf(a), r.buf(b)], (1, 1, 1), (64, 1, 1))
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(r.get(o, np.zeros(64, np.float32)), a / b)


def test_doubles_and_64_bit_integers(co: CodeObject) -> None:
    rng = np.random.default_rng(2)
    a = rng.uniform(-50, 50, 32)
    lv = rng.integers(-(2**40), 2**40, 32)
    r = Run(co)
    o, pl = r.buf(np.zeros(32)), r.buf(lv)
    r("doubles", [o, r.buf(a), pl, 30], (1, 1, 1), (32, 1, 1))
    want = a * 3.0 / (a + 1.0) + np.floor(a)
    np.testing.assert_allclose(r.get(o, np.zeros(32))[:30], want[:30], rtol=1e-15)
    got_l = r.get(pl, lv)
    np.testing.assert_array_equal(got_l[:30], (lv[:30] >> 3) * np.trunc(a[:30]).astype(np.int64))
    np.testing.assert_array_equal(got_l[30:], lv[30:])


def test_integer_division_bits_and_shifts(co: CodeObject) -> None:
    rng = np.random.default_rng(3)
    a = rng.integers(-(2**31), 2**31, 64, dtype=np.int64).astype(np.int32)
    u = rng.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32)
    u[:3] = [0, 1, 4]
    n = 12
    r = Run(co)
    o, pu = r.buf(np.zeros(64, np.int32)), r.buf(u)
    r("ints", [o, r.buf(a), pu, n], (1, 1, 1), (64, 1, 1))
    a64 = a.astype(np.int64)
    q = np.trunc(a64 / (n + 1)).astype(np.int64)
    rem = a64 - np.trunc(a64 / 7).astype(np.int64) * 7
    pop = np.array([bin(int(x)).count("1") for x in u])
    clz = np.array([32 - int(x | 1).bit_length() for x in u])
    want = (q + rem + pop + clz + (u.astype(np.int64) >> (a64 & 31))).astype(np.int64)
    np.testing.assert_array_equal(r.get(o, np.zeros(64, np.int32)), want.astype(np.uint32).astype(np.int32))
    want_u = a.astype(np.uint32).astype(np.uint64) * np.uint64(2654435761) + np.where(u < 5, 3, 9).astype(np.uint64)
    want_u = (want_u & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    np.testing.assert_array_equal(r.get(pu, u), want_u)


def test_half_and_packed_half(co: CodeObject) -> None:
    rng = np.random.default_rng(4)
    a = rng.uniform(0.5, 4, 32).astype(np.float16)
    p = rng.uniform(-3, 3, 64).astype(np.float16)
    r = Run(co)
    o, q = r.buf(np.zeros(32, np.float16)), r.buf(np.zeros(64, np.float16))
    r("halves", [o, r.buf(a), r.buf(p), q], (1, 1, 1), (32, 1, 1))
    want = (a.astype(np.float32) * 2.5).astype(np.float16).astype(np.float32) + (1 / a.astype(np.float32))
    np.testing.assert_allclose(r.get(o, np.zeros(32, np.float16)).astype(np.float32), want, rtol=2e-3)
    wq = p.astype(np.float32) ** 2 + np.tile(np.float32([1.0, -2.0]), 32)
    np.testing.assert_allclose(r.get(q, np.zeros(64, np.float16)).astype(np.float32), wq, rtol=2e-3, atol=2e-3)


def test_lds_reduction_with_barriers_across_waves(co: CodeObject) -> None:
    rng = np.random.default_rng(5)
    a = rng.standard_normal(3 * 256).astype(np.float32)
    r = Run(co)
    o = r.buf(np.zeros(3, np.float32))
    r("reduce", [o, r.buf(a)], (3, 1, 1), (256, 1, 1))
    np.testing.assert_allclose(r.get(o, np.zeros(3, np.float32)), a.reshape(3, 256).sum(axis=1), rtol=1e-5, atol=1e-5)


def test_workgroups_with_different_scalar_control_flow_and_barriers(co: CodeObject) -> None:
    rng = np.random.default_rng(9)
    groups = 7
    a = rng.standard_normal((groups, 64)).astype(np.float32)
    r = Run(co)
    o = r.buf(np.zeros((groups, 64), np.float32))
    r("per_group_loop", [o, r.buf(a)], (groups, 1, 1), (64, 1, 1))
    trips = np.arange(groups) % 4 + 1
    want = a[:, ::-1] * (trips * (trips + 1) / 2)[:, None]  # sum over k of a[g, 63 - t] * (k + 1)
    np.testing.assert_allclose(r.get(o, np.zeros((groups, 64), np.float32)), want, rtol=1e-6)


def test_grid_over_several_batches(co: CodeObject, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch, "MAX_BATCH_BYTES", 1 << 18)  # a few dozen workgroups per batch
    rng = np.random.default_rng(10)
    groups = 300
    n = groups * 64 - 5
    a = rng.uniform(0.1, 4, n).astype(np.float32)
    b = rng.uniform(0.5, 3, n).astype(np.float32)
    r = Run(co)
    o = r.buf(np.zeros(n, np.float32))
    r("elementwise", [o, r.buf(a), r.buf(b), n], (groups, 1, 1), (64, 1, 1))
    want = np.exp2(a) * b + np.sqrt(b) - np.log2(a) / b
    np.testing.assert_allclose(r.get(o, np.zeros(n, np.float32)), want, rtol=2e-6)


def test_private_array_lives_in_scratch(co: CodeObject) -> None:
    rng = np.random.default_rng(11)
    src = rng.standard_normal((48, 64)).astype(np.float32)
    idx = rng.integers(0, 1000, 48).astype(np.int32)
    assert co.kernels["scratch"].descriptor.private_segment_fixed_size > 0  # the array is in scratch memory
    r = Run(co)
    o = r.buf(src)
    r("scratch", [o, r.buf(idx)], (1, 1, 1), (48, 1, 1))
    want = src[np.arange(48), idx & 63] * (idx & 63).astype(np.float32)
    got = np.frombuffer(r.mem.read(o, 48 * 4), np.float32)
    np.testing.assert_array_equal(got, want)


def test_divergent_branch_and_loop(co: CodeObject) -> None:
    rng = np.random.default_rng(6)
    a = rng.uniform(0, 1, 48).astype(np.float32)
    n = 7
    r = Run(co)
    o = r.buf(np.zeros(48, np.float32))
    r("branchy", [o, r.buf(a), n], (1, 1, 1), (48, 1, 1))
    want = np.where(a > 0.5, a * sum(range(n)), -a)
    np.testing.assert_allclose(r.get(o, np.zeros(48, np.float32)), want, rtol=1e-6)


def test_transcendentals_take_revolutions(co: CodeObject) -> None:
    a = np.linspace(-1, 1, 32, dtype=np.float32)
    r = Run(co)
    o = r.buf(np.zeros(32, np.float32))
    r("trig", [o, r.buf(a)], (1, 1, 1), (32, 1, 1))
    want = np.sin(2 * np.pi * a.astype(np.float64)) + np.cos(2 * np.pi * a.astype(np.float64))
    np.testing.assert_allclose(r.get(o, np.zeros(32, np.float32)), want, atol=1e-6)


def test_workitem_and_workgroup_ids_in_three_dimensions(co: CodeObject) -> None:
    r = Run(co)
    o = r.buf(np.full(12 * 96, -1, np.int32))
    r("ids", [o], (2, 3, 2), (8, 4, 3))
    g, i = np.meshgrid(np.arange(12), np.arange(96), indexing="ij")
    np.testing.assert_array_equal(r.get(o, np.zeros((12, 96), np.int32)), g * 1000 + i + 8 * 100000)


def test_constant_table_through_relocated_pointers(co: CodeObject) -> None:
    r = Run(co)
    o = r.buf(np.zeros(32, np.float32))
    r("table", [o, 3], (1, 1, 1), (32, 1, 1))
    tables = np.float32([[1, 2, 3, 4], [5, 6, 7, 8]])
    i = np.arange(32)
    np.testing.assert_array_equal(r.get(o, np.zeros(32, np.float32)), tables[(i >> 2) & 1, i & 3] * 3)


def test_wmma_f16_matches_numpy_matmul(co: CodeObject) -> None:
    rng = np.random.default_rng(7)
    a = rng.standard_normal((16, 16)).astype(np.float16)
    b = rng.standard_normal((16, 16)).astype(np.float16)
    c = rng.standard_normal((16, 16)).astype(np.float32)
    r = Run(co)
    o = r.buf(np.zeros((16, 16), np.float32))
    r("wmma", [o, r.buf(a), r.buf(b), r.buf(c)], (1, 1, 1), (32, 1, 1))
    want = a.astype(np.float64) @ b.astype(np.float64) + c
    np.testing.assert_allclose(r.get(o, np.zeros((16, 16), np.float32)), want, rtol=1e-5, atol=1e-5)


def test_wmma_bf16_matches_numpy_matmul(co: CodeObject) -> None:
    rng = np.random.default_rng(8)
    a32 = rng.standard_normal((16, 16)).astype(np.float32)
    b32 = rng.standard_normal((16, 16)).astype(np.float32)
    a_bits, b_bits = ((x.view(np.uint32) >> np.uint32(16)).astype(np.uint16) for x in (a32, b32))
    r = Run(co)
    o = r.buf(np.zeros((16, 16), np.float32))
    r("wmma_bf16", [o, r.buf(a_bits), r.buf(b_bits)], (1, 1, 1), (32, 1, 1))
    a = (a_bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)  # bf16 values, exactly
    b = (b_bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    np.testing.assert_allclose(r.get(o, np.zeros((16, 16), np.float32)), a @ b, rtol=1e-5, atol=1e-5)


def test_image_is_loaded_once_per_memory_and_freed(co: CodeObject, tmp_path: Path) -> None:
    r = Run(co)
    base = load(co, r.mem)
    assert load(co, r.mem) == base
    assert r.mem.read(base + co.kernels["trig"].code_offset, 8) == co.kernels["trig"].code[:8]
    unload(co, r.mem)
    with pytest.raises(MemoryFaultError):
        r.mem.read(base, 4)
    again = load_code_object(co.blob)  # a second parse of the same object: its own image, freed with it
    base2 = load(again, r.mem)
    del again
    gc.collect()
    with pytest.raises(MemoryFaultError):
        r.mem.read(base2, 4)


def test_bad_launches_raise(co: CodeObject) -> None:
    r = Run(co)
    with pytest.raises(EmulatorError, match="no kernel 'nope'"):
        launch(co, "nope", (1, 1, 1), (32, 1, 1), b"", r.mem)
    with pytest.raises(EmulatorError, match="invalid"):
        launch(co, "trig", (1, 1, 1), (0, 1, 1), bytes(16), r.mem)
    with pytest.raises(EmulatorError, match="at most 1024"):
        launch(co, "trig", (1, 1, 1), (2048, 1, 1), bytes(16), r.mem)
    launch(co, "trig", (0, 1, 1), (32, 1, 1), bytes(16), r.mem)  # no workgroups, nothing runs
