"""Tensor cores tiled through shared memory: a block of warps computes a large output tile, its operands staged per
k-slice in shared memory (the GPU analogue of PACK).

IR in: a kernel AST as `optimize` takes it, a matmul as `tc.match_matmul` finds it. IR out, for a `TileShape`:
- the output ranges m and n become block ranges (GLOBAL later) over tiles of BM x BN outputs, where BM = warps_m x
  frags_m x the instruction's m and BN = warps_n x frags_n x its n; one LOCAL range of warps_m x warps_n x `threads`
  threads (warp w = thread // threads computes the tile's (w // warps_n, w % warps_n) warp tile);
- k becomes one REDUCE range over k-slices of BK = frags_k x the instruction's k; in each slice every thread copies
  its share of the A slice (BM x BK) and the B slice (BK x BN) from global memory (consecutive threads read
  consecutive chunks along the operand's contiguous axis: coalesced; a chunk is one aligned vector of up to the
  renderer's `aligned_vector_bytes` where `_chunk` proves the alignment) into two DEFINE_LOCAL arrays (A rows and B
  rows padded by SMEM_PAD elements so that a warp's fragment reads fall into different banks). With one buffer
  (stages 1) between two BARRIERs: one after the slice's global loads (every thread is done reading the previous
  slice's shared tiles) and one after its shared stores (the slice is complete before anyone reads it). Double-
  buffered (stages 2), slice 0 is copied before the loop and iteration ko has one BARRIER, reads buffer ko % 2 and
  copies slice ko+1 into the other buffer, so those global loads are in flight while the WMMAs run;
- each warp then reads its frags_m A fragments and frags_n B fragments per k-fragment from shared memory, in the
  instruction's register layout (`TensorCore.place`), and keeps frags_m x frags_n accumulators: REDUCE(ADD, a chain
  of WMMA(A, B, 0) over the slice's k-fragments, the k-slices) each, which the linearizer turns into WMMAs that
  accumulate into their register (`linearize.lower_reduce`);
- a matmul whose m, n or k is not a multiple of the tile is padded: loads past the end read 0 (gated), stores past
  the end are skipped, and epilogue loads (a bias added to the output) are gated the same way.

Each element of A and B is read from global memory once per block (instead of once per warp and k-block, see
`tc.py`), and each fragment once per warp tile row/column: the global reads per WMMA fall by about
frags_m x frags_n x warps / (frags_m + frags_n) (see the backend-nv README for the SASS counts).

A TileShape is written as one number in Opt("TC", tc_index, code): the decimal digits warps_m warps_n frags_m
frags_n frags_k and, double-buffered, a sixth digit 2 (244422: 2 x 4 warps, 4 x 4 fragments each, 2 k-fragments per
slice, two buffers); code 0 is the untiled `tc.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from xgrad.dtype import dtypes
from xgrad.uop.ops import AxisType, Ops, UOp
from xgrad.uop.pattern import substitute
from xgrad.uop.symbolic import simplify
from xgrad_codegen.opt import OptError, kernel_ranges, range_size
from xgrad_codegen.pack import index_step
from xgrad_codegen.renderer import TensorCore
from xgrad_codegen.tc import lane_place, match_matmul

SMEM_PAD = 8  # elements added to each shared row (16 bytes of halves): rows 0..7 of a fragment hit different banks
MAX_WASTE = 1.25  # the heuristic's tile may pad the output by at most this factor (padded area / real area)
MIN_BLOCKS = 64  # ... and prefers the largest tile that still gives this many blocks (an H100 has 132 SMs)


@dataclass(frozen=True)
class TileShape:
    """A block's warps (warps_m x warps_n), each warp's accumulator fragments (frags_m x frags_n), the k-fragments
    per shared k-slice (frags_k) and the slices' buffers (stages). Written as the digits of `code` (each 1..9)."""

    warps_m: int
    warps_n: int
    frags_m: int
    frags_n: int
    frags_k: int
    stages: int = 1  # 2: double-buffered slices (the next one's copies overlap this one's WMMAs)

    @property
    def code(self) -> int:
        """The shape as the amount of Opt("TC", index, amount): its five digits, and a sixth (2) when
        double-buffered."""
        out = 0
        for d in (self.warps_m, self.warps_n, self.frags_m, self.frags_n, self.frags_k):
            out = out * 10 + d
        return out if self.stages == 1 else out * 10 + self.stages

    @staticmethod
    def from_code(code: int) -> TileShape:
        """The shape `code` writes (see `code`); OptError for anything but five digits 1..9 and an optional sixth
        of 1 or 2."""
        digits = [int(c) for c in str(code) if c.isdigit()]
        if code < 0 or len(digits) not in (5, 6) or 0 in digits or (len(digits) == 6 and digits[5] > 2):
            raise OptError(
                f"TC amount {code} is not a tile shape: write five digits 1-9 (warps m, warps n, fragments m, "
                "fragments n, k-fragments per slice) and optionally a sixth, 2 for double-buffered slices, e.g. "
                "244422, or 0 for the untiled tensor core"
            )
        return TileShape(*digits)

    def block(self, tc: TensorCore) -> tuple[int, int, int]:
        """(BM, BN, BK): the output tile of one block and the k-slice staged in shared memory."""
        tm, tn, tk = tc.dims
        return self.warps_m * self.frags_m * tm, self.warps_n * self.frags_n * tn, self.frags_k * tk

    def threads(self, tc: TensorCore) -> int:
        """Threads in one block."""
        return self.warps_m * self.warps_n * tc.threads

    def fits(self, tc: TensorCore, max_threads: int, shared_max: int) -> bool:
        """Within a renderer's threads per block and shared memory."""
        return self.threads(tc) <= max_threads and self.shared_bytes(tc) <= shared_max

    def shared_bytes(self, tc: TensorCore) -> int:
        """Bytes of the staged slices (two of each when double-buffered)."""
        bm, bn, bk = self.block(tc)
        return self.stages * (bm * (bk + SMEM_PAD) + bk * (bn + SMEM_PAD)) * tc.dtype.itemsize


