"""The PTX interpreter on PTX that nvcc emits for small CUDA kernels, checked against numpy."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from xgrad_nv.emulate import DeviceMemory, EmulatorError, load_ptx

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) is not installed")

SOURCE = r"""
extern "C" __global__ void axpy(float* out, const float* a, const float* b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i] * 2.0f;
}
extern "C" __global__ void block_sum(float* out, const float* a, int n) {
  __shared__ float s[256];
  int t = threadIdx.x;
  float acc = 0.f;
  for (int i = t; i < n; i += blockDim.x) acc += a[i];
  s[t] = acc;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (t < k) s[t] += s[t + k];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = s[0];
}
extern "C" __global__ void branchy(int* out, const int* a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int v = a[i];
  if (v % 3 == 0) v = v / 3 - 7;
  else if (v & 1) v = v * v + (v >> 2);
  else { for (int k = 0; k < (v & 7); k++) v ^= k << k; }
  out[i] = v;
}
extern "C" __global__ void dsin(double* out, const double* a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = sin(a[i]);
}
extern "C" __global__ void transcend(float* out, const float* a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = sinf(a[i]) + expf(fminf(a[i], 50.0f) * 0.1f) + sqrtf(fabsf(a[i])) + log2f(fabsf(a[i]) + 1.0f);
}
"""


@pytest.fixture(scope="module")
def module(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    d = Path(tmp_path_factory.mktemp("cuda"))
    (d / "k.cu").write_text(SOURCE)
    subprocess.run([str(NVCC), "-ptx", "-arch=sm_80", "k.cu", "-o", "k.ptx"], cwd=d, check=True)
    return load_ptx((d / "k.ptx").read_text())


def _buf(mem: DeviceMemory, arr: np.ndarray) -> int:
    addr = mem.alloc(arr.nbytes)
    mem.write(addr, arr)
    return addr


def test_elementwise_matches_numpy_with_a_partial_last_block(module) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    n = 1000
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    mem = DeviceMemory()
    out = mem.alloc(4 * n)
    module.launch("axpy", (8, 1, 1), (128, 1, 1), [out, _buf(mem, a), _buf(mem, b), n], mem)
    np.testing.assert_array_equal(np.frombuffer(mem.read(out, 4 * n), np.float32), a + b * np.float32(2))


def test_shared_memory_reduction_with_barriers_matches_a_float32_tree(module) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(1)
    n = 1000
    a = rng.standard_normal(n).astype(np.float32)
    mem = DeviceMemory()
    out = mem.alloc(4 * 3)
    module.launch("block_sum", (3, 1, 1), (256, 1, 1), [out, _buf(mem, a), n], mem)
    acc = np.zeros(256, np.float32)
    for i in range(n):
        acc[i % 256] += a[i]
    k = 128
    while k:
        acc[:k] = acc[:k] + acc[k : 2 * k]
        k //= 2
    np.testing.assert_array_equal(np.frombuffer(mem.read(out, 12), np.float32), np.full(3, acc[0]))


def test_divergent_branches_and_loops_match_python(module) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(2)
    n = 500
    a = rng.integers(-1000, 1000, n).astype(np.int32)
    mem = DeviceMemory()
    out = mem.alloc(4 * n)
    module.launch("branchy", (4, 1, 1), (128, 1, 1), [out, _buf(mem, a), n], mem)
    want = []
    for v in a.tolist():
        if v % 3 == 0 if v >= 0 else -(-v % 3) == 0:
            v = int(v / 3) - 7
        elif v & 1:
            v = v * v + (v >> 2)
        else:
            k = 0
            while k < (v & 7):  # C re-reads v & 7 every iteration
                v ^= k << k
                k += 1
        want.append(v)
    np.testing.assert_array_equal(np.frombuffer(mem.read(out, 4 * n), np.int32), np.array(want, np.int32))


def test_libdevice_transcendentals_within_float32_error(module) -> None:  # type: ignore[no-untyped-def]
    x = np.concatenate([np.linspace(-50, 50, 200), [1e5, -3e6, 1e10, 0.0]]).astype(np.float32)
    mem = DeviceMemory()
    out = mem.alloc(4 * x.size)
    module.launch("transcend", (1, 1, 1), (256, 1, 1), [out, _buf(mem, x), x.size], mem)
    xd = x.astype(np.float64)
    want = np.sin(xd) + np.exp(np.minimum(xd, 50) * 0.1) + np.sqrt(np.abs(xd)) + np.log2(np.abs(xd) + 1)
    np.testing.assert_allclose(np.frombuffer(mem.read(out, 4 * x.size), np.float32), want, rtol=1e-5, atol=1e-5)


def test_float64_sin_calls_a_function_with_carry_arithmetic(module) -> None:  # type: ignore[no-untyped-def]
    """libdevice's float64 sin calls __internal_trig_reduction_slowpathd (a .func with .param arguments, a local
    array, a 128-bit multiply through mad.cc/madc in a nested { } scope that shadows registers) for large inputs."""
    x = np.concatenate([np.linspace(-10, 10, 50), [1e6, -3e7, 1e15, 1e300, 0.5]])
    mem = DeviceMemory()
    out = mem.alloc(8 * x.size)
    module.launch("dsin", (1, 1, 1), (64, 1, 1), [out, _buf(mem, x), x.size], mem)
    np.testing.assert_allclose(np.frombuffer(mem.read(out, 8 * x.size), np.float64), np.sin(x), rtol=4e-16, atol=0)


def test_out_of_bounds_store_names_the_kernel_and_address(module) -> None:  # type: ignore[no-untyped-def]
    mem = DeviceMemory()
    a = _buf(mem, np.zeros(64, np.float32))
    out = mem.alloc(4 * 16)
    with pytest.raises(EmulatorError, match=r"kernel axpy.*0x"):
        module.launch("axpy", (1, 1, 1), (64, 1, 1), [out, a, a, 64], mem)


MMA_SOURCE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
// one 16x8x16 tile per warp: A row-major 16x16, B row-major 16x8, C/D row-major 16x8 (float);
// fragments loaded as the PTX ISA's "Matrix Fragments for mma.m16n8k16" table places them
template <typename T>
__device__ void tile(float* d, const T* a, const T* b, const float* c) {
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  a += warp * 256; b += warp * 128; c += warp * 128; d += warp * 128;
  int g = lane >> 2, t = lane % 4;
  unsigned ra[4], rb[2];
  for (int i = 0; i < 4; i++) {
    int row = g + 8 * (i & 1), col = 2 * t + 8 * (i >> 1);
    T lo = a[row * 16 + col], hi = a[row * 16 + col + 1];
    ra[i] = (unsigned)*(unsigned short*)&lo | ((unsigned)*(unsigned short*)&hi << 16);
  }
  for (int i = 0; i < 2; i++) {
    int row = 2 * t + 8 * i;
    T lo = b[row * 8 + g], hi = b[(row + 1) * 8 + g];
    rb[i] = (unsigned)*(unsigned short*)&lo | ((unsigned)*(unsigned short*)&hi << 16);
  }
  float acc[4];
  for (int i = 0; i < 4; i++) acc[i] = c[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)];
  if (sizeof(T) == 2 && __is_same(T, __half))
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(rb[0]), "r"(rb[1]));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(rb[0]), "r"(rb[1]));
  for (int i = 0; i < 4; i++) d[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = acc[i];
}
extern "C" __global__ void mma_f16(float* d, const __half* a, const __half* b, const float* c) { tile(d, a, b, c); }
extern "C" __global__ void mma_bf16(float* d, const __nv_bfloat16* a, const __nv_bfloat16* b, const float* c) {
  tile(d, a, b, c);
}
"""


