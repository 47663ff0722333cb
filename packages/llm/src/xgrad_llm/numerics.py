"""llama.cpp's CPU arithmetic as xgrad tensor ops: float32 activations in, the values llama.cpp computes with out.

A model run with `numerics="llama.cpp-avx2"`, `"llama.cpp-avx512"` or `"llama.cpp"` (this machine's width;
see `model.Transformer`) computes as llama.cpp's CPU backend (ggml-cpu, as built on x86 by `llama-cpp-python`) built
for that vector width does, so that greedy decoding picks the tokens that build picks even at near ties. This module
holds the roundings (activation quantisation, float16, the GELU table); `ggml_x86` the summation orders of the
kernels, which make the results bit-exact where it has the kernel, and the rest keep the roundings only.

The roundings, from ggml's source and checked against its compiled library (`libggml-cpu.so` of
llama-cpp-python 0.3.36, through its type traits and `from_float` functions):

- A matrix product with a quantised weight first quantises the activation row to the weight type's "vec_dot type"
  (`ACTIVATION_TYPES`), then sums integer products block by block and scales each block's integer sum by the two
  block scales. Q8_0 (for Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4 weights) takes blocks of 32: amax = max |x|, the scale is
  float16(amax / 127), each value round(x * (127 / amax)) with halves to even (the AVX path). Q8_1 (Q4_1, Q5_1)
  quantises the same way and also stores s = float16(d * sum of the block's quants) with the float32 d, which the
  weights' offsets multiply; here the offsets multiply float16(d) * that sum instead (not reproduced: a difference
  of float16 rounding in that term only; no file this package is tested with has Q4_1/Q5_1 matrices). Q8_K (the
  K-quants Q2_K..Q6_K and IQ4_XS) takes blocks of 256: s = 127 / amax (in ggml -127 / the signed value of largest
  magnitude; the sign cancels between the quants and the scale), each value round(x * s), halves to even, and the
  block scale 1 / s, a float32. An F16 weight rounds the activation to float16, a BF16 weight to bfloat16.
- `activations(x, type_id)` returns those quantised values dequantised (q * scale): a product with them equals
  llama.cpp's integer block sums up to float32 rounding of the sum (about 1e-7 relative; llama.cpp's own SIMD
  accumulation order differs between its kernels by as much), while the rounding that matters, of each activation
  to 8 bits (about 0.4% of a block's largest value), is reproduced exactly.
- The KV cache holds float16 keys and values; the attention scores are a product of the float16 keys with the
  query rounded to float16, and the softmax weights are rounded to float16 before the product with the values
  (ggml converts the float32 operand of a matrix product with a float16 matrix to float16). `round_f16`.
- GELU reads a table of float16 values indexed by the float16 input: y = f16(gelu(f16(x))) for -10 < x < 10, 0
  below, x above (`gelu_f16`).

Where `ggml_x86` has no kernel (weight types other than Q4_0/Q5_0/Q8_0/Q4_K/Q6_K, SiLU, MoE routing, YaRN), a
product is the quantised activation times the dequantised weight in xgrad's own order: equal to llama.cpp's integer
block sums up to float32 rounding of the sum, which flips an 8-bit quantum or a float16 rounding where a value lies
at a boundary, so greedy ids then agree except at near ties.
"""

from __future__ import annotations

import math

from xgrad import Tensor
from xgrad.dtype import dtypes
from xgrad.errors import ShapeError
from xgrad_llm.quants import QK_K, GGMLType

# the arithmetic a model computes with: xgrad's own float32, or llama.cpp's CPU backend's as built for a vector width
# ("llama.cpp": this machine's, see `host_lanes`)
NUMERICS = ("xgrad", "llama.cpp", "llama.cpp-avx2", "llama.cpp-avx512")
LANES = {"llama.cpp-avx2": 8, "llama.cpp-avx512": 16}  # float32 lanes of the build's vectors