# the block shapes, largest tile first (the heuristic takes the first that fits)
BLOCK_SHAPES: tuple[TileShape, ...] = (
    TileShape(2, 4, 4, 4, 2),  # 8 warps, each 64 x 32 of m16n8 (sm_80+): 128 x 128 x 32 per block
    TileShape(2, 2, 4, 8, 2),  # 4 warps, each 64 x 64: 128 x 128 x 32
    TileShape(2, 2, 4, 4, 2),  # 4 warps, each 64 x 32: 128 x 64 x 32
    TileShape(2, 2, 2, 4, 2),  # 4 warps, each 32 x 32: 64 x 64 x 32
    TileShape(2, 2, 2, 2, 2),  # 4 warps, each 32 x 16: 64 x 32 x 32
    TileShape(2, 2, 1, 2, 1),  # 4 warps, each 16 x 16: 32 x 32 x 16
    TileShape(1, 1, 1, 1, 1),  # one warp, one fragment: the instruction's shape
)
# what BEAM tries and the heuristic picks from: each block shape double-buffered (preferred where it fits), then not
TILE_SHAPES: tuple[TileShape, ...] = tuple(
    TileShape(s.warps_m, s.warps_n, s.frags_m, s.frags_n, s.frags_k, stages) for s in BLOCK_SHAPES for stages in (2, 1)
)


