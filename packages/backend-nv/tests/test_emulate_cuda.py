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


def test_out_of_bounds_store_names_the_kernel_and_address(module) -> None:  # type: ignore[no-untyped-def]
    mem = DeviceMemory()
    a = _buf(mem, np.zeros(64, np.float32))
    out = mem.alloc(4 * 16)
    with pytest.raises(EmulatorError, match=r"kernel axpy.*0x"):
        module.launch("axpy", (1, 1, 1), (64, 1, 1), [out, a, a, 64], mem)
