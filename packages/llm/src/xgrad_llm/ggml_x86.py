"""llama.cpp's x86 CPU kernels as xgrad tensor ops: float32 inputs in, llama.cpp's float32 results, bit for bit, out.

`numerics="llama.cpp-avx2"` / `"llama.cpp-avx512"` (see `numerics.py` and `model.Transformer`) compute a model's
sums in the order llama.cpp's CPU backend (ggml-cpu, built for that instruction set, as llama-cpp-python builds it
with GGML_NATIVE) computes them, with its roundings and its fused multiply-adds, so that its greedy ids come out even
at near ties. The facts are from ggml's source; scripts/check_llamacpp_ops.py recomputes each node llama.cpp
evaluates for Gemma 3 270M (dumped through its `cb_eval` callback) with a numpy model of these rules and finds every
one bit-exact on an AVX2 build. What the kernels do:

- A product with a Q4_0/Q5_0/Q8_0 weight (Q8_0 activations) or a Q4_K/Q6_K weight (Q8_K activations): integer
  products summed per block into 8 lanes (lane m holds the elements e with e % 32 // 4 == m; Q4_K and Q6_K scale
  each 32 or 16 elements by their integer sub-scale first; Q6_K subtracts 32 * sub-scale * the activations' sums of
  the elements 32m .. 32m + 31 from lane m), each lane's block sums multiplied by the float block scale (the weight's
  float16 scale times the activation's) and accumulated with one FMA per block, then the 8 lanes summed as
  ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)). Q4_K adds its minimums, FMA-accumulated in 4 lanes (one per
  pair of sub-blocks) and summed (m0 + m2) + (m1 + m3), last. These are the AVX2 kernels in both builds (ggml has no
  512-bit ones for these types), for one row and for a prompt's rows alike (llamafile's tinyBLAS sums the same way).
- Float16 dot products (queries with keys, attention weights with values): in a decode step, ggml_vec_dot_f16 keeps
  4 accumulators of `lanes` float32 lanes (element i in accumulator i // lanes % 4, lane i % lanes), adds them as
  (a0 + a2) + (a1 + a3) and sums the lanes (8: (l0+l4 + l1+l5) + (l2+l6 + l3+l7); 16: halves, quarters, then (0+2)
  + (1+3)); elements past the last multiple of 4 * lanes are added one by one in float64. In a prompt step (2 or more
  rows) llamafile's tinyBLAS keeps one accumulator of `lanes` lanes, summed as hsum_float_8 (8) or halves (16).
- Softmax: ggml's vector expf (`lanes` wide: the AVX2 and the AVX-512 forms round differently), the exponentials
  summed `lanes` at a time (a float32 tree) and those sums in float64, then scaled by float32(1 / sum).
- RMS norm: a float64 sum of the float32 squares, the mean rounded to float32, scaled by 1 / sqrtf(mean + eps).
- RoPE: the angle p * theta_scale^i multiplied up in float32 (theta_scale = powf(base, -2 / d)), the C library's
  cosf and sinf of it (`rope_tables`), and the rotation x0 * cos - x1 * sin as fma(x0, cos, -(x1 * sin)).

Exactness here does not depend on the C compiler: xgrad's CPU backend contracts a * b + c into an FMA wherever it
can (-ffp-contract=fast), llama.cpp only where its source or its compiler did, so every add that must round its own
inputs runs in float64 on float32 operands (`add32`, exact but for a double rounding about once in 2^29 sums), and
every FMA as a float64 product (exact) plus a float64 add, rounded to float32 once (`fma32`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from xgrad import Tensor
from xgrad.dtype import dtypes
from xgrad_llm.quants import AFFINE, BLOCK_SIZES, GGMLType

F32, F64 = dtypes.float32, dtypes.float64
EXACT_TYPES = (GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K)
_Q0 = (GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q8_0)
SLICE_BYTES = 16 << 20  # the most lane sums (float32) one slice of a product writes (see `product`)


def add32(a: Tensor, b: Tensor) -> Tensor:
    """a + b of float32 tensors, rounded to float32 on its own (never fused with a product that feeds it)."""
    return (a.cast(F64) + b.cast(F64)).cast(F32)


def fma32(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """a * b + c of float32 tensors with one rounding to float32, as a fused multiply-add (the product is exact in
    float64)."""
    return (a.cast(F64) * b.cast(F64) + c.cast(F64)).cast(F32)


def hsum8(x: Tensor) -> Tensor:
    """ggml's hsum_float_8 (and tinyBLAS's 256-bit hsum) over the last axis, 8 lanes: (l0+l4 + l2+l6) + (l1+l5 +
    l3+l7)."""
    r = add32(x[..., 4:], x[..., :4])
    r = add32(r[..., :2], r[..., 2:])
    return add32(r[..., 0], r[..., 1])


def reduce_lanes(x: Tensor, lanes: int) -> Tensor:
    """One vector of `lanes` float32 lanes (the last axis) summed as ggml's GGML_F32x8_REDUCE does (8: lo + hi, then
    two horizontal adds) or _mm512_reduce_add_ps (16: halves, then halves...)."""
    if lanes == 8:
        t = add32(x[..., :4], x[..., 4:])
        return add32(add32(t[..., 0], t[..., 1]), add32(t[..., 2], t[..., 3]))
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = add32(x[..., :half], x[..., half:])
    return x[..., 0]


# ---- products with quantised weights ----
@dataclass(frozen=True)
class BlockInts:
    """A quantised matrix (N, K) as llama.cpp's dot products see it: integer quants `q` (N, K / block, block), the
    float16 block scale `d` (N, K / block) as float32, and for the K-quants the integer sub-scales `sc` (N, K / block,
    groups), Q4_K's integer minimums `m` (N, K / block, 8) and their float16 scale `dmin` (N, K / block)."""

    type: GGMLType
    q: Tensor
    d: Tensor
    sc: Tensor | None = None
    m: Tensor | None = None
    dmin: Tensor | None = None

    def rows(self, start: int, size: int) -> BlockInts:
        """Rows [start, start + size) of the matrix, lazily."""

        def part(t: Tensor) -> Tensor:
            return t.shrink(((start, start + size), *((None,) * (t.ndim - 1))))

        return BlockInts(
            self.type,
            part(self.q),
            part(self.d),
            None if self.sc is None else part(self.sc),
            None if self.m is None else part(self.m),
            None if self.dmin is None else part(self.dmin),
        )

    @classmethod
    def from_raw(cls, raw: Tensor, type_id: int, shape: tuple[int, int]) -> BlockInts:
        """The blocks of a (N, K) matrix of GGML type `type_id` from its bytes (a 1-d uint8 tensor)."""
        kind = GGMLType(type_id)
        n, k = shape
        block, size = BLOCK_SIZES[kind]
        b = raw.reshape(-1, size)
        aff = AFFINE[kind](b)
        nb = k // block
        q = aff.q.reshape(n, nb, block)
        d_at = 208 if kind == GGMLType.Q6_K else 0
        d = _f16_at(b, d_at).reshape(n, nb)
        if kind in _Q0:
            return cls(kind, q, d)
        groups = aff.scale.shape[-1]
        sc = _ratio(aff.scale, _f16_at(b, d_at)).reshape(n, nb, groups)
        if kind == GGMLType.Q6_K:
            return cls(kind, q, d, sc)
        assert aff.offset is not None  # Q4_K: w = d * sc * q - dmin * m
        dmin = _f16_at(b, 2)
        m = _ratio(-aff.offset, dmin).reshape(n, nb, groups)
        return cls(kind, q, d, sc, m, dmin.reshape(n, nb))


