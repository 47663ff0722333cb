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
- on a renderer with asynchronous copies (`async_copy_bytes`: cp.async on sm_80+) a shape of 2 to 4 stages is a
  pipeline: each chunk is one STORE of the global INDEX itself (global -> shared, no registers; a gate off zero-
  fills), slices 0..stages-2 are issued before the loop, each committed as its own group by a BARRIER whose
  `AsyncWait` waits for nothing, and iteration ko opens with one BARRIER(AsyncWait(stages - 2)): it commits the
  previous iteration's copies and waits until slice ko has landed, while slices ko+1..ko+stages-2 stay in flight;
  then it issues slice ko+stages-1 (gated off past the end) into buffer (ko+stages-1) % stages, which held slice
  ko-1, and reads buffer ko % stages. Chunks must be 4+ bytes (cp.async's smallest): where an operand's rows are
  not aligned, 2 stages copy through registers as above and 3 or 4 are refused (OptError);
- each warp then reads its frags_m A fragments and frags_n B fragments per k-fragment from shared memory, in the
  instruction's register layout (`TensorCore.place`): element by element, or where the renderer has `matrix_loads`
  and the layout is ldmatrix's (mma.m16n8k16) by warp-wide LOADs with a `MatrixLoad` arg, one x4 per A fragment and
  one x4 .trans per two B fragments (B's slice is stored k-major; an odd last one x2), and keeps frags_m x frags_n
  accumulators: REDUCE(ADD, a chain of WMMA(A, B, 0) over the slice's k-fragments, the k-slices) each, which the
  linearizer turns into WMMAs that accumulate into their register (`linearize.lower_reduce`);
- a matmul whose m, n or k is not a multiple of the tile is padded: loads past the end read 0 (gated), stores past
  the end are skipped, and epilogue loads (a bias added to the output) are gated the same way.

Each element of A and B is read from global memory once per block (instead of once per warp and k-block, see
`tc.py`), and each fragment once per warp tile row/column: the global reads per WMMA fall by about
frags_m x frags_n x warps / (frags_m + frags_n) (see the backend-nv README for the SASS counts).

A TileShape is written as one number in Opt("TC", tc_index, code): the decimal digits warps_m warps_n frags_m
frags_n frags_k and, with several k-slices staged at once, a sixth digit: the stages, 2 to 4 (244422: 2 x 4 warps,
4 x 4 fragments each, 2 k-fragments per slice, two buffers; 224423: 2 x 2 warps, three stages of cp.async copies);
code 0 is the untiled `tc.py`. 3 and 4 stages exist only with asynchronous copies (`TileShape.fits`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from xgrad.dtype import dtypes
from xgrad.uop.ops import AxisType, Ops, UOp
from xgrad.uop.pattern import substitute
from xgrad.uop.symbolic import simplify
from xgrad_codegen.opt import OptError, kernel_ranges, range_size
from xgrad_codegen.pack import index_step
from xgrad_codegen.renderer import AsyncWait, MatrixLoad, TensorCore
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
    stages: int = 1  # 2..4: slices in flight (the next ones' copies overlap this one's WMMAs)

    @property
    def code(self) -> int:
        """The shape as the amount of Opt("TC", index, amount): its five digits, and a sixth (the stages) when there
        are several."""
        out = 0
        for d in (self.warps_m, self.warps_n, self.frags_m, self.frags_n, self.frags_k):
            out = out * 10 + d
        return out if self.stages == 1 else out * 10 + self.stages

    @staticmethod
    def from_code(code: int) -> TileShape:
        """The shape `code` writes (see `code`); OptError for anything but five digits 1..9 and an optional sixth
        of 1 to 4."""
        digits = [int(c) for c in str(code) if c.isdigit()]
        if code < 0 or len(digits) not in (5, 6) or 0 in digits or (len(digits) == 6 and digits[5] > 4):
            raise OptError(
                f"TC amount {code} is not a tile shape: write five digits 1-9 (warps m, warps n, fragments m, "
                "fragments n, k-fragments per slice) and optionally a sixth, the k-slices staged at once (2 double-"
                "buffers them, 3 and 4 need asynchronous copies), e.g. 244422, or 0 for the untiled tensor core"
            )
        return TileShape(*digits)

    def block(self, tc: TensorCore) -> tuple[int, int, int]:
        """(BM, BN, BK): the output tile of one block and the k-slice staged in shared memory."""
        tm, tn, tk = tc.dims
        return self.warps_m * self.frags_m * tm, self.warps_n * self.frags_n * tn, self.frags_k * tk

    def threads(self, tc: TensorCore) -> int:
        """Threads in one block."""
        return self.warps_m * self.warps_n * tc.threads

    def fits(self, tc: TensorCore, max_threads: int, shared_max: int, async_bytes: int = 0) -> bool:
        """Within a renderer's threads per block and shared memory; 3 or 4 stages only with its asynchronous copies
        (`async_bytes`: its `async_copy_bytes`)."""
        deep_ok = self.stages <= 2 or async_bytes > 0
        return self.threads(tc) <= max_threads and self.shared_bytes(tc) <= shared_max and deep_ok

    def shared_bytes(self, tc: TensorCore) -> int:
        """Bytes of the staged slices (`stages` of each)."""
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
# what BEAM tries and the heuristic picks from: each block shape double-buffered (preferred where it fits), then not,
# then 3 and 4 stages (asynchronous copies only; never the heuristic's pick: 3 stages fit 48 KiB only where 2 do)
TILE_SHAPES: tuple[TileShape, ...] = tuple(
    TileShape(s.warps_m, s.warps_n, s.frags_m, s.frags_n, s.frags_k, stages)
    for s in BLOCK_SHAPES
    for stages in (2, 1, 3, 4)
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


def _copy_width(
    load: UOp,
    rows: tuple[UOp, UOp | int, int, int],
    cols: tuple[UOp, UOp | int, int, int],
    stride: int,
    threads: int,
    widths: tuple[int, ...],
) -> int:
    """Elements per copy of `load`'s slice (see `_stage`): 1 when the rows are the contiguous axis, else `_chunk`'s."""
    (r_rng, _, r_tile, _), (c_rng, _, c_tile, _) = rows, cols
    idx = load.src[0].src[1]
    if index_step(idx, r_rng) == 1 and index_step(idx, c_rng) != 1:
        return 1
    return _chunk(load, cols, stride, r_tile * c_tile // threads, widths)


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
    copy: Copy,
) -> tuple[list[UOp], list[UOp]]:
    """The loads and shared stores that copy one slice of `load`'s operand: rows (range, block start, tile rows,
    real size) x cols (the same for the columns) into `smem` from element `base` on (row-major, `stride` elements per
    row). Consecutive threads take consecutive chunks along the operand's contiguous axis (the columns unless the rows
    are): vectors of up to `widths[0]` elements where `_chunk` proves them aligned. `copy.asynchronous`: no loads,
    each store's value is the global INDEX itself (an asynchronous copy, see `Renderer.async_copy_bytes`); its gate
    also holds `copy.gate`."""
    (r_rng, r_start, r_tile, r_size), (c_rng, c_start, c_tile, c_size) = rows, cols
    idx = load.src[0].src[1]
    along_rows = index_step(idx, r_rng) == 1 and index_step(idx, c_rng) != 1
    width = _copy_width(load, rows, cols, stride, threads, widths)
    per_row = c_tile // width
    loads, stores = [], []
    for n in range(r_tile * c_tile // (threads * width)):
        q = tid + n * threads
        r, c = (q % r_tile, q // r_tile) if along_rows else (q // per_row, (q % per_row) * width)
        r_ok = _below(r_start + r, r_size, _ceil_to(r_size, r_tile))
        gate = _and(r_ok, _below(c_start + c, c_size, _ceil_to(c_size, c_tile)), copy.gate)
        value = _with_gate(substitute(load, {r_rng: r_start + r, c_rng: c_start + c}), gate)
        at = smem.index(base + r * stride + c)
        if width > 1:  # one aligned vector load and store (the chunk's gate is the same for all its elements)
            vidx = value.src[0]
            value = UOp(Ops.LOAD, value.dtype.vec(width), (vidx.replace(dtype=vidx.dtype.vec(width)),))
            at = at.replace(dtype=at.dtype.vec(width))
        if copy.asynchronous:
            stores.append(at.store(value.src[0]))
        else:
            loads.append(value)
            stores.append(at.store(value))
    return loads, stores


@dataclass(frozen=True)
class Copy:
    """How `_stage` copies a slice: asynchronously (cp.async) or through registers, and a gate for every copy."""

    asynchronous: bool = False
    gate: UOp | None = None


def apply_tiled_tensor_core(
    ast: UOp,
    tc: TensorCore,
    shape: TileShape,
    shared_max: int,
    vector_bytes: int = 0,
    async_bytes: int = 0,
    matrix_loads: bool = False,
) -> UOp:
    """`ast` with its matmul done by blocks of `shape` on `tc`, staged through shared memory (see the module
    docstring); OptError when the kernel is not such a matmul or the slices exceed `shared_max` bytes. With
    `vector_bytes` (the renderer's `aligned_vector_bytes`) the copies are vectors of up to that many bytes where
    their alignment is proven; with `async_bytes` (its `async_copy_bytes`) the slices of a multi-stage shape are
    copied asynchronously, in chunks of 4 to that many bytes (OptError for 3 or 4 stages where they cannot be); with
    `matrix_loads` (its `matrix_loads`) fragments in ldmatrix's layout are read by warp-wide matrix loads."""
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

    stride_a, stride_b = bk + SMEM_PAD, bn + SMEM_PAD
    size_a, size_b = bm * stride_a, bk * stride_b
    smem_a = UOp(Ops.DEFINE_LOCAL, tc.dtype, (), (0, shape.stages * size_a))
    smem_b = UOp(Ops.DEFINE_LOCAL, tc.dtype, (), (1, shape.stages * size_b))
    item = tc.dtype.itemsize
    most = vector_bytes // item
    widths = tuple(w for w in (8, 4, 2) if w <= most)
    async_widths = tuple(w for w in (16, 8, 4) if w <= async_bytes and w >= item and w % item == 0)
    async_widths = tuple(w // item for w in async_widths)
    steps = pad_k // bk
    rows_a, cols_b = (m, row0, bm, size_m), (n, col0, bn, size_n)

    def stage(k0: UOp | int, buf: UOp | int, copy: Copy, at_a: UOp, at_b: UOp) -> tuple[list[UOp], list[UOp]]:
        ws = async_widths if copy.asynchronous else widths
        ca, sa = _stage(first, rows_a, (k, k0, bk, size_k), at_a, stride_a, buf * size_a, tid, threads, ws, copy)
        cb, sb = _stage(second, (k, k0, bk, size_k), cols_b, at_b, stride_b, buf * size_b, tid, threads, ws, copy)
        return ca + cb, sa + sb

    # a slice copies asynchronously when both operands' chunks are whole copies of cp.async (4+ bytes)
    chunks = [
        _copy_width(first, rows_a, (k, 0, bk, size_k), stride_a, threads, async_widths) * item,
        _copy_width(second, (k, 0, bk, size_k), cols_b, stride_b, threads, async_widths) * item,
    ]
    pipelined = shape.stages >= 2 and bool(async_widths) and min(chunks) >= 4
    if shape.stages > 2 and not pipelined:
        raise OptError(
            f"TC tile {shape.code}: {shape.stages} stages need asynchronous copies of 4+ bytes (a renderer with "
            f"async_copy_bytes and aligned operand rows); this one copies {min(chunks)}-byte chunks at most"
        )
    next_stores: list[UOp] = []
    if pipelined:
        ready, next_stores, cur_a, cur_b = _pipeline(shape.stages, steps, ko, bk, (smem_a, smem_b), stage)
        cur_a, cur_b = cur_a * size_a, cur_b * size_b
    elif shape.stages == 2 and steps > 1:
        # double-buffered through registers: slice 0 is staged before the loop; iteration ko starts with a barrier
        # (slice ko is written, slice ko-1 no longer read), reads its fragments from buffer ko % 2 and meanwhile
        # copies slice ko+1 into the other buffer (its global loads are in flight while the WMMAs run)
        _, first_stores = stage(0, 0, Copy(), smem_a, smem_b)
        next_loads, next_stores = stage(((ko + 1) % steps) * bk, (ko + 1) % 2, Copy(), smem_a, smem_b)
        ready = UOp(Ops.BARRIER, dtypes.void, (*first_stores, *next_loads))
        cur_a, cur_b = (ko % 2) * size_a, (ko % 2) * size_b
    else:  # one buffer: global loads, a barrier (the previous slice is no longer read), shared stores, a barrier
        loads, stores = stage(ko * bk, 0, Copy(), smem_a, smem_b)
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

    def matrices(tile: UOp, base: UOp, stride: int, row: UOp | int, col: UOp | int, count: int, trans: bool) -> UOp:
        """`count` 8 x 8 matrices (of the 16 x 16 block from row, col: rows 8 (i % 2), columns 8 (i // 2) of matrix
        i) by one warp-wide LOAD: lane l names row l % 8 of matrix (l // 8) % count."""
        r = lane % 16 if count > 1 else lane % 8
        c = (lane // 16) * 8 if count > 2 else 0
        at = tile.index(base + (row + r) * stride + col + c)
        at = at.replace(dtype=at.dtype.vec(2 * count))
        return UOp(Ops.LOAD, tc.dtype.vec(2 * count), (at,), MatrixLoad(count, trans))

    def lanes(x: UOp, first: int, n: int) -> UOp:
        return UOp(
            Ops.VECTORIZE, tc.dtype.vec(n), tuple(UOp(Ops.GEP, tc.dtype, (x,), i) for i in range(first, first + n))
        )

    by_matrices = matrix_loads and _matrix_layout(tc)
    a_rows = [warp_m * (shape.frags_m * tm) + i * tm for i in range(shape.frags_m)]
    b_cols = [warp_n * (shape.frags_n * tn) + j * tn for j in range(shape.frags_n)]
    if by_matrices:  # A: one x4 load per fragment; B (k x n rows): one x4 .trans per two fragments, x2 for an odd one
        frags_a = [
            [matrices(tile_a, cur_a, stride_a, r, f * tk, 4, False) for f in range(shape.frags_k)] for r in a_rows
        ]
        frags_b: list[list[UOp]] = [[] for _ in b_cols]
        for f in range(shape.frags_k):
            for j in range(0, shape.frags_n, 2):
                if j + 1 < shape.frags_n:
                    pair = matrices(tile_b, cur_b, stride_b, f * tk, b_cols[j], 4, True)
                    frags_b[j].append(lanes(pair, 0, 4))
                    frags_b[j + 1].append(lanes(pair, 4, 4))
                else:
                    frags_b[j].append(matrices(tile_b, cur_b, stride_b, f * tk, b_cols[j], 2, True))
    else:
        frags_a = [[fragment("a", tile_a, cur_a, stride_a, r, f * tk) for f in range(shape.frags_k)] for r in a_rows]
        frags_b = [[fragment("b", tile_b, cur_b, stride_b, f * tk, c) for f in range(shape.frags_k)] for c in b_cols]
    if next_stores and pipelined:  # the copies in flight hang on the first WMMA's operand (issued early; NOOP: order)
        frags_a[0][0] = UOp(Ops.NOOP, frags_a[0][0].dtype, (frags_a[0][0], *next_stores))
    elif next_stores:  # the next slice's stores hang on the last WMMA's operand (only for order: NOOP is dropped)
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


def _matrix_place(lane: int, e: int, trans: bool) -> tuple[int, int]:
    """(row, column) in a 16 x 16 block of element `e` that `lane` receives from a warp-wide load of four 8 x 8
    matrices (`MatrixLoad`; matrix i at rows 8 (i % 2), columns 8 (i // 2))."""
    i, j = e // 2, e % 2
    r, c = (2 * (lane % 4) + j, lane // 4) if trans else (lane // 4, 2 * (lane % 4) + j)
    return 8 * (i % 2) + r, 8 * (i // 2) + c


def _matrix_layout(tc: TensorCore) -> bool:
    """Whether `tc`'s A fragment is what an x4 matrix load of its 16 x 16 block gives each lane, and two B fragments
    side by side what an x4 .trans load of their 16 x 16 (k x n) block gives (the layout of mma.m16n8k16)."""
    if tc.dims != (16, 8, 16) or tc.dtype.itemsize != 2 or tc.threads != 32:
        return False
    if tc.elements("a") != 8 or tc.elements("b") != 4:
        return False
    a_ok = all(tc.place("a", lane, e) == _matrix_place(lane, e, False) for lane in range(32) for e in range(8))
    b_ok = all(tc.place("b", lane, e) == _matrix_place(lane, e, True) for lane in range(32) for e in range(4))
    return a_ok and b_ok


Stager = Callable[[UOp | int, UOp | int, Copy, UOp, UOp], tuple[list[UOp], list[UOp]]]


def _pipeline(
    stages: int, steps: int, ko: UOp, bk: int, smem: tuple[UOp, UOp], stage: Stager
) -> tuple[UOp, list[UOp], UOp, UOp]:
    """The asynchronous copies of a `stages`-deep pipeline over `steps` k-slices: slices 0..stages-2 are issued before
    the loop, each committed as its own group (the barriers between them wait for nothing); iteration ko starts with
    a barrier that commits the previous iteration's copies and waits until slice ko has landed (at most stages-2 newer
    groups pending: slices ko+1..ko+stages-2 stay in flight), then issues slice ko+stages-1 into buffer
    (ko+stages-1) % stages, which held slice ko-1 (read by every thread before that barrier). Copies of slices past
    the end are gated off (they fill their buffer with zeros, read by nobody). Returns the barrier, the loop's copies,
    and the buffer the fragments read (index of slice ko's buffer)."""
    smem_a, smem_b = smem
    at_a, at_b = smem_a, smem_b
    before: list[UOp] = []  # the prologue's last barrier: every barrier comes after the one before it
    for s in range(stages - 1):
        _, copies = stage(s * bk, s, Copy(True), at_a, at_b) if s < steps else ([], [])
        if s == stages - 2:
            break
        fence = UOp(Ops.BARRIER, dtypes.void, (*before, *copies), AsyncWait(s + 1))  # commits slice s, no wait
        before = [fence]
        at_a, at_b = (UOp(Ops.NOOP, x.dtype, (x, fence)) for x in smem)
    # the barrier runs in the loop (ko is among its sources): it ends iteration ko-1's copies, starts iteration ko
    ready = UOp(Ops.BARRIER, dtypes.void, (*before, *copies, ko), AsyncWait(stages - 2))
    ahead = ko + (stages - 1)
    tile_a, tile_b = (UOp(Ops.NOOP, x.dtype, (x, ready)) for x in smem)
    _, loop_copies = stage(ahead * bk, ahead % stages, Copy(True, ahead.lt(steps)), tile_a, tile_b)
    return ready, loop_copies, ko % stages, ko % stages


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
