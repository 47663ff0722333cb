"""Quantised weight matrices in a layout built for the matrix-vector products of decoding.

A decode step multiplies one activation vector by every weight matrix of the model, so its speed is how fast the
weights stream from memory. GGUF's blocks are laid out along each matrix row, which a kernel that computes many
output rows at once (one per vector lane) reads as scattered bytes. `PackedMatrix` stores a quantised (N, K)
matrix the way such a kernel wants it:

- the quants (the small integers `q` of `quants.Affine`) of `LANES` consecutive rows are interleaved, so that for
  each k one vector load reads the quants of those rows: panels of shape (N / LANES, K, LANES), each panel one
  contiguous run of memory that the kernel streams through once;
- 4-bit quants (Q4_0, Q4_1, Q4_K, Q3_K, Q2_K) pack two rows' quants into a byte (panels of 2 * LANES rows: low
  nibbles hold the first LANES rows, high nibbles the next), so those weights take half a byte each, as in the
  file; every other type is stored as int8 (Q5/Q6/Q8 and the non-linear IQ4/MXFP4 levels);
- the per-group scales (and offsets, for types that have them) are panels of shape (N / width, K / group, width),
  float16 where the file's scales are float16 values, else float32.

`t()` rebuilds W.T (K, N) from these as lazy xgrad ops, so `x @ m.t()` compiles to one kernel that reads the packed
bytes, dequantises in registers and accumulates: no float copy of the weights exists in memory. Packing runs on the
device with xgrad ops too, once at load.
"""

from __future__ import annotations

from xgrad import Tensor
from xgrad.dtype import DType, dtypes
from xgrad.errors import DTypeError, ShapeError
from xgrad_llm.quants import AFFINE, BLOCK_SIZES, GGMLType, type_name

LANES = 16  # rows whose quants one vector load reads: a 512-bit register of float32 (two 256-bit ones on AVX2)


def can_pack(type_id: int) -> bool:
    """Whether `PackedMatrix` takes a matrix of GGML type `type_id` (the block-quantised types)."""
    return type_id in AFFINE


class PackedMatrix:
    """A quantised (N, K) matrix from its GGUF bytes `raw` (a 1-d uint8 tensor, on the device to compute on).

    >>> import numpy as np
    >>> blocks = np.zeros((2, 34), np.uint8); blocks[:, 1] = 0x3C; blocks[:, 2:] = np.arange(32)  # Q8_0: d = 1.0
    >>> m = PackedMatrix(Tensor(blocks.reshape(-1)), GGMLType.Q8_0, (2, 32))
    >>> (Tensor.ones(1, 32) @ m.t()).tolist()
    [[496.0, 496.0]]
    """

    def __init__(self, raw: Tensor, type_id: int, shape: tuple[int, int]) -> None:
        make = AFFINE.get(GGMLType(type_id)) if type_id in GGMLType._value2member_map_ else None
        if make is None:
            packable = ", ".join(t.name for t in AFFINE)
            raise DTypeError(f"a {type_name(type_id)} matrix cannot be packed (packable: {packable}); dequantize it")
        block, type_size = BLOCK_SIZES[GGMLType(type_id)]
        n, k = shape
        if k % block or raw.shape != (n * k // block * type_size,):
            raise ShapeError(f"{type_name(type_id)} bytes of shape {raw.shape} do not hold a {shape} matrix")
        aff = make(raw.reshape(-1, type_size))
        self.type, self.shape, self.lo, self.bits = GGMLType(type_id), shape, aff.lo, aff.bits
        self.group = block // aff.scale.shape[1]  # elements per scale
        self.width = 2 * LANES if aff.bits == 4 else LANES  # rows per panel
        rows = -(-n // self.width) * self.width  # padded with zero rows to whole panels
        panels = rows // self.width

        def panel(x: Tensor, dtype: DType) -> Tensor:  # (n, c) -> (panels, c, width)
            x = x.reshape(n, -1).pad(((0, rows - n), None)).reshape(panels, self.width, -1).permute(0, 2, 1)
            return x.cast(dtype)

        q = aff.q.reshape(n, k)
        if aff.bits == 4:  # nibbles: low = rows [0, LANES) of the panel, high = rows [LANES, 2 * LANES)
            u = panel(q - aff.lo, dtypes.uint8).reshape(panels, k, 2, LANES)
            self.q = (u[:, :, 0] | (u[:, :, 1] << 4)).contiguous().realize()
        else:
            self.q = panel(q, dtypes.int8).contiguous().realize()
        scale_dtype = dtypes.float16 if aff.scale_is_f16 else dtypes.float32
        self.scale = panel(aff.scale, scale_dtype).contiguous().realize()
        self.offset = None if aff.offset is None else panel(aff.offset, dtypes.float32).contiguous().realize()

    @property
    def nbytes(self) -> int:
        """Bytes the packed matrix holds in memory."""
        parts = (self.q, self.scale) if self.offset is None else (self.q, self.scale, self.offset)
        return sum(p.numel() * p.dtype.itemsize for p in parts)

    def t(self) -> Tensor:
        """W.T, (K, N) float32, as lazy ops over the packed bytes (dequantised inside the kernel that uses it)."""
        n, k = self.shape
        panels, width, groups = self.q.shape[0], self.width, k // self.group
        if self.bits == 4:
            shifts = (Tensor.arange(2, dtype=dtypes.uint8, device=self.q.device) * 4).reshape(1, 1, 2, 1)  # index math
            q = (self.q.reshape(panels, k, 1, LANES).rshift(shifts) & 15).cast(dtypes.float32) + self.lo
        else:
            q = self.q.cast(dtypes.float32)
        w = q.reshape(panels, groups, self.group, width) * self.scale.cast(dtypes.float32).reshape(
            panels, groups, 1, width
        )
        if self.offset is not None:
            w = w + self.offset.reshape(panels, groups, 1, width)
        w = w.reshape(panels, k, width).permute(1, 0, 2).reshape(k, panels * width)
        return w if panels * width == n else w.shrink((None, (0, n)))
