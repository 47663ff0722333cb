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

`product(x)` is x @ W.T for a few rows (decoding, a batch of streams), computed group by group: each scale group's
products x * q are summed first and its scale (and offset, times the group's sum of x) applied once to that sum,
y[r, n] = sum_g scale[g, n] * sum_{k in g} x[r, k] * q[k, n] (+ offset[g, n] * sum_{k in g} x[r, k]). It compiles to
one kernel of two nested reductions, whose inner loop per weight is one conversion of the quant shared by all rows
and one FMA per row; dequantising as `t()` does costs a scale conversion and a multiply per weight as well, which
made a 4-row product of the output head cost 1.8x a 1-row one (one thread; 1.4x group by group: the llm README's
serving numbers). The result differs from `x @ t()` only by float32 rounding order.
"""

from __future__ import annotations

from xgrad import Tensor, Variable
from xgrad.dtype import DType, dtypes
from xgrad.errors import DTypeError, ShapeError
from xgrad_llm.quants import AFFINE, BLOCK_SIZES, GGMLType, type_name

LANES = 16  # rows whose quants one vector load reads: a 512-bit register of float32 (two 256-bit ones on AVX2)
CHUNK_BYTES = 8 << 20  # GGUF bytes packed at a time


def can_pack(type_id: int) -> bool:
    """Whether `PackedMatrix` takes a matrix of GGML type `type_id` (the block-quantised types)."""
    return type_id in AFFINE


class PackedMatrix:
    """A quantised (N, K) matrix from its GGUF bytes `raw` (a 1-d uint8 tensor: a slice of the file on DISK, or on a
    device), packed on `device` (default: raw's), `chunk` bytes of `raw` at a time.

    >>> import numpy as np
    >>> blocks = np.zeros((2, 34), np.uint8); blocks[:, 1] = 0x3C; blocks[:, 2:] = np.arange(32)  # Q8_0: d = 1.0
    >>> m = PackedMatrix(Tensor(blocks.reshape(-1)), GGMLType.Q8_0, (2, 32))
    >>> (Tensor.ones(1, 32) @ m.t()).tolist()
    [[496.0, 496.0]]
    """

    def __init__(
        self, raw: Tensor, type_id: int, shape: tuple[int, int], device: str | None = None, chunk: int = CHUNK_BYTES
    ) -> None:
        make = AFFINE.get(GGMLType(type_id)) if type_id in GGMLType._value2member_map_ else None
        if make is None:
            packable = ", ".join(t.name for t in AFFINE)
            raise DTypeError(f"a {type_name(type_id)} matrix cannot be packed (packable: {packable}); dequantize it")
        block, type_size = BLOCK_SIZES[GGMLType(type_id)]
        n, k = shape
        if k % block or raw.shape != (n * k // block * type_size,):
            raise ShapeError(f"{type_name(type_id)} bytes of shape {raw.shape} do not hold a {shape} matrix")
        device = device or raw.device
        self.make, self.type_size = make, type_size
        probe = make(raw[:type_size].to(device).reshape(1, type_size))  # the type's form (tiny, never computed)
        self.type, self.shape, self.lo, self.bits = GGMLType(type_id), shape, probe.lo, probe.bits
        self.group = block // probe.scale.shape[1]  # elements per scale
        self.width = 2 * LANES if probe.bits == 4 else LANES  # rows per panel
        panels = -(-n // self.width)  # the last one padded with zero rows
        lanes = LANES if probe.bits == 4 else self.width
        self.q = Tensor.empty(panels, k, lanes, dtype=dtypes.uint8 if probe.bits == 4 else dtypes.int8, device=device)
        scale_dtype = dtypes.float16 if probe.scale_is_f16 else dtypes.float32
        self.scale = Tensor.empty(panels, k // self.group, self.width, dtype=scale_dtype, device=device)
        self.offset = None
        if probe.offset is not None:
            self.offset = Tensor.empty(panels, k // self.group, self.width, dtype=dtypes.float32, device=device)
        # packed a run of rows at a time, each run's bytes copied from `raw` (a file's, on DISK) by themselves: a big
        # matrix (an embedding) never has a second whole copy in memory
        row_bytes = k // block * type_size
        step = max(1, chunk // (row_bytes * self.width)) * self.width
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            part = raw[r0 * row_bytes : r1 * row_bytes].to(device).contiguous().realize()
            self._pack(part, r0 // self.width, r1 - r0)

    def _pack(self, part: Tensor, first: int, n: int) -> None:
        """Pack rows whose bytes are `part` into panels from `first` on."""
        aff = self.make(part.reshape(-1, self.type_size))
        k, width = self.shape[1], self.width
        panels = -(-n // width)

        def panel(x: Tensor, dtype: DType) -> Tensor:  # (n, c) -> (panels, c, width)
            x = x.reshape(n, -1).pad(((0, panels * width - n), None)).reshape(panels, width, -1).permute(0, 2, 1)
            return x.cast(dtype)

        last = self.q.shape[0] - panels  # the first panel of the last run this long could start at
        at = Variable("panel", 0, last).bind(first) if last > 0 else first  # one kernel for every run this long

        def write(dest: Tensor, value: Tensor) -> Tensor:
            return dest.shrink(((at, at + panels), *((None,) * (dest.ndim - 1)))).assign(value)

        q = aff.q.reshape(n, k)
        if self.bits == 4:  # nibbles: low = rows [0, LANES) of the panel, high = rows [LANES, 2 * LANES)
            u = panel(q - self.lo, dtypes.uint8).reshape(panels, k, 2, LANES)
            writes = [write(self.q, u[:, :, 0] | (u[:, :, 1] << 4))]
        else:
            writes = [write(self.q, panel(q, dtypes.int8))]
        writes.append(write(self.scale, panel(aff.scale, self.scale.dtype)))
        if self.offset is not None and aff.offset is not None:
            writes.append(write(self.offset, panel(aff.offset, dtypes.float32)))
        Tensor.realize(*writes)  # the assigns themselves: realizing the destinations would not run them

    @property
    def nbytes(self) -> int:
        """Bytes the packed matrix holds in memory."""
        parts = (self.q, self.scale) if self.offset is None else (self.q, self.scale, self.offset)
        return sum(p.numel() * p.dtype.itemsize for p in parts)

    def _quants(self) -> Tensor:
        """The quants as float32, (panels, K, width): q of `quants.Affine` (a weight is q * scale + offset)."""
        panels, k = self.q.shape[0], self.shape[1]
        if self.bits == 4:
            shifts = (Tensor.arange(2, dtype=dtypes.uint8, device=self.q.device) * 4).reshape(1, 1, 2, 1)  # index math
            q = (self.q.reshape(panels, k, 1, LANES).rshift(shifts) & 15).cast(dtypes.float32) + self.lo
            return q.reshape(panels, k, self.width)
        return self.q.cast(dtypes.float32)

    def _columns(self, x: Tensor) -> Tensor:
        """A (panels, rows, width) panel tensor as (rows, N): its columns in the matrix's row order."""
        panels, rows, width = x.shape
        return x.permute(1, 0, 2).reshape(rows, panels * width)

    def product(self, x: Tensor) -> Tensor:
        """x @ W.T, (..., K) -> (..., N) float32, summed scale group by scale group (see the module doc): the
        product for a few rows (a decode step, a batch of streams)."""
        n, k = self.shape
        if x.shape[-1] != k:
            raise ShapeError(
                f"x of shape {x.shape} cannot multiply W.T of a {self.shape} matrix: make its last axis {k}"
            )
        lead = x.shape[:-1]
        groups, group = k // self.group, self.group
        rows = x.reshape(-1, groups, group)  # (R, G, group)
        q = self._columns(self._quants()).reshape(groups, group, -1)  # (G, group, N')
        inner = (rows.unsqueeze(-1) * q.unsqueeze(0)).sum(2)  # (R, G, N'): each group's products summed
        scale = self._columns(self.scale.cast(dtypes.float32))  # (G, N')
        y = inner * scale.unsqueeze(0)
        if self.offset is not None:
            y = y + rows.sum(-1).unsqueeze(-1) * self._columns(self.offset).unsqueeze(0)
        y = y.sum(1)
        if y.shape[-1] != n:
            y = y.shrink((None, (0, n)))
        return y.reshape(*lead, n)

    def t(self) -> Tensor:
        """W.T, (K, N) float32, as lazy ops over the packed bytes (dequantised inside the kernel that uses it)."""
        n, k = self.shape
        panels, width, groups = self.q.shape[0], self.width, k // self.group
        q = self._quants()
        w = q.reshape(panels, groups, self.group, width) * self.scale.cast(dtypes.float32).reshape(
            panels, groups, 1, width
        )
        if self.offset is not None:
            w = w + self.offset.reshape(panels, groups, 1, width)
        w = w.reshape(panels, k, width).permute(1, 0, 2).reshape(k, panels * width)
        return w if panels * width == n else w.shrink((None, (0, n)))
