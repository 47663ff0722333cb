"""GGML tensor types and their dequantisers: GGUF bytes in, float32 tensors out.

A quantised GGML tensor is a run of fixed-size blocks along its innermost axis; each block packs `block_size`
elements into `type_size` bytes (scales, minimums, packed integers). `dequantize(raw, type_id, shape)` takes the
tensor's bytes as a 1-d uint8 `Tensor` (a lazy slice of the file, see `gguf.py`) and returns a lazy float32 tensor of
`shape`. Each dequantiser is plain Tensor ops (casts, shifts, masks, reshapes, multiplies), so it fuses into whatever
consumes it (a matmul reads the packed blocks, not a float copy of the weights).

Bit-exactness with the reference (the `gguf` package's numpy dequantisers): the products of a scale (a float16, or a
float16 times a small integer sub-scale) and a quant (a small integer) have at most 24 significant bits, so they are
exact in float32; the single add or subtract of a minimum then rounds once, whether or not the compiler fuses it into
an FMA. Byte layouts follow ggml's `block_*` structs; every multi-byte field is little-endian.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

from xgrad import Tensor
from xgrad.dtype import dtypes
from xgrad.errors import DTypeError, ShapeError
from xgrad.helpers import prod

QK_K = 256  # elements in a super-block of the K-quants and IQ4_XS


class GGMLType(IntEnum):
    """The GGML tensor type ids used in GGUF tensor infos."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39