def host_lanes() -> int:
    """The float32 lanes of the vectors llama.cpp built for this machine uses (GGML_NATIVE): 16 where the CPU has
    AVX-512 (Linux's /proc/cpuinfo flag avx512f), else 8 (AVX2; also what other machines get)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return 8
    return 16 if "avx512f" in flags.split() else 8


def lanes_of(numerics: str) -> int:
    """The vector width (float32 lanes) of llama.cpp numerics `numerics`; 0 for "xgrad"."""
    if numerics == "xgrad":
        return 0
    return LANES.get(numerics) or host_lanes()


# the activation format llama.cpp's CPU backend pairs with each weight type (ggml-cpu's `vec_dot_type`)
ACTIVATION_TYPES: dict[GGMLType, GGMLType] = {
    GGMLType.F32: GGMLType.F32,
    GGMLType.F16: GGMLType.F16,
    GGMLType.BF16: GGMLType.BF16,
    GGMLType.Q4_0: GGMLType.Q8_0,
    GGMLType.Q5_0: GGMLType.Q8_0,
    GGMLType.Q8_0: GGMLType.Q8_0,
    GGMLType.IQ4_NL: GGMLType.Q8_0,
    GGMLType.MXFP4: GGMLType.Q8_0,
    GGMLType.Q4_1: GGMLType.Q8_1,
    GGMLType.Q5_1: GGMLType.Q8_1,
    GGMLType.Q2_K: GGMLType.Q8_K,
    GGMLType.Q3_K: GGMLType.Q8_K,
    GGMLType.Q4_K: GGMLType.Q8_K,
    GGMLType.Q5_K: GGMLType.Q8_K,
    GGMLType.Q6_K: GGMLType.Q8_K,
    GGMLType.IQ4_XS: GGMLType.Q8_K,
}


def round_f16(x: Tensor) -> Tensor:
    """x rounded to the nearest float16 (halves to even), as float32."""
    return x.cast(dtypes.float16).cast(dtypes.float32)


def round_bf16(x: Tensor) -> Tensor:
    """x rounded to the nearest bfloat16 (halves to even, as ggml's fp32 -> bf16), as float32."""
    u = x.cast(dtypes.float32).bitcast(dtypes.uint32)
    r = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    nan = u & 0x7FFFFFFF > 0x7F800000  # a NaN stays a (quiet) NaN
    return nan.where(u | 0x00400000, r).bitcast(dtypes.float32)


def _rint(y: Tensor) -> Tensor:
    """y rounded to the nearest integer, halves to even. Compares y with floor(y) + 0.5 instead of subtracting:
    with the CPU compiler's FMA contraction, y - floor(y) of y = a * b would be computed from the exact product, not
    from the rounded y that llama.cpp rounds."""
    f = y.floor()
    mid = f + 0.5
    odd = (f * 0.5).floor() != f * 0.5
    return ((y > mid) | ((y == mid) & odd)).where(f + 1, f)


def _blocks(x: Tensor, size: int) -> Tensor:
    if x.shape[-1] % size:
        raise ShapeError(f"activations of shape {x.shape} do not split into blocks of {size} along the last axis")
    return x.reshape(*x.shape[:-1], x.shape[-1] // size, size)


def q8_0_quants(x: Tensor) -> tuple[Tensor, Tensor]:
    """llama.cpp's Q8_0 (and Q8_1) quantisation of x (..., K) in blocks of 32 along K: the quants round(x * 127 /
    amax), (..., K / 32, 32) as float32 integers, and the block scales float16(amax / 127), (..., K / 32, 1)."""
    b = _blocks(x.cast(dtypes.float32), 32)
    amax = b.abs().max(-1, keepdim=True)
    inv = (amax != 0).where(127.0 / amax, 0.0)
    return _rint(b * inv), round_f16(amax / 127.0)


def q8_k_quants(x: Tensor) -> tuple[Tensor, Tensor]:
    """llama.cpp's Q8_K quantisation of x (..., K) in blocks of 256: the quants round(x * s) with s = 127 / amax,
    (..., K / 256, 256), and the block scales, the float32 1 / s, (..., K / 256, 1)."""
    b = _blocks(x.cast(dtypes.float32), QK_K)
    amax = b.abs().max(-1, keepdim=True)
    s = (amax != 0).where(127.0 / amax, 0.0)
    return _rint(b * s), (s != 0).where(1.0 / s, 0.0)


def q8_0_values(x: Tensor) -> Tensor:
    """The values of x (..., K) after llama.cpp's Q8_0 (and Q8_1) activation quantisation, blocks of 32 along K:
    round(x * 127 / amax) * float16(amax / 127)."""
    q, scale = q8_0_quants(x)
    return (q * scale).reshape(x.shape)


def q8_k_values(x: Tensor) -> Tensor:
    """The values of x (..., K) after llama.cpp's Q8_K activation quantisation, blocks of 256 along K:
    round(x * s) / s with s = 127 / amax (the block scale is the float32 1 / s)."""
    q, scale = q8_k_quants(x)
    return (q * scale).reshape(x.shape)


def activations(x: Tensor, weight_type: int) -> Tensor:
    """x (..., K) as llama.cpp's CPU backend feeds it to a matrix product with a weight of GGML type `weight_type`:
    quantised to that type's activation format and dequantised (float32), or rounded, or (F32 weights) as is.

    >>> activations(Tensor([[0.3] * 31 + [1.0]]), GGMLType.Q8_0)[0, :2].tolist()  # 0.3 * 127 = 38.1 -> 38 / 127
    [0.29931640625, 0.29931640625]
    """
    kind = ACTIVATION_TYPES.get(GGMLType(weight_type), GGMLType.F32)
    if kind in (GGMLType.Q8_0, GGMLType.Q8_1):
        return q8_0_values(x)
    if kind == GGMLType.Q8_K:
        return q8_k_values(x)
    if kind == GGMLType.F16:
        return round_f16(x)
    if kind == GGMLType.BF16:
        return round_bf16(x)
    return x


def gelu_f16(x: Tensor) -> Tensor:
    """llama.cpp's GELU (tanh form) of x: looked up by the float16 value of x in a table of float16 results, so
    float16(gelu(float16(x))) for -10 < x < 10; 0 at or below -10, x at or above 10."""
    h = round_f16(x)
    c = math.sqrt(2.0 / math.pi)
    g = round_f16(0.5 * h * (1.0 + (c * h * (1.0 + 0.044715 * h * h)).tanh()))
    return (x <= -10.0).where(0.0, (x >= 10.0).where(x, g))