PACKED_SOURCE = r"""
#include <cuda_bf16.h>
#include <cuda_fp16.h>
extern "C" __global__ void pack(__nv_bfloat162* o, __half2* h, const float* a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    o[i] = __floats2bfloat162_rn(a[2 * i], a[2 * i + 1]);
    h[i] = __floats2half2_rn(a[2 * i], a[2 * i + 1]);
    o[i] = __hmul2(o[i], o[i]);
    h[i] = __hfma2(h[i], h[i], h[i]);
  }
}
"""


def _bf16_round(x: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def test_packed_half2_and_bfloat162_for_sm_90(tmp_path: Path) -> None:
    """cvt.rn.{bf16x2,f16x2}.f32 packing, mul.bf16x2 and fma.rn.f16x2 (what cuda_bf16.h emits for sm_90)."""
    (tmp_path / "p.cu").write_text(PACKED_SOURCE)
    subprocess.run([str(NVCC), "-ptx", "-arch=sm_90", "p.cu", "-o", "p.ptx"], cwd=tmp_path, check=True)
    mod = load_ptx((tmp_path / "p.ptx").read_text())
    n = 40
    a = (np.random.default_rng(4).standard_normal(2 * n) * 3).astype(np.float32)
    mem = DeviceMemory()
    o, h = mem.alloc(4 * n), mem.alloc(4 * n)
    mod.launch("pack", (1, 1, 1), (64, 1, 1), [o, h, _buf(mem, a), n], mem)
    got_bf = (np.frombuffer(mem.read(o, 4 * n), np.uint16).astype(np.uint32) << 16).view(np.float32)
    b = _bf16_round(a)
    np.testing.assert_array_equal(got_bf, _bf16_round(b * b))
    ah = a.astype(np.float16)
    want_h = (ah.astype(np.float64) * ah + ah).astype(np.float16)
    np.testing.assert_array_equal(np.frombuffer(mem.read(h, 4 * n), np.float16), want_h)


@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_mma_m16n8k16_matches_numpy_matmul(kind: str, tmp_path: Path) -> None:
    (tmp_path / "m.cu").write_text(MMA_SOURCE)
    subprocess.run([str(NVCC), "-ptx", "-arch=sm_80", "m.cu", "-o", "m.ptx"], cwd=tmp_path, check=True)
    mod = load_ptx((tmp_path / "m.ptx").read_text())
    rng = np.random.default_rng(3)
    warps = 3
    a = rng.standard_normal((warps, 16, 16)).astype(np.float32)
    b = rng.standard_normal((warps, 16, 8)).astype(np.float32)
    c = rng.standard_normal((warps, 16, 8)).astype(np.float32)
    if kind == "f16":
        a, b = a.astype(np.float16), b.astype(np.float16)
        a_bits, b_bits = a, b
    else:  # bfloat16 values (float32 with the low 16 bits cleared) and their bits
        a, b = ((x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32) for x in (a, b))
        a_bits, b_bits = ((x.view(np.uint32) >> 16).astype(np.uint16) for x in (a, b))
    mem = DeviceMemory()
    d = mem.alloc(c.nbytes)
    mod.launch(
        f"mma_{kind}", (1, 1, 1), (32 * warps, 1, 1), [d, _buf(mem, a_bits), _buf(mem, b_bits), _buf(mem, c)], mem
    )
    want = a.astype(np.float64) @ b.astype(np.float64) + c
    got = np.frombuffer(mem.read(d, c.nbytes), np.float32).reshape(c.shape)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


MMA_MORE_SOURCE = r"""
#include <cuda_fp16.h>
__device__ unsigned pack(__half lo, __half hi) {
  return (unsigned)__half_as_ushort(lo) | ((unsigned)__half_as_ushort(hi) << 16);
}
// m16n8k8 with f16 inputs: A 16x8 row-major, B 8x8 row-major, C/D 16x8 float (PTX ISA fragment tables)
extern "C" __global__ void k8_f16(float* d, const __half* a, const __half* b, const float* c) {
  int lane = threadIdx.x, g = lane >> 2, t = lane % 4;
  unsigned ra[2], rb;
  for (int i = 0; i < 2; i++) ra[i] = pack(a[(g + 8 * i) * 8 + 2 * t], a[(g + 8 * i) * 8 + 2 * t + 1]);
  rb = pack(b[(2 * t) * 8 + g], b[(2 * t + 1) * 8 + g]);
  float acc[4];
  for (int i = 0; i < 4; i++) acc[i] = c[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)];
  asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3]) : "r"(ra[0]), "r"(ra[1]), "r"(rb));
  for (int i = 0; i < 4; i++) d[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = acc[i];
}
// m16n8k8 with tf32 inputs (float bits; the low 13 mantissa bits are ignored)
extern "C" __global__ void k8_tf32(float* d, const float* a, const float* b, const float* c) {
  int lane = threadIdx.x, g = lane >> 2, t = lane % 4;
  unsigned ra[4], rb[2];
  for (int i = 0; i < 4; i++) ra[i] = __float_as_uint(a[(g + 8 * (i & 1)) * 8 + t + 4 * (i >> 1)]);
  for (int i = 0; i < 2; i++) rb[i] = __float_as_uint(b[(t + 4 * i) * 8 + g]);
  float acc[4];
  for (int i = 0; i < 4; i++) acc[i] = c[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)];
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
      : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(rb[0]), "r"(rb[1]));
  for (int i = 0; i < 4; i++) d[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = acc[i];
}
// m16n8k16 with f16 accumulators: C/D as two registers of packed halves
extern "C" __global__ void k16_f16acc(__half* d, const __half* a, const __half* b, const __half* c) {
  int lane = threadIdx.x, g = lane >> 2, t = lane % 4;
  unsigned ra[4], rb[2], rc[2];
  for (int i = 0; i < 4; i++) {
    int row = g + 8 * (i & 1), col = 2 * t + 8 * (i >> 1);
    ra[i] = pack(a[row * 16 + col], a[row * 16 + col + 1]);
  }
  for (int i = 0; i < 2; i++) rb[i] = pack(b[(2 * t + 8 * i) * 8 + g], b[(2 * t + 8 * i + 1) * 8 + g]);
  for (int i = 0; i < 2; i++) rc[i] = pack(c[(g + 8 * i) * 8 + 2 * t], c[(g + 8 * i) * 8 + 2 * t + 1]);
  asm("mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%0,%1};"
      : "+r"(rc[0]), "+r"(rc[1]) : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(rb[0]), "r"(rb[1]));
  for (int i = 0; i < 2; i++) {
    d[(g + 8 * i) * 8 + 2 * t] = __ushort_as_half((unsigned short)(rc[i] & 0xFFFF));
    d[(g + 8 * i) * 8 + 2 * t + 1] = __ushort_as_half((unsigned short)(rc[i] >> 16));
  }
}
"""


def test_mma_m16n8k8_f16_tf32_and_half_accumulators_match_numpy(tmp_path: Path) -> None:
    (tmp_path / "m.cu").write_text(MMA_MORE_SOURCE)
    subprocess.run([str(NVCC), "-ptx", "-arch=sm_80", "m.cu", "-o", "m.ptx"], cwd=tmp_path, check=True)
    mod = load_ptx((tmp_path / "m.ptx").read_text())
    rng = np.random.default_rng(5)
    mem = DeviceMemory()
    c = rng.standard_normal((16, 8)).astype(np.float32)
    a8 = rng.standard_normal((16, 8)).astype(np.float16)
    b8 = rng.standard_normal((8, 8)).astype(np.float16)
    d = mem.alloc(c.nbytes)
    mod.launch("k8_f16", (1, 1, 1), (32, 1, 1), [d, _buf(mem, a8), _buf(mem, b8), _buf(mem, c)], mem)
    got = np.frombuffer(mem.read(d, c.nbytes), np.float32).reshape(16, 8)
    np.testing.assert_allclose(got, a8.astype(np.float64) @ b8.astype(np.float64) + c, rtol=1e-5, atol=1e-5)
    at = rng.standard_normal((16, 8)).astype(np.float32)
    bt = rng.standard_normal((8, 8)).astype(np.float32)
    mod.launch("k8_tf32", (1, 1, 1), (32, 1, 1), [d, _buf(mem, at), _buf(mem, bt), _buf(mem, c)], mem)
    got = np.frombuffer(mem.read(d, c.nbytes), np.float32).reshape(16, 8)
    tf32 = lambda x: (x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)  # noqa: E731
    np.testing.assert_allclose(got, tf32(at) @ tf32(bt) + c, rtol=1e-5, atol=1e-5)
    a16 = rng.standard_normal((16, 16)).astype(np.float16)
    b16 = rng.standard_normal((16, 8)).astype(np.float16)
    c16 = c.astype(np.float16)
    dh = mem.alloc(c16.nbytes)
    mod.launch("k16_f16acc", (1, 1, 1), (32, 1, 1), [dh, _buf(mem, a16), _buf(mem, b16), _buf(mem, c16)], mem)
    got_h = np.frombuffer(mem.read(dh, c16.nbytes), np.float16).reshape(16, 8)
    want_h = (a16.astype(np.float64) @ b16.astype(np.float64) + c16).astype(np.float16)
    np.testing.assert_allclose(got_h.astype(np.float64), want_h.astype(np.float64), rtol=2e-3, atol=2e-3)