def _ceil_to(x: int, m: int) -> int:
    return -(-x // m) * m


def _with_gate(u: UOp, cond: UOp | None) -> UOp:
    """LOAD or STORE `u` gated by `cond` too (None: unchanged)."""
    if cond is None:
        return u
    idx = u.src[0]
    gate = cond if len(idx.src) == 2 else idx.src[2].logical_and(cond)
    return u.replace(src=(idx.replace(src=(idx.src[0], idx.src[1], gate)), *u.src[1:]))


def _and(*conds: UOp | None) -> UOp | None:
    out = None
    for c in conds:
        if c is not None:
            out = c if out is None else out.logical_and(c)
    return out


def _below(x: UOp, size: int, padded: int) -> UOp | None:
    """`x < size`, or None when the range is not padded."""
    return None if padded == size else x.lt(size)


def _chunk(load: UOp, cols: tuple[UOp, UOp | int, int, int], stride: int, copies: int, widths: tuple[int, ...]) -> int:
    """Elements per copy of `load`'s slice: the first of `widths` (elements of an aligned vector) such that the
    operand's columns are contiguous in memory, every other step of its index and its offset are multiples of the
    width (each chunk starts aligned: a 16-byte load), a padded column count is one too (a chunk's gate is one
    condition), the shared rows (`stride`) keep chunks aligned and the threads share the `copies` chunks evenly; else
    1 (scalar copies)."""
    idx = load.src[0]
    c_rng, _, c_tile, c_size = cols
    if len(idx.src) > 2 or index_step(idx.src[1], c_rng) != 1:  # gated by a view (a pad), or columns not contiguous
        return 1
    rngs = [u for u in idx.src[1].toposort if u.op is Ops.RANGE]
    steps = [index_step(idx.src[1], r) for r in rngs if r is not c_rng]
    offset = simplify(substitute(idx.src[1], {r: UOp.const(dtypes.index, 0) for r in rngs}))
    if offset.op is not Ops.CONST or any(x is None for x in steps):
        return 1
    for w in widths:
        aligned = all(x % w == 0 for x in steps if x is not None) and int(offset.arg) % w == 0
        if aligned and c_tile % w == 0 and stride % w == 0 and c_size % w == 0 and copies % w == 0:
            return w
    return 1


def _stage(
    load: UOp,
    rows: tuple[UOp, UOp | int, int, int],
    cols: tuple[UOp, UOp | int, int, int],
    smem: UOp,
    stride: int,
    base: UOp | int,
    tid: UOp,
    threads: int,
    widths: tuple[int, ...],
) -> tuple[list[UOp], list[UOp]]:
    """The loads and shared stores that copy one slice of `load`'s operand: rows (range, block start, tile rows,
    real size) x cols (the same for the columns) into `smem` from element `base` on (row-major, `stride` elements per
    row). Consecutive
    threads take consecutive chunks along the operand's contiguous axis (the columns unless the rows are): vectors of
    up to `widths[0]` elements where `_chunk` proves them aligned."""
    (r_rng, r_start, r_tile, r_size), (c_rng, c_start, c_tile, c_size) = rows, cols
    idx = load.src[0].src[1]
    along_rows = index_step(idx, r_rng) == 1 and index_step(idx, c_rng) != 1
    width = 1 if along_rows else _chunk(load, cols, stride, r_tile * c_tile // threads, widths)
    per_row = c_tile // width
    loads, stores = [], []
    for copy in range(r_tile * c_tile // (threads * width)):
        q = tid + copy * threads
        r, c = (q % r_tile, q // r_tile) if along_rows else (q // per_row, (q % per_row) * width)
        r_ok = _below(r_start + r, r_size, _ceil_to(r_size, r_tile))
        gate = _and(r_ok, _below(c_start + c, c_size, _ceil_to(c_size, c_tile)))
        value = _with_gate(substitute(load, {r_rng: r_start + r, c_rng: c_start + c}), gate)
        at = smem.index(base + r * stride + c)
        if width > 1:  # one aligned vector load and store (the chunk's gate is the same for all its elements)
            vidx = value.src[0]
            value = UOp(Ops.LOAD, value.dtype.vec(width), (vidx.replace(dtype=vidx.dtype.vec(width)),))
            at = at.replace(dtype=at.dtype.vec(width))
        loads.append(value)
        stores.append(at.store(value))
    return loads, stores


def apply_tiled_tensor_core(ast: UOp, tc: TensorCore, shape: TileShape, shared_max: int, vector_bytes: int = 0) -> UOp:
    """`ast` with its matmul done by blocks of `shape` on `tc`, staged through shared memory (see the module
    docstring); OptError when the kernel is not such a matmul or the slices exceed `shared_max` bytes. With
    `vector_bytes` (the renderer's `aligned_vector_bytes`) the copies are vectors of up to that many bytes where
    their alignment is proven."""
    red, first, second, m, n, k = match_matmul(ast, tc)
    if (need := shape.shared_bytes(tc)) > shared_max:
        raise OptError(f"TC tile {shape.code} stages {need} bytes in shared memory; the renderer has {shared_max}")
    tm, tn, tk = tc.dims
    bm, bn, bk = shape.block(tc)
    threads = shape.threads(tc)
    if (bm * bk) % threads or (bk * bn) % threads:
        raise OptError(f"TC tile {shape.code}: its {threads} threads do not share the {bm}x{bk} and {bk}x{bn} slices")
    size_m, size_n, size_k = (int(range_size(r) or 0) for r in (m, n, k))
    pad_m, pad_n, pad_k = _ceil_to(size_m, bm), _ceil_to(size_n, bn), _ceil_to(size_k, bk)
    next_id = max(r.arg[0] for r in kernel_ranges(ast)) + 1
    blk_m = UOp.range(pad_m // bm, m.arg[0], AxisType.LOOP)
    blk_n = UOp.range(pad_n // bn, n.arg[0], AxisType.LOOP)
    ko = UOp.range(pad_k // bk, k.arg[0], AxisType.REDUCE)
    tid = UOp.range(threads, next_id, AxisType.LOCAL)
    warp, lane = tid // tc.threads, tid % tc.threads
    warp_m, warp_n = warp // shape.warps_n, warp % shape.warps_n
    row0, col0 = blk_m * bm, blk_n * bn

    # stages 2 (double-buffered slices): slice 0 is staged before the loop; iteration ko starts with a barrier (slice
    # ko is written, slice ko-1 no longer read), reads its fragments from buffer ko % 2 and meanwhile copies slice
    # ko+1 into the other buffer (its global loads are in flight while the WMMAs run)
    stride_a, stride_b = bk + SMEM_PAD, bn + SMEM_PAD
    size_a, size_b = bm * stride_a, bk * stride_b
    smem_a = UOp(Ops.DEFINE_LOCAL, tc.dtype, (), (0, shape.stages * size_a))
    smem_b = UOp(Ops.DEFINE_LOCAL, tc.dtype, (), (1, shape.stages * size_b))
    most = vector_bytes // tc.dtype.itemsize
    widths = tuple(w for w in (8, 4, 2) if w <= most)
    steps = pad_k // bk

    def stage(k0: UOp | int, buf: UOp | int) -> tuple[list[UOp], list[UOp]]:
        ca, sa = _stage(
            first, (m, row0, bm, size_m), (k, k0, bk, size_k), smem_a, stride_a, buf * size_a, tid, threads, widths
        )
        cb, sb = _stage(
            second, (k, k0, bk, size_k), (n, col0, bn, size_n), smem_b, stride_b, buf * size_b, tid, threads, widths
        )
        return ca + cb, sa + sb

    next_stores: list[UOp] = []
    if shape.stages == 2 and steps > 1:
        _, first_stores = stage(0, 0)
        next_loads, next_stores = stage(((ko + 1) % steps) * bk, (ko + 1) % 2)
        ready = UOp(Ops.BARRIER, dtypes.void, (*first_stores, *next_loads))
        cur_a, cur_b = (ko % 2) * size_a, (ko % 2) * size_b
    else:  # one buffer: global loads, a barrier (the previous slice is no longer read), shared stores, a barrier
        loads, stores = stage(ko * bk, 0)
        read_done = UOp(Ops.BARRIER, dtypes.void, tuple(loads))
        ordered = {s: UOp(Ops.NOOP, s.dtype, (s, read_done)) for s in (smem_a, smem_b)}
        ready = UOp(Ops.BARRIER, dtypes.void, tuple(substitute(st, ordered) for st in stores))
        cur_a = cur_b = UOp.const(dtypes.index, 0)
    tile_a, tile_b = (UOp(Ops.NOOP, s.dtype, (s, ready)) for s in (smem_a, smem_b))

    def fragment(operand: str, tile: UOp, base: UOp, stride: int, row: UOp | int, col: UOp | int) -> UOp:
        loads = []
        for e in range(tc.elements(operand)):
            r, c = lane_place(tc, operand, lane, e)
            loads.append(tile.index(base + (row + r) * stride + col + c).load())
        return UOp(Ops.VECTORIZE, tc.dtype.vec(len(loads)), tuple(loads))

    frags_a = [
        [
            fragment("a", tile_a, cur_a, stride_a, warp_m * (shape.frags_m * tm) + i * tm, f * tk)
            for f in range(shape.frags_k)
        ]
        for i in range(shape.frags_m)
    ]
    frags_b = [
        [
            fragment("b", tile_b, cur_b, stride_b, f * tk, warp_n * (shape.frags_n * tn) + j * tn)
            for f in range(shape.frags_k)
        ]
        for j in range(shape.frags_n)
    ]
    if next_stores:  # the next slice's stores hang on the last WMMA's operand (only for order: NOOP is dropped)
        last = frags_a[-1][-1]
        frags_a[-1][-1] = UOp(Ops.NOOP, last.dtype, (last, *next_stores))
    acc = tc.acc.vec(tc.elements("c"))
    zero = UOp.const(acc, 0.0)
    out: list[UOp] = []
    for i in range(shape.frags_m):
        for j in range(shape.frags_n):
            chain = UOp(Ops.WMMA, acc, (frags_a[i][0], frags_b[j][0], zero), tc)
            for f in range(1, shape.frags_k):
                chain = chain + UOp(Ops.WMMA, acc, (frags_a[i][f], frags_b[j][f], zero), tc)
            total = UOp(Ops.REDUCE, acc, (chain, ko), Ops.ADD)
            for e in range(tc.elements("c")):
                r, c = lane_place(tc, "c", lane, e)
                row = row0 + warp_m * (shape.frags_m * tm) + i * tm + r
                col = col0 + warp_n * (shape.frags_n * tn) + j * tn + c
                valid = _and(_below(row, size_m, pad_m), _below(col, size_n, pad_n))
                for st in ast.src:
                    out.append(_store_lane(st, red, UOp(Ops.GEP, tc.acc, (total,), e), {m: row, n: col}, valid))
    return ast.replace(src=tuple(out))


def _store_lane(st: UOp, red: UOp, value: UOp, at: dict[UOp, UOp], valid: UOp | None) -> UOp:
    """Output STORE `st` for one accumulator element: the sum replaced by `value`, m and n by the element's place;
    when padded, the store and the epilogue's global loads (a bias) are gated by `valid`."""
    new = substitute(st, {red: value, **at})
    if valid is None:
        return new
    staged = value.toposort  # the sum's own (shared) loads
    epilogue = [u for u in new.src[1].toposort if u.op is Ops.LOAD and u not in staged]
    new = substitute(new, {ld: _with_gate(ld, valid) for ld in epilogue})
    return _with_gate(new, valid)


def pick_tile(ast: UOp, tc: TensorCore, max_threads: int, shared_max: int) -> TileShape | None:
    """The heuristic's shape for a matmul on `tc`: the first of TILE_SHAPES that fits the renderer (`fits`), pads m,
    n and k by at most MAX_WASTE (padded volume / real volume) and leaves at least MIN_BLOCKS blocks, else the
    smallest such shape. None when the kernel is not such a matmul or every shape pads it too much."""
    try:
        _, _, _, m, n, k = match_matmul(ast, tc)
    except OptError:
        return None
    size_m, size_n, size_k = (int(range_size(r) or 0) for r in (m, n, k))
    batch = 1
    for r in kernel_ranges(ast):
        if r.arg[1] is AxisType.LOOP and r not in (m, n):
            batch *= int(range_size(r) or 1)
    fitting = []
    for shape in TILE_SHAPES:
        bm, bn, bk = shape.block(tc)
        if not shape.fits(tc, max_threads, shared_max):
            continue
        waste = _ceil_to(size_m, bm) * _ceil_to(size_n, bn) * _ceil_to(size_k, bk) / (size_m * size_n * size_k)
        if waste > MAX_WASTE:
            continue
        fitting.append(shape)
        if batch * (_ceil_to(size_m, bm) // bm) * (_ceil_to(size_n, bn) // bn) >= MIN_BLOCKS:
            return shape
    return fitting[-1] if fitting else None