# (elements per block, bytes per block) of every type a GGUF file may hold, dequantisable or not: the reader needs
# them to know each tensor's byte size.
BLOCK_SIZES: dict[GGMLType, tuple[int, int]] = {
    GGMLType.F32: (1, 4),
    GGMLType.F16: (1, 2),
    GGMLType.Q4_0: (32, 2 + 16),
    GGMLType.Q4_1: (32, 2 + 2 + 16),
    GGMLType.Q5_0: (32, 2 + 4 + 16),
    GGMLType.Q5_1: (32, 2 + 2 + 4 + 16),
    GGMLType.Q8_0: (32, 2 + 32),
    GGMLType.Q8_1: (32, 4 + 4 + 32),
    GGMLType.Q2_K: (QK_K, QK_K // 16 + QK_K // 4 + 2 + 2),
    GGMLType.Q3_K: (QK_K, QK_K // 8 + QK_K // 4 + 12 + 2),
    GGMLType.Q4_K: (QK_K, 2 + 2 + 12 + QK_K // 2),
    GGMLType.Q5_K: (QK_K, 2 + 2 + 12 + QK_K // 8 + QK_K // 2),
    GGMLType.Q6_K: (QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2),
    GGMLType.Q8_K: (QK_K, 4 + QK_K + QK_K // 8),
    GGMLType.IQ2_XXS: (QK_K, 2 + QK_K // 4),
    GGMLType.IQ2_XS: (QK_K, 2 + QK_K // 4 + QK_K // 32),
    GGMLType.IQ3_XXS: (QK_K, 2 + QK_K // 4 + QK_K // 8),
    GGMLType.IQ1_S: (QK_K, 2 + QK_K // 8 + QK_K // 16),
    GGMLType.IQ4_NL: (32, 2 + 16),
    GGMLType.IQ3_S: (QK_K, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4),
    GGMLType.IQ2_S: (QK_K, 2 + QK_K // 4 + QK_K // 16),
    GGMLType.IQ4_XS: (QK_K, 2 + 2 + QK_K // 64 + QK_K // 2),
    GGMLType.I8: (1, 1),
    GGMLType.I16: (1, 2),
    GGMLType.I32: (1, 4),
    GGMLType.I64: (1, 8),
    GGMLType.F64: (1, 8),
    GGMLType.IQ1_M: (QK_K, QK_K // 8 + QK_K // 16 + QK_K // 32),
    GGMLType.BF16: (1, 2),
    GGMLType.TQ1_0: (QK_K, 2 + 4 * 13),
    GGMLType.TQ2_0: (QK_K, 2 + 64),
    GGMLType.MXFP4: (32, 1 + 16),
}

# the 16 signed levels of the non-linear 4-bit types (IQ4_NL, IQ4_XS)
IQ4_LEVELS = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
# the FP4 (e2m1) values of MXFP4, doubled so they are integers; the block scale is halved to match
MXFP4_LEVELS = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


# ---- reading fields out of a (n_blocks, type_size) uint8 tensor ----
def _ints(blocks: Tensor, start: int, stop: int) -> Tensor:
    """Bytes [start, stop) of every block as int32, shape (n, stop-start)."""
    return blocks[:, start:stop].cast(dtypes.int32)


def _u16(pairs: Tensor) -> Tensor:
    """Little-endian uint16 words from a (..., 2k) byte tensor, shape (..., k)."""
    b = pairs.reshape(*pairs.shape[:-1], pairs.shape[-1] // 2, 2).cast(dtypes.uint16)
    return b[..., 0] | (b[..., 1] << 8)


def _f16(blocks: Tensor, at: int) -> Tensor:
    """The float16 at byte `at` of every block, as float32 of shape (n, 1)."""
    return _u16(blocks[:, at : at + 2]).bitcast(dtypes.float16).cast(dtypes.float32)


def _fields(x: Tensor, width: int, count: int) -> Tensor:
    """Split each int of x (n, ..., k) into `count` fields of `width` bits, lowest first: shape (n, ..., count, k)."""
    shifts = (Tensor.arange(count, dtype=dtypes.int32, device=x.device) * width).reshape(count, 1)
    return x.unsqueeze(-2).rshift(shifts) & ((1 << width) - 1)


def _lookup(idx: Tensor, levels: tuple[int, ...]) -> Tensor:
    """levels[idx] for an int tensor of indices in [0, len(levels)), as a chain of selects (fuses; no gather)."""
    out = idx.full_like(levels[0])
    for i, level in enumerate(levels[1:], start=1):
        out = (idx == i).where(level, out)
    return out


# ---- the affine form: w = scale * q (+ offset), one scale per group of consecutive elements ----
@dataclass(frozen=True)
class Affine:
    """A quantised type's blocks as small integers and per-group float scales: w = scale * q (+ offset).

    `q` is (n_blocks, block_size) int32 with values in [lo, lo + 2**bits); `scale` and `offset` are (n_blocks,
    groups) float32 (offset may be None), each group `block_size // groups` consecutive elements. `scale_is_f16`: the
    scales are float16 values (so storing them as float16 loses nothing). `packed.py` stores q in 4 or 8 bits in a
    layout built for matrix-vector products; `dense()` is the float32 dequantisation."""

    q: Tensor
    scale: Tensor
    offset: Tensor | None
    lo: int
    bits: int
    scale_is_f16: bool = False

    def dense(self) -> Tensor:
        """The float32 values, (n_blocks, block_size): one product per element (exact: see the module docstring),
        then one rounding add of the offset."""
        n, groups = self.scale.shape
        w = self.scale.reshape(n, groups, 1) * self.q.reshape(n, groups, -1).cast(dtypes.float32)
        if self.offset is not None:
            w = w + self.offset.reshape(n, groups, 1)
        return w.reshape(n, -1)


def affine_q4_0(b: Tensor) -> Affine:
    return Affine(_fields(_ints(b, 2, 18), 4, 2).reshape(-1, 32) - 8, _f16(b, 0), None, -8, 4, True)


def affine_q4_1(b: Tensor) -> Affine:
    return Affine(_fields(_ints(b, 4, 20), 4, 2).reshape(-1, 32), _f16(b, 0), _f16(b, 2), 0, 4, True)


def _q5(b: Tensor, qh_at: int) -> Tensor:
    """The 32 unsigned 5-bit quants of a Q5_0/Q5_1 block: 4 bytes of high bits at `qh_at`, then 16 bytes of nibbles."""
    low = _fields(_ints(b, qh_at + 4, qh_at + 20), 4, 2).reshape(-1, 32)
    high = _fields(_ints(b, qh_at, qh_at + 4), 1, 8).transpose(1, 2).reshape(-1, 32)  # bit i of the uint32
    return low | (high << 4)


def affine_q5_0(b: Tensor) -> Affine:
    return Affine(_q5(b, 2) - 16, _f16(b, 0), None, -16, 8, True)


def affine_q5_1(b: Tensor) -> Affine:
    return Affine(_q5(b, 4), _f16(b, 0), _f16(b, 2), 0, 8, True)


def affine_q8_0(b: Tensor) -> Affine:
    return Affine(b[:, 2:34].bitcast(dtypes.int8).cast(dtypes.int32), _f16(b, 0), None, -128, 8, True)


def affine_q2_k(b: Tensor) -> Affine:
    # scales[16] (low nibble: scale, high nibble: min of each 16 elements), qs[64] (2-bit quants), d, dmin
    sc = _ints(b, 0, 16)
    scale = _f16(b, 80) * (sc & 15).cast(dtypes.float32)
    minimum = _f16(b, 82) * (sc >> 4).cast(dtypes.float32)
    q = _fields(_ints(b, 16, 80).reshape(-1, 2, 32), 2, 4).reshape(-1, QK_K)
    return Affine(q, scale, -minimum, 0, 4)


def affine_q3_k(b: Tensor) -> Affine:
    # hmask[32] (bit 2 of each quant, inverted), qs[64] (bits 0-1), scales[12] (16 packed 6-bit scales), d
    lo = _fields(_ints(b, 96, 104), 4, 2).reshape(-1, 16)
    hi = _fields(_ints(b, 104, 108), 2, 4).reshape(-1, 16)
    scale = _f16(b, 108) * ((lo | (hi << 4)) - 32).cast(dtypes.float32)
    low = _fields(_ints(b, 32, 96).reshape(-1, 2, 32), 2, 4).reshape(-1, QK_K)
    high = _fields(_ints(b, 0, 32), 1, 8).reshape(-1, QK_K)
    return Affine(low - ((high ^ 1) << 2), scale, None, -4, 4)


def _k_scales(b: Tensor, d_at: int) -> tuple[Tensor, Tensor]:
    """The 8 scales and 8 minimums of a Q4_K/Q5_K block (d, dmin at `d_at`, then 12 bytes of packed 6-bit values),
    already multiplied by d and dmin: two float32 tensors of shape (n, 8)."""
    packed = _ints(b, d_at + 4, d_at + 16)
    sc_lo, m_lo, both = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    sc = (sc_lo & 63).cat((both & 15) | ((sc_lo >> 2) & 48), dim=1)
    m = (m_lo & 63).cat((both >> 4) | ((m_lo >> 2) & 48), dim=1)
    return _f16(b, d_at) * sc.cast(dtypes.float32), _f16(b, d_at + 2) * m.cast(dtypes.float32)


def affine_q4_k(b: Tensor) -> Affine:
    scale, minimum = _k_scales(b, 0)
    q = _fields(_ints(b, 16, 144).reshape(-1, 4, 32), 4, 2).reshape(-1, QK_K)
    return Affine(q, scale, -minimum, 0, 4)


def affine_q5_k(b: Tensor) -> Affine:
    scale, minimum = _k_scales(b, 0)
    low = _fields(_ints(b, 48, 176).reshape(-1, 4, 32), 4, 2).reshape(-1, QK_K)
    high = _fields(_ints(b, 16, 48), 1, 8).reshape(-1, QK_K)
    return Affine(low | (high << 4), scale, -minimum, 0, 8)


def affine_q6_k(b: Tensor) -> Affine:
    # ql[128] (bits 0-3), qh[64] (bits 4-5), scales[16] (int8, one per 16 elements), d
    low = _fields(_ints(b, 0, 128).reshape(-1, 2, 64), 4, 2).reshape(-1, QK_K)
    high = _fields(_ints(b, 128, 192).reshape(-1, 2, 32), 2, 4).reshape(-1, QK_K)
    scale = _f16(b, 208) * b[:, 192:208].bitcast(dtypes.int8).cast(dtypes.float32)
    return Affine((low | (high << 4)) - 32, scale, None, -32, 8)


def affine_iq4_nl(b: Tensor) -> Affine:
    q = _fields(_ints(b, 2, 18), 4, 2).reshape(-1, 32)
    return Affine(_lookup(q, IQ4_LEVELS), _f16(b, 0), None, -128, 8, True)


def affine_iq4_xs(b: Tensor) -> Affine:
    # d, scales_h (uint16: 2 high bits of each of 8 scales), scales_l[4] (4 low bits each), qs[128]
    lo = _fields(_ints(b, 4, 8), 4, 2).transpose(1, 2).reshape(-1, 8)
    hi = _fields(_u16(b[:, 2:4]).cast(dtypes.int32), 2, 8).reshape(-1, 8)
    scale = _f16(b, 0) * ((lo | (hi << 4)) - 32).cast(dtypes.float32)
    q = _fields(_ints(b, 8, 136).reshape(-1, 8, 16), 4, 2).reshape(-1, QK_K)
    return Affine(_lookup(q, IQ4_LEVELS), scale, None, -128, 8)


def affine_mxfp4(b: Tensor) -> Affine:
    # e (an E8M0 exponent; as float32 bits, halved to match the doubled levels), qs[16] (FP4 codes)
    e = b[:, 0:1].cast(dtypes.uint32)
    subnormal = e.full_like(0x00200000).lshift(e & 1)  # for e in {0, 1}: 2^-128, 2^-127 (& 1 keeps the shift legal)
    bits = (e < 2).where(subnormal, (e - 1) << 23)
    q = _fields(_ints(b, 1, 17), 4, 2).reshape(-1, 32)
    return Affine(_lookup(q, MXFP4_LEVELS), bits.bitcast(dtypes.float32), None, -128, 8)


# ---- one dequantiser per type: (n_blocks, type_size) uint8 -> (n_blocks, block_size) float32 ----
def dequant_f32(b: Tensor) -> Tensor:
    w = b.cast(dtypes.uint32)
    return (w[:, 0:1] | (w[:, 1:2] << 8) | (w[:, 2:3] << 16) | (w[:, 3:4] << 24)).bitcast(dtypes.float32)


def dequant_f16(b: Tensor) -> Tensor:
    return _f16(b, 0)


def dequant_bf16(b: Tensor) -> Tensor:
    return (_u16(b).cast(dtypes.uint32) << 16).bitcast(dtypes.float32)


AFFINE: dict[GGMLType, Callable[[Tensor], Affine]] = {
    GGMLType.Q4_0: affine_q4_0,
    GGMLType.Q4_1: affine_q4_1,
    GGMLType.Q5_0: affine_q5_0,
    GGMLType.Q5_1: affine_q5_1,
    GGMLType.Q8_0: affine_q8_0,
    GGMLType.Q2_K: affine_q2_k,
    GGMLType.Q3_K: affine_q3_k,
    GGMLType.Q4_K: affine_q4_k,
    GGMLType.Q5_K: affine_q5_k,
    GGMLType.Q6_K: affine_q6_k,
    GGMLType.IQ4_NL: affine_iq4_nl,
    GGMLType.IQ4_XS: affine_iq4_xs,
    GGMLType.MXFP4: affine_mxfp4,
}


@dataclass(frozen=True)
class Dequantiser:
    """How to turn one GGML type's blocks into float32: `fn` maps (n_blocks, type_size) uint8 to (n_blocks,
    block_size) float32."""

    type: GGMLType
    block_size: int
    type_size: int
    fn: Callable[[Tensor], Tensor]


def _dense(affine: Callable[[Tensor], Affine]) -> Callable[[Tensor], Tensor]:
    return lambda b: affine(b).dense()


def _entry(t: GGMLType, fn: Callable[[Tensor], Tensor]) -> tuple[int, Dequantiser]:
    return int(t), Dequantiser(t, *BLOCK_SIZES[t], fn)


DEQUANTISERS: dict[int, Dequantiser] = dict(
    [
        _entry(GGMLType.F32, dequant_f32),
        _entry(GGMLType.F16, dequant_f16),
        _entry(GGMLType.BF16, dequant_bf16),
        *(_entry(t, _dense(fn)) for t, fn in AFFINE.items()),
    ]
)


def type_name(type_id: int) -> str:
    """The GGML name of a type id ('Q4_K'), or 'type <id>' for an id GGML does not define."""
    return GGMLType(type_id).name if type_id in GGMLType._value2member_map_ else f"type {type_id}"


def tensor_nbytes(type_id: int, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor of `shape` (row-major: the last axis holds the blocks) stored as GGML type `type_id`."""
    block_size, type_size = BLOCK_SIZES[GGMLType(type_id)]
    n = int(prod(shape))
    if (shape[-1] if shape else 1) % block_size:
        raise ShapeError(f"a {type_name(type_id)} tensor's last axis must be a multiple of {block_size}, got {shape}")
    return n // block_size * type_size


def dequantize(raw: Tensor, type_id: int, shape: tuple[int, ...]) -> Tensor:
    """The float32 values of a GGML tensor of `shape` (row-major) stored as type `type_id` in the 1-d uint8 tensor
    `raw`. Lazy: nothing is computed until the result is used. Runs on `raw`'s device; move `raw` first
    (`raw.to("CPU")`) to dequantise elsewhere.

    >>> import numpy as np
    >>> from xgrad import Tensor
    >>> raw = Tensor(np.frombuffer(np.float16([1.5, -2.0]).tobytes(), np.uint8).copy())
    >>> dequantize(raw, GGMLType.F16, (2,)).tolist()
    [1.5, -2.0]
    """
    d = DEQUANTISERS.get(type_id)
    if d is None:
        raise DTypeError(
            f"xgrad_llm cannot dequantise GGML {type_name(type_id)} yet; supported: "
            f"{', '.join(x.type.name for x in DEQUANTISERS.values())}"
        )
    nbytes = tensor_nbytes(type_id, shape)
    if raw.dtype != dtypes.uint8 or raw.shape != (nbytes,):
        raise ShapeError(
            f"a {shape} {d.type.name} tensor needs {nbytes} uint8 bytes, got shape {raw.shape} {raw.dtype.name}"
        )
    if nbytes == 0:
        return Tensor.zeros(*shape, dtype=dtypes.float32, device=raw.device)
    return d.fn(raw.reshape(nbytes // d.type_size, d.type_size)).reshape(shape)