def _f16_at(b: Tensor, at: int) -> Tensor:
    pair = b[:, at : at + 2].cast(dtypes.uint16)
    return (pair[:, 0:1] | (pair[:, 1:2] << 8)).bitcast(dtypes.float16).cast(F32)


def _ratio(scaled: Tensor, unit: Tensor) -> Tensor:
    """The integers i of scaled = unit * i (exact products, so the quotient is exact), as int32."""
    return (unit != 0).where(scaled / unit, 0.0).round().cast(dtypes.int32)


def _lane_sums(p: Tensor) -> Tensor:
    """Integer products (..., block) summed into 8 lanes (..., 8): lane m holds the elements e with e % 32 // 4 == m."""
    return p.reshape(*p.shape[:-1], p.shape[-1] // 32, 8, 4).sum((-3, -1))


def _fma_chain(d: Tensor, ints: Tensor) -> Tensor:
    """acc = fma(d[b], ints[b], acc) over the blocks b in order, from acc = 0: d (..., nb), ints (..., nb, lanes)
    float32; (..., lanes). Both are realized first: the chain is one elementwise kernel reading them (a lazy `ints`
    would put one reduction per block into it)."""
    d, ints = d.contiguous(), ints.contiguous()
    acc = (d[..., 0:1].cast(F64) * ints[..., 0, :].cast(F64)).cast(F32)
    for b in range(1, d.shape[-1]):
        acc = fma32(d[..., b : b + 1], ints[..., b, :], acc)
    return acc


def product(x: Tensor, w: BlockInts) -> Tensor:
    """x (..., K) times the quantised matrix w (N, K) transposed, as llama.cpp computes it: (..., N) float32. x is
    quantised to the activation type first (Q8_0 for Q4_0/Q5_0/Q8_0 weights, Q8_K for the K-quants).

    The lane sums are written to memory before the FMA chain (rows x N x blocks x 8 float32), so a matrix whose
    sums would take more than SLICE_BYTES runs SLICE_BYTES' worth of its rows at a time, each slice realized into
    the result before the next (each slice's first row is a plain int, so each slice compiles its own kernels: a
    bound Variable would have to be an argument of the TinyJit that captures the forward). Every output is the same
    sum in the same order either way. Gemma 3 270M's output head (262,144 rows
    of 20 Q8_0 blocks) took 168 MiB of lane sums for one input row, held by the prefill's and the decode's JITs."""
    from xgrad_llm.numerics import q8_0_quants, q8_k_quants  # (numerics imports this module)

    lead = x.shape[:-1]
    rows = math.prod(lead)
    n, nb, block = w.q.shape
    xq, xd = (q8_0_quants if w.type in _Q0 else q8_k_quants)(x.reshape(rows, -1))
    qx = xq.cast(dtypes.int32).reshape(rows, 1, nb, block)
    xd = xd.reshape(rows, 1, nb)
    step = max(8, SLICE_BYTES // (rows * nb * 8 * 4)) // 8 * 8
    if step >= n:
        return _product(qx, xd, w).reshape(*lead, n)
    qx, xd = qx.contiguous().realize(), xd.contiguous().realize()  # each slice reads them, not x's graph
    out = Tensor.empty(rows, n, device=x.device)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        out.shrink((None, (r0, r1))).assign(_product(qx, xd, w.rows(r0, r1 - r0))).realize()
    return out.reshape(*lead, n)


def _product(qx: Tensor, xd: Tensor, w: BlockInts) -> Tensor:
    """`product` of the quantised activations qx (rows, 1, nb, block) int32 with block scales xd (rows, 1, nb):
    (rows, N)."""
    rows = qx.shape[0]
    n, nb, block = w.q.shape
    d = xd * w.d.reshape(1, n, nb)  # (rows, N, nb): the block scales' product
    if w.type in _Q0:
        ints = _lane_sums(w.q.reshape(1, n, nb, block) * qx)
        return hsum8(_fma_chain(d, ints.cast(F32))).contiguous()
    assert w.sc is not None
    groups = w.sc.shape[-1]
    sc = w.sc.reshape(1, n, nb, groups, 1).expand(1, n, nb, groups, block // groups).reshape(1, n, nb, block)
    if w.type == GGMLType.Q6_K:  # ggml multiplies the unsigned quants (q + 32) and subtracts 32 * sc * x per 32
        scx = sc * qx
        ints = _lane_sums(scx * (w.q.reshape(1, n, nb, block) + 32))
        ints = ints - 32 * scx.reshape(rows, n, nb, 8, 32).sum(-1)
        return hsum8(_fma_chain(d, ints.cast(F32))).contiguous()
    assert w.m is not None and w.dmin is not None  # Q4_K
    ints = _lane_sums(sc * w.q.reshape(1, n, nb, block) * qx)
    out = hsum8(_fma_chain(d, ints.cast(F32)))
    sums = qx.reshape(rows, 1, nb, 8, 32).sum(-1)  # the activations' sums per sub-block of 32
    mins = (w.m.reshape(1, n, nb, 8) * sums).reshape(rows, n, nb, 4, 2).sum(-1)
    dmin = -xd * w.dmin.reshape(1, n, nb)
    acc_m = _fma_chain(dmin, mins.cast(F32))
    r = add32(acc_m[..., :2], acc_m[..., 2:])
    return add32(out, add32(r[..., 0], r[..., 1])).contiguous()


# ---- float16 dot products, softmax ----
def vec_dot_f16(a: Tensor, b: Tensor, lanes: int) -> Tensor:
    """ggml_vec_dot_f16 over the last axis of a and b (float16 values as float32, broadcasting): 4 accumulators of
    `lanes` lanes, then the leftover elements one by one in float64."""
    p = a * b  # exact: two float16s
    k = p.shape[-1]
    main = k - k % (4 * lanes)
    total: Tensor | None = None
    if main:
        chunks = p[..., :main].reshape(*p.shape[:-1], main // (4 * lanes), 4, lanes)
        acc = chunks[..., 0, :, :]
        for j in range(1, chunks.shape[-3]):
            acc = acc + chunks[..., j, :, :]  # exact products: an FMA here would round the same
        a02 = add32(acc[..., 0, :], acc[..., 2, :])
        a13 = add32(acc[..., 1, :], acc[..., 3, :])
        total = reduce_lanes(add32(a02, a13), lanes).cast(F64)
    for i in range(main, k):
        term = p[..., i].cast(F64)
        total = term if total is None else total + term
    assert total is not None
    return total.cast(F32).contiguous()


def tiny_dot_f16(a: Tensor, b: Tensor, lanes: int) -> Tensor:
    """llamafile tinyBLAS's dot over the last axis (a multiple of `lanes`): one accumulator of `lanes` lanes, summed
    as hsum_float_8 (8) or halves (16)."""
    p = a * b
    chunks = p.reshape(*p.shape[:-1], p.shape[-1] // lanes, lanes)
    acc = chunks[..., 0, :]
    for j in range(1, chunks.shape[-2]):
        acc = acc + chunks[..., j, :]
    return (hsum8(acc) if lanes == 8 else reduce_lanes(acc, lanes)).contiguous()


def dot_f16(a: Tensor, b: Tensor, lanes: int, rows: int) -> Tensor:
    """A float16 matrix product's dot over the last axis as llama.cpp picks it: tinyBLAS for 2 or more rows when the
    length is a multiple of `lanes`, else ggml_vec_dot_f16."""
    if rows >= 2 and a.shape[-1] % lanes == 0:
        return tiny_dot_f16(a, b, lanes)
    return vec_dot_f16(a, b, lanes)


def _const(x: Tensor, text: str) -> Tensor:
    """A float32 constant written in C's hexadecimal notation, shaped like x."""
    return x.full_like(float.fromhex(text))


def exp_f32(x: Tensor, lanes: int) -> Tensor:
    """ggml_v_expf of x <= 0 (softmax's x - max), the 256-bit (lanes 8) or 512-bit (16) form, elementwise. Results
    below 2^-126 come out 0 (ggml's are as small: after the softmax's scaling they round to float16 zero, and they do
    not change its sum)."""
    r = _const(x, "0x1.8p23")
    z = fma32(x, _const(x, "0x1.715476p0"), r)
    n = z - r  # an integer: exact
    b = fma32(-n, _const(x, "0x1.7f7d1cp-20"), fma32(-n, _const(x, "0x1.62e4p-1"), x))
    u = b * b
    odd = fma32(_const(x, "0x1.0e4020p-7"), b, _const(x, "0x1.573e2ep-5"))
    poly = fma32(odd, u, fma32(_const(x, "0x1.555e66p-3"), b, _const(x, "0x1.fffdb6p-2")))
    if lanes == 8:  # j = poly * u + c * b; the result fma(j, 2^n, 2^n) = float32(j + 1) * 2^n
        one_plus = add32(fma32(poly, u, _const(x, "0x1.ffffecp-1") * b), x.full_like(1.0))
    else:  # j = poly * u + (c * b + 1); scalef(j, n) = j * 2^n
        one_plus = fma32(poly, u, fma32(_const(x, "0x1.ffffecp-1"), b, x.full_like(1.0)))
    low = n < -126
    e = (low.where(0.0, n) + 127.0).cast(dtypes.int32).cast(dtypes.uint32) << 23
    return low.where(0.0, one_plus * e.bitcast(F32))


def softmax(x: Tensor, lanes: int) -> Tensor:
    """ggml's soft_max_f32 over the last axis (a multiple of `lanes`; masked entries -inf)."""
    y = exp_f32(x - x.max(-1, keepdim=True), lanes).contiguous()  # realized: every later step reads it
    chunks = y.reshape(*y.shape[:-1], y.shape[-1] // lanes, lanes)
    part = hsum8(chunks) if lanes == 8 else reduce_lanes(chunks, lanes)
    total = part.cast(F64).sum(-1, keepdim=True)
    return (y * (1.0 / total).cast(F32)).contiguous()


# ---- norms, RoPE ----
def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """ggml's rms_norm then mul: x * (1 / sqrtf(mean + eps)) * weight, the mean of the squares summed in float64."""
    mean = ((x * x).cast(F64).sum(-1, keepdim=True) / x.shape[-1]).cast(F32)
    return x * (1.0 / (mean + eps).sqrt()) * weight


@functools.cache
def _libm() -> Any:
    name = ctypes.util.find_library("m")
    if name is None:
        return None
    lib = ctypes.CDLL(name)
    for fn, args in (("cosf", 1), ("sinf", 1), ("powf", 2)):
        getattr(lib, fn).restype = ctypes.c_float
        getattr(lib, fn).argtypes = [ctypes.c_float] * args
    return lib


def rope_tables(dims: int, base: float, freq_scale: float, length: int, factors: np.ndarray | None) -> np.ndarray:
    """cos and sin (2, length, dims // 2) float32 as ggml's rope cache: for position p the angle starts at p and is
    multiplied by theta_scale = powf(base, -2 / dims) once per pair, in float32; pair i's angle is divided by its
    frequency factor and multiplied by freq_scale, then the C library's cosf and sinf (numpy's, rounded to float32,
    where there is no C library to call)."""
    libm = _libm()
    f32 = np.float32
    if libm is not None:
        theta_scale = f32(libm.powf(f32(base), f32(-2.0) / f32(dims)))
    else:
        theta_scale = f32(math.pow(f32(base), f32(-2.0) / f32(dims)))
    theta = np.arange(length, dtype=f32)
    angles = np.empty((length, dims // 2), f32)
    for i in range(dims // 2):
        a = theta / f32(factors[i]) if factors is not None else theta
        angles[:, i] = (f32(freq_scale) * a).astype(f32)
        theta = (theta * theta_scale).astype(f32)
    if libm is None:
        return np.stack([np.cos(angles.astype(np.float64)), np.sin(angles.astype(np.float64))]).astype(f32)
    flat = angles.ravel().tolist()
    cos = np.array([libm.cosf(v) for v in flat], f32).reshape(angles.shape)
    sin = np.array([libm.sinf(v) for v in flat], f32).reshape(angles.shape)
    return np.stack([cos, sin])


def rotate(a: Tensor, b: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """ggml's rotation of the pair (a, b): (a * cos - b * sin, a * sin + b * cos), each as fma(a, ., +-b * .)."""
    return fma32(a, cos, -(b * sin)), fma32(a, sin, b * cos)
