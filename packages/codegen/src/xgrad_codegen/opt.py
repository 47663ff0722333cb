"""Optimizer actions on a kernel AST, and the heuristic that picks them.

IR in: a kernel AST (SINK of STOREs, RANGEs of kind LOOP/REDUCE). IR out: the same AST with ranges split and re-kinded:
one output range becomes GLOBAL (outermost, split over the cores), some inner ranges become UPCAST (output lanes) or
UNROLL (reduction lanes), later expanded into straight-line code by `expand_lanes`; PACK (see `pack`) adds a STORE
that copies a strided panel into a scratch array. `OPT_ACTIONS` lists the actions, `candidate_opts` the legal next
ones for a kernel; `apply_opt` raises OptError for an action that does not apply.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from xgrad.dtype import dtypes
from xgrad.helpers import NOOPT, prod
from xgrad.uop.ops import AxisType, KernelInfo, Ops, UOp
from xgrad.uop.pattern import PatternMatcher, UPat, graph_rewrite, substitute
from xgrad.uop.symbolic import simplify
from xgrad_codegen.pack import (
    MAX_SCRATCH_BYTES,
    PackError,
    apply_pack,
    check_pack,
    index_step,
    is_scratch,
    packable_loads,
)

if TYPE_CHECKING:
    from xgrad_codegen.renderer import Renderer


class OptError(ValueError):
    """An action that does not apply to this kernel (the message says why). BEAM skips such candidates."""


class OptOps(enum.StrEnum):
    """The optimizer actions (tinygrad's name for the enum). What each does and takes: OPT_ACTIONS below; the GPU ones
    (LOCAL, GROUP, GROUPTOP, TC): xgrad_codegen.gpu_opt. A member equals its name as a string."""

    UPCAST = "UPCAST"
    UNROLL = "UNROLL"
    PADTO = "PADTO"
    GLOBAL = "GLOBAL"
    PACK = "PACK"
    SPLIT = "SPLIT"
    LOCAL = "LOCAL"
    GROUP = "GROUP"
    GROUPTOP = "GROUPTOP"
    TC = "TC"


@dataclass(frozen=True)
class Opt:
    """One optimizer action (see OPT_ACTIONS): `op` names it (an OptOps member; its name as a string is taken too);
    `amount` is the split factor (0 = the whole range), or for PADTO the multiple to pad the range to. An unknown
    action raises OptError.

    `axis` names the range the action applies to by its id (the RANGE's `arg[0]`, what `kernel_ranges` shows), not by
    a position: an action before it that splits or re-kinds ranges leaves the ids of the others as they were (the
    outer part of a split keeps its range's id, the inner part gets a fresh one, max id + 1), so a list of opts reads
    the same however the ranges sort after each step. Two actions do not name a range. PACK's axis is the load's
    position in `pack.packable_loads(ast)`: loads have no id, and that list's order is the AST's own (first use in a
    REDUCE, in toposort order), which the splits before a PACK do not change; PACK is the last action on a kernel (it
    renumbers the loops its panel does not read, so no range action may follow it). TC's axis is the position of
    the tensor core in the renderer's `tensor_cores` (see `gpu_opt.apply_opts`)."""

    op: str  # an OptOps member once made (a StrEnum: a str); typed str so that Opt("UPCAST", ...) reads as it runs
    axis: int
    amount: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.op, OptOps):
            if self.op not in OptOps.__members__:
                raise OptError(f"unknown optimizer action {self.op!r}; the actions are {list(OptOps.__members__)}")
            object.__setattr__(self, "op", OptOps(self.op))

    def __str__(self) -> str:
        """`UPCAST(3,16)`: the action, its axis (a range id; see above) and its amount (DEBUG and BEAM output)."""
        return f"{self.op}({self.axis},{self.amount})"


# every action, what its axis refers to, and the amounts it takes (search.py builds its candidates from this table)
OPT_ACTIONS: dict[str, tuple[str, tuple[int, ...]]] = {
    # split an output loop; the inner part becomes lanes (vector width, register tile)
    "UPCAST": ("an output LOOP of constant size", (0, 2, 3, 4, 6, 8, 16, 24, 32)),
    # split a reduction; the inner part becomes lanes, each added into the accumulator in turn
    "UNROLL": ("a REDUCE range of constant size", (0, 2, 4, 8)),
    # pad an output loop to a multiple so it can be upcast (the extra iterations store nothing; see pad_range)
    "PADTO": ("an output LOOP of constant size", (4, 6, 8, 16)),
    # make an output loop the outermost, parallel one (the pool splits it over the cores); default: the first LOOP
    "GLOBAL": ("an output LOOP", (0,)),
    # copy a strided panel read in a reduction into a contiguous scratch array (renderers with supports_scratch)
    # (amount 1: a load the parallel loop does not read, packed whole once per call: a conv's weights)
    "PACK": ("a load of pack.packable_loads(ast)", (0, 1)),
    # split an output (or the parallel) loop; the inner part becomes a plain loop that runs inside every other output
    # loop: with PACK, a panel several register tiles wide whose row tile (matmul: rows of A) stays in cache across them
    "SPLIT": ("an output LOOP or the GLOBAL loop of constant size", (2, 4)),
}


def kernel_ranges(ast: UOp) -> list[UOp]:
    """The RANGEs of a kernel, output ranges first, each group in axis order."""
    rngs = [u for u in ast.toposort if u.op is Ops.RANGE]
    return sorted(rngs, key=lambda r: (r.arg[1] is AxisType.REDUCE or r.arg[1] is AxisType.UNROLL, r.arg[0]))


def range_of(ast: UOp, axis: int) -> UOp:
    """The range of `ast` whose id is `axis` (an Opt's axis); OptError naming the ids there are when none has it."""
    found = [r for r in kernel_ranges(ast) if r.arg[0] == axis]
    if len(found) != 1:
        ids = [r.arg[0] for r in kernel_ranges(ast)]
        raise OptError(f"no range has id {axis}: the kernel's range ids are {ids} (an Opt's axis is a range id)")
    return found[0]


def range_size(r: UOp) -> int | None:
    end = r.src[0]
    return int(end.arg) if end.op is Ops.CONST else None


def apply_opt(ast: UOp, opt: Opt) -> UOp:
    """`ast` with one action applied; raises OptError (with the reason) when the action does not apply."""
    if any(u.op is Ops.DEFINE_LOCAL for u in ast.toposort):  # lanes or threads would share its staged tiles
        raise OptError(f"{opt.op} after a tiled TC: the tile shape (the TC amount) already chose every split")
    if opt.op in ("LOCAL", "GROUP", "GROUPTOP", "TC"):
        from xgrad_codegen.gpu_opt import apply_gpu_opt  # gpu_opt builds on this module: imported at first use

        return apply_gpu_opt(ast, opt)
    if opt.op not in OPT_ACTIONS:
        raise OptError(f"unknown optimizer action {opt.op!r}; the actions are {sorted(OPT_ACTIONS)}")
    if any(is_scratch(u) for u in ast.toposort):
        raise OptError(f"{opt.op} after PACK would change the loops a packed panel was built for; {opt.op} first")
    if opt.op == "PACK":
        try:
            return apply_pack(ast, opt.axis, whole=opt.amount == 1)
        except PackError as e:
            raise OptError(str(e)) from None
    rngs = kernel_ranges(ast)
    rng = range_of(ast, opt.axis)
    axis_id, kind = rng.arg
    size = range_size(rng)
    if opt.op == "GLOBAL":
        if kind is not AxisType.LOOP:
            raise OptError(f"GLOBAL applies to an output LOOP, not to a {kind.name} range")
        return substitute(ast, {rng: UOp.range(rng.src[0], axis_id, AxisType.GLOBAL)})
    if opt.op == "PADTO":
        if size is None or kind is not AxisType.LOOP or opt.amount < 2:
            raise OptError("PADTO applies to an output LOOP of constant size, with a multiple of at least 2")
        return pad_range(ast, rng, opt.amount)
    if opt.op == "SPLIT":
        if size is None or kind not in (AxisType.LOOP, AxisType.GLOBAL):
            raise OptError(f"SPLIT applies to an output or GLOBAL loop of constant size, not to a {kind.name} range")
        if opt.amount < 2 or size % opt.amount != 0:
            raise OptError(f"SPLIT needs an amount of at least 2 that divides {size}, not {opt.amount}")
        if opt.amount == size:
            raise OptError("SPLIT by the whole range would leave nothing outside; use the range itself")
        inner = UOp.range(opt.amount, max(r.arg[0] for r in rngs) + 1, AxisType.LOOP)
        outer = UOp.range(size // opt.amount, axis_id, kind)
        return substitute(ast, {rng: outer * opt.amount + inner})
    want = AxisType.LOOP if opt.op == "UPCAST" else AxisType.REDUCE
    if kind is not want:
        raise OptError(f"{opt.op} applies to a {want.name} range, not to a {kind.name} range")
    amount = opt.amount or size
    if size is None or not amount or amount < 0 or size % amount != 0:
        raise OptError(f"cannot split a range of size {size} by {opt.amount}")
    new_kind = AxisType.UPCAST if opt.op == "UPCAST" else AxisType.UNROLL
    next_id = max(r.arg[0] for r in rngs) + 1
    inner = UOp.range(amount, next_id, new_kind)
    if amount == size:
        return substitute(ast, {rng: inner})
    outer = UOp.range(size // amount, axis_id, kind)
    return graph_rewrite(substitute(ast, {rng: outer * amount + inner}), pm_reduce_ranges, name="reduce ranges")


def candidate_opts(ast: UOp, renderer: Renderer) -> list[Opt]:
    """The legal single next actions on `ast` for `renderer` (the BEAM search's moves)."""
    out: list[Opt] = []
    rngs = kernel_ranges(ast)
    has_global = any(r.arg[1] is AxisType.GLOBAL for r in rngs)
    has_reduce = any(r.arg[1] is AxisType.REDUCE for r in rngs)
    for r in rngs:
        i, kind = r.arg
        size = range_size(r)
        if kind is AxisType.LOOP and not has_global:
            out.append(Opt("GLOBAL", i))
        if size is None or size <= 1:
            continue
        if kind is AxisType.LOOP:
            out.extend(Opt("UPCAST", i, a) for a in OPT_ACTIONS["UPCAST"][1] if a and a < size and size % a == 0)
            out.extend(Opt("PADTO", i, m) for m in OPT_ACTIONS["PADTO"][1] if size % m != 0 and size > m)
        if kind is AxisType.GLOBAL and has_reduce:  # only useful with a panel to share (see SPLIT, PACK)
            out.extend(Opt("SPLIT", i, a) for a in OPT_ACTIONS["SPLIT"][1] if a < size and size % a == 0)
        elif kind is AxisType.REDUCE:
            out.extend(Opt("UNROLL", i, a) for a in OPT_ACTIONS["UNROLL"][1] if a and a < size and size % a == 0)
    if renderer.supports_scratch:
        for i, load in enumerate(packable_loads(ast)):
            for whole in (False, True):
                try:
                    check_pack(ast, load, whole)
                except PackError:
                    continue
                out.append(Opt("PACK", i, int(whole)))
    return out


def pad_range(ast: UOp, rng: UOp, multiple: int) -> UOp:
    """Grow an output range to a multiple of `multiple` (so it can be upcast). Every STORE is gated by
    `rng < original size`, so the extra iterations write nothing. Loads that depend on the range are gated the same
    way when the stores are contiguous along it (its lanes become one vector: a masked vector load), else their index
    is clamped to the last real iteration instead: the extra lanes compute on real data and are never stored, and the
    inner loop has no per-load test (a matmul's row tile of 6 over 1024 rows)."""
    size = range_size(rng)
    if size is None or rng.arg[1] is not AxisType.LOOP:
        raise OptError("PADTO applies to output loops of constant size")
    padded = UOp.range(-(-size // multiple) * multiple, rng.arg[0], rng.arg[1])
    clamp = None if _stores_contiguous_on(ast, rng) else padded.minimum(size - 1)
    return graph_rewrite(
        substitute(ast, {rng: padded}), pm_gate_padded, ctx=(padded, padded.lt(size), clamp), name="gate padded range"
    )


def _gated(ctx: tuple[UOp, UOp, UOp | None], idx: UOp) -> UOp | None:
    _, valid, _ = ctx
    if len(idx.src) == 3 and valid in idx.src[2].toposort:
        return None
    gate = valid if len(idx.src) == 2 else idx.src[2].logical_and(valid)
    return idx.replace(src=(idx.src[0], idx.src[1], gate))


def gate_store(ctx: tuple[UOp, UOp, UOp | None], st: UOp) -> UOp | None:
    idx = _gated(ctx, st.src[0])
    return None if idx is None else st.replace(src=(idx, *st.src[1:]))


def gate_load(ctx: tuple[UOp, UOp, UOp | None], ld: UOp) -> UOp | None:
    padded, _, clamp = ctx
    idx = ld.src[0]
    if padded not in idx.toposort:
        return None
    if clamp is None:
        new = _gated(ctx, idx)
    elif clamp in idx.toposort:
        return None
    else:
        new = idx.replace(src=(idx.src[0], *(substitute(x, {padded: clamp}) for x in idx.src[1:])))
    return None if new is None else ld.replace(src=(new, *ld.src[1:]))


pm_gate_padded = PatternMatcher(
    [
        (UPat(Ops.STORE, name="st"), gate_store),
        (UPat(Ops.LOAD, name="ld"), gate_load),
    ]
)


def flatten_reduce_ranges(red: UOp) -> UOp | None:
    """After a split, a REDUCE lists an expression (outer*k + inner) where it listed a RANGE: list both ranges."""
    if all(r.op is Ops.RANGE for r in red.src[1:]):
        return None
    rngs = [x for r in red.src[1:] for x in r.toposort if x.op is Ops.RANGE]
    return red.replace(src=(red.src[0], *dict.fromkeys(rngs)))


pm_reduce_ranges = PatternMatcher(
    [
        (UPat(Ops.REDUCE, name="red"), flatten_reduce_ranges),
    ]
)


def _stores_contiguous_on(ast: UOp, rng: UOp) -> bool:
    """True when consecutive values of `rng` write consecutive elements (a vectorizable store)."""
    return all(index_step(store.src[0].src[1], rng) == 1 for store in ast.src)


def _reduce_stride(load: UOp) -> int | None:
    """How far apart in memory `load` reads for consecutive steps of its innermost reduce range (None: unknown)."""
    reds = sorted(
        (r for r in load.src[0].toposort if r.op is Ops.RANGE and r.arg[1] is AxisType.REDUCE), key=lambda r: r.arg[0]
    )
    return index_step(load.src[0].src[1], reds[-1]) if reds else None


def _strided_panel(ast: UOp) -> int | None:
    """The first packable load (its position in `packable_loads`) that PACK applies to and that reads its panel with a
    stride: a block of the register tile's contiguous axis, over the whole reduction (the right operand of a
    matmul)."""
    for i, load in enumerate(packable_loads(ast)):
        try:
            _, ups, _, _ = check_pack(ast, load)
        except PackError:
            continue
        lanes = int(prod(range_size(r) or 1 for r in ups))
        if ups and _reduce_stride(load) not in (lanes, None):
            return i
    return None


TALL = 48  # a tile axis at least this long gets 6 rows (padded when 6 does not divide it): 12 accumulators
LINEAR_LANES = (16, 8, 4)  # upcast amounts for a reduction without a vector axis (see _linear_lanes)
REUSE_LANES = (8, 4, 3)  # upcast amounts of its further output loops (see _reuse_lanes)
MAX_REUSE_LANES = 128  # at most this many lanes in such a scalar register tile
SMALL_REDUCE = 4  # with a register tile, reductions this short (a conv's 3x3 window) are unrolled completely
PANEL_SPLITS = (4, 2)  # how many register tiles wide a packed panel may grow (SPLIT amounts the heuristic tries)
MIN_PANEL_REUSE = 256  # a panel packed whole (PACK amount 1) is read at least this many times per element
MIN_PARALLEL_BLOCKS = 8  # SPLIT leaves at least this many iterations of the parallel loop (load balance over cores)


def _panel_split(ast: UOp, which: int) -> int:
    """How many blocks of the GLOBAL loop one packed panel should cover (1: no SPLIT). Each row tile of the other
    operand is then read once per wide panel instead of once per block: for a matmul, A is streamed from memory N/64
    instead of N/16 times. The panel must stay within MAX_SCRATCH_BYTES (about half of L2) and enough parallel
    iterations must remain."""
    reds, ups, outer, _ = check_pack(ast, packable_loads(ast)[which])
    panel = int(prod(range_size(r) or 1 for r in reds + ups)) * packable_loads(ast)[which].dtype.itemsize
    glob = next((r for r in outer if r.arg[1] is AxisType.GLOBAL), None)
    blocks = range_size(glob) if glob is not None else None
    if blocks is None or any(r.arg[1] is AxisType.LOOP for r in reds):
        return 1
    fits = (a for a in PANEL_SPLITS if panel * a <= MAX_SCRATCH_BYTES and blocks % a == 0)
    return next((a for a in fits if blocks // a >= MIN_PARALLEL_BLOCKS), 1)


def _batch_panel(ast: UOp, tiled: set[int]) -> tuple[UOp, int] | None:
    """For a matmul-like kernel (one reduction, nothing unrolled): an output loop besides the register tile's axes (a
    batch) of at least MIN_PARALLEL_BLOCKS iterations that, made the parallel loop, lets one PACK hold the vector
    operand's strided panel for every tile (a batched matmul's whole right operand, within MAX_SCRATCH_BYTES): the
    loop and the load's position in `packable_loads`. Each row tile of the other operand then stays in L1 across all
    the panel's column blocks."""
    if sum(r.arg[1] in (AxisType.REDUCE, AxisType.UNROLL) for r in kernel_ranges(ast)) != 1:
        return None
    for r in kernel_ranges(ast):
        if r.arg[1] is not AxisType.LOOP or r.arg[0] in tiled or (range_size(r) or 0) < MIN_PARALLEL_BLOCKS:
            continue
        swapped = apply_opt(ast, Opt("GLOBAL", r.arg[0]))
        for i, load in enumerate(packable_loads(swapped)):
            try:
                _, ups, _, _ = check_pack(swapped, load)
            except PackError:
                continue
            if any(index_step(load.src[0].src[1], up) == 1 for up in ups) and _reduce_stride(load) != 1:
                return r, i  # read as vectors along its lanes, with a stride along the reduction: the right operand
    return None


def _window_batch(ast: UOp, tiled: set[int]) -> UOp | None:
    """For a conv (a kernel whose short window reductions were unrolled): an output loop besides the register tile's
    axes (the batch; for one image, its rows) of at least MIN_PARALLEL_BLOCKS iterations that the weights' load does
    not read. As the parallel loop, each thread works through whole images, whose input and the weights stay in L2
    across every output-channel block; with the channel blocks parallel, each block streamed the whole batch's input
    again (the bench's 32 x 64 x 56 x 56 conv on a Zen 5 host, all in one process: 28.6 -> 23.2 ms with 8-row tiles,
    22.2 with 16-row ones)."""
    if not any(r.arg[1] is AxisType.UNROLL for r in kernel_ranges(ast)):
        return None
    loads = [u for u in ast.toposort if u.op is Ops.LOAD]
    for r in kernel_ranges(ast):
        if r.arg[1] is not AxisType.LOOP or r.arg[0] in tiled or (range_size(r) or 0) < MIN_PARALLEL_BLOCKS:
            continue
        if any(r.arg[0] not in _axes_read(load) for load in loads):
            return r
    return None


def _window_rows(ast: UOp, tiled: set[int]) -> UOp | None:
    """For a conv on 8-float vectors (16 registers: a tile of 8 channels x 1 vector leaves no room for more): the output
    loop whose windows overlap (a load reads it together with a short window reduction: the image rows), of even
    length, that the weights' load does not read. Tiled as 4 channels x 2 rows instead, each input vector feeds 4 FMAs
    and each broadcast weight 2: 6 loads per 8 FMAs instead of 9 (the bench's 32 x 64 x 56 x 56 conv with AVX2-only
    kernels: see packages/codegen/README.md)."""
    windows = {
        r.arg[0] for r in kernel_ranges(ast) if r.arg[1] is AxisType.REDUCE and (range_size(r) or 0) <= SMALL_REDUCE
    }
    reads = [_axes_read(u) for u in ast.toposort if u.op is Ops.LOAD]
    for r in reversed(kernel_ranges(ast)):
        if r.arg[1] is not AxisType.LOOP or r.arg[0] in tiled or (range_size(r) or 1) % 2:
            continue
        if any(r.arg[0] not in axes for axes in reads) and any(r.arg[0] in axes and axes & windows for axes in reads):
            return r
    return None


def _unread_panel(ast: UOp) -> int | None:
    """The position in `packable_loads` of a load the parallel loop does not read (a conv's weights, with the batch
    parallel) that PACK takes whole: filled once per call, before the parallel loop, and read contiguously. Only a
    plain strided read (no division in its index: a gradient's window views cost more to gather than they save) that
    every panel element serves at least MIN_PANEL_REUSE times: each call fills the whole panel in every thread."""
    for i, load in enumerate(packable_loads(ast)):
        try:
            *_, inner = check_pack(ast, load, whole=True)
        except PackError:
            continue
        if any(u.op in (Ops.IDIV, Ops.MOD) for u in load.src[0].toposort):
            continue
        if prod(range_size(r) or 1 for r in inner) >= MIN_PANEL_REUSE:
            return i
    return None


def _axes_read(load: UOp) -> set[int]:
    """The axis ids of the ranges a load's (simplified) index and gate depend on."""
    return {r.arg[0] for r in simplify(load.src[0]).toposort if r.op is Ops.RANGE}


def _tile_axis(ast: UOp, contiguous: UOp | None) -> UOp | None:
    """The output loop to upcast into a register tile next to the contiguous one: longer than 4 (padded to the tile
    depth when needed, its extra rows' loads clamped), preferring (innermost first) one that the loads reading the
    contiguous axis do not depend on, so those loads are reused across the tile (matmul: the rows; conv: the output
    channels, not the image rows)."""
    split = contiguous.arg[0] if contiguous is not None else -1
    others = [r for r in kernel_ranges(ast) if r.arg[1] is AxisType.LOOP and r.arg[0] != split]
    fits = [r for r in reversed(others) if (n := range_size(r)) is not None and n > 4]  # padded when needed
    # else a short one, upcast whole (a batch of 2-4 rows times a matrix: each weight vector loaded once for all)
    fits = fits or [r for r in reversed(others) if (n := range_size(r)) is not None and n > 1]
    along = [_axes_read(ld) for ld in packable_loads(ast) if split in _axes_read(ld)]
    return next((r for r in fits if not any(r.arg[0] in axes for axes in along)), fits[0] if fits else None)


@dataclass
class _Heuristic:
    """What the heuristic's stages share: the kernel as the opts chosen so far left it, and those opts."""

    ast: UOp
    vector_width: int
    scratch: bool
    opts: list[Opt] = field(default_factory=list)

    def add(self, op: str, axis: UOp | int, amount: int = 0) -> None:
        """Choose and apply an action on range `axis` (the opt names it by id; a split's outer part keeps the id), or
        for PACK on the load at position `axis` of `packable_loads`."""
        opt = Opt(op, axis.arg[0] if isinstance(axis, UOp) else axis, amount)
        self.opts.append(opt)
        self.ast = apply_opt(self.ast, opt)

    def now(self, rng: UOp) -> UOp:
        """Range `rng` (by id) as the kernel has it now."""
        return range_of(self.ast, rng.arg[0])

    def find(self, rng: UOp) -> UOp | None:
        """Range `rng` (by id) as the kernel has it now; None when no range has its id any more."""
        return next((r for r in kernel_ranges(self.ast) if r.arg[0] == rng.arg[0]), None)


def heuristic_opts(ast: UOp, vector_width: int = 4, scratch: bool = False) -> list[Opt]:
    """The heuristic, in named stages. Each opt's axis is the id of a range of the kernel (see Opt).

    1. vector axis (`_vector_axis`): upcast the store-contiguous output axis by the vector width (in a reduction
       with a tile: by two vectors when that divides; pad it when nothing divides);
    2. register tile (`_register_tile`): in a reduction, also upcast another output axis (`_tile_axis`) into a
       register tile: 6 rows x 2 vectors (12 accumulators; the axis is padded to a multiple of 6 when needed, its
       extra rows' loads clamped), 4 x 2 for short axes, or 8 x 1 (with 8-float vectors, a conv's 4 channels x 2
       image rows instead: `_window_rows`), so each loaded vector and each broadcast value is used several times by
       independent FMA chains (matmul, conv); reductions of at most SMALL_REDUCE steps (a conv's window rows and
       columns) are unrolled completely, so their short loops and per-step gates disappear;
    3. parallel panel (`_parallel_panel`): with such a tile, the blocks of one of the two tiled axes become the
       parallel outer loop, the one whose panel (the operand read through that axis and the reduction) is read with
       a stride: every inner tile reuses it, and if the renderer allows `scratch` it is PACKed into a contiguous
       array (a matmul's right operand, a conv's weights). When that leaves enough parallel blocks, the blocks are
       SPLIT first so one panel covers several tiles (`_panel_split`). A matmul with a batch loop of enough
       iterations whose whole panel fits the scratch limit makes the batch the parallel loop instead and packs every
       tile's panel at once (`_batch_panel`). A conv makes its batch (or its rows) the parallel loop and packs its
       weights whole before it (`_window_batch`, `_unread_panel`). A long reduction stays a plain loop: the C
       compiler unrolls it without chaining lanes;
    4. lanes without a tile (`_untiled_lanes`): a reduction with no vector axis: upcast the outermost output loop
       that every memory access steps through by a constant stride (`_linear_lanes`: its lanes share the rest of the
       index math), then further output loops that some load does not read (`_reuse_lanes`: a scalar register tile,
       each such value used by all its lanes); else unroll the innermost reduction by 4 (after up to 4 vector chains
       side by side in a matrix-vector product)."""
    if NOOPT:
        return []
    h = _Heuristic(ast, vector_width, scratch)
    rngs = kernel_ranges(ast)
    outs = [r for r in rngs if r.arg[1] is AxisType.LOOP]
    contiguous = next((r for r in reversed(outs) if _stores_contiguous_on(ast, r)), None)
    tile = _tile_axis(ast, contiguous) if any(r.arg[1] is AxisType.REDUCE for r in rngs) else None
    amount = 0
    if contiguous is not None:
        amount, contiguous = _vector_axis(h, contiguous, tile is not None, len(outs))
    if tile is not None and h.opts:
        tiled = {a.arg[0] for a in (contiguous, tile) if a is not None}
        _register_tile(h, tile, amount, contiguous)
        _parallel_panel(h, contiguous, tile, tiled)
    else:
        _untiled_lanes(h, contiguous, amount, ast)
    return h.opts


def _gathered(ast: UOp, axis: UOp) -> bool:
    """Whether some load reads output axis `axis` (a range of `ast`) other than contiguously: its vector is then
    a gather of one value per lane (a softmax's row sums read each lane from another row)."""
    loads = [u.src[0] for u in ast.toposort if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX]
    return any(index_step(i.src[1], axis) not in (0, 1) for i in loads if axis in i.src[1].toposort)


def _vector_axis(h: _Heuristic, contiguous: UOp, tiled: bool, n_outs: int) -> tuple[int, UOp]:
    """Stage 1: upcast the store-contiguous output axis by a vector (two with a register tile to come), padding it to
    whole vectors where nothing divides it. Returns the lanes upcast (0: none) and the axis as it was before the
    upcast (padded, if it was)."""
    size, vw = range_size(contiguous), h.vector_width
    if size is None:
        return 0, contiguous
    # the vector, its halves down to 4 lanes (a 56-wide conv row takes 8-lane vectors where 16 do not divide it),
    # and with a tile first two vectors
    widths = (vw, *(vw >> k for k in range(1, 4) if vw >> k > 4), 4)
    widths = (2 * vw, *widths) if tiled else widths
    amount = next((w for w in widths if w > 1 and size % w == 0 and (size > w or n_outs > 1)), 0)
    # AVX-512's 16-float vectors: a tiled row that 16 does not divide is padded to whole vectors when that adds
    # at most a quarter (a conv's 56-pixel rows: 64, the last vector's padded lanes masked off) rather than tiled
    # by half vectors (the bench's conv kernel on a Zen 5 host, both in one process: 37.0 -> 29.7 ms)
    wide = tiled and vw >= 16 and size > vw and 4 * (-size % vw) <= size
    if wide and amount < vw:
        amount = 0
    if not amount and vw > 1 and (wide or size > 2 * vw):  # e.g. 1000: pad to 1008, upcast
        h.add("PADTO", contiguous, vw)
        contiguous, amount = h.now(contiguous), vw
    if amount:
        h.add("UPCAST", contiguous, amount)
    return amount, contiguous


def _register_tile(h: _Heuristic, tile: UOp, amount: int, contiguous: UOp | None) -> None:
    """Stage 2: upcast the tile axis into rows of registers (6, 4, 8 or 16 deep by the vector width and the axis),
    unroll a conv's short window reductions whole, and tile a conv's image rows by 2 where `_window_rows` finds them."""
    vw = h.vector_width
    tile_size = range_size(tile) or 0
    rows = None
    if amount <= vw and tile_size % 8 == 0 and tile_size > 8:
        # AVX-512 has 32 registers: 16 rows of one 16-float vector (the bench's conv: 30.2 -> 27.7 ms)
        depth = 16 if vw >= 16 and tile_size % 16 == 0 and tile_size > 16 else 8
        rows = _window_rows(h.ast, {a.arg[0] for a in (contiguous, tile) if a}) if vw <= 8 else None
        if rows is not None:
            depth = 4  # with 16 registers, a conv tiles 4 channels x 2 image rows (see _window_rows)
    elif amount == 2 * vw and (tile_size >= TALL or tile_size % 6 == 0):
        depth = 6
    else:
        depth = 4
    depth = min(depth, tile_size)  # a short tile axis is upcast whole
    if tile_size % depth:  # the padded rows' loads are clamped (see pad_range): no test in the inner loop
        h.add("PADTO", tile, depth)
    h.add("UPCAST", tile, depth)
    for red in [r for r in kernel_ranges(h.ast) if r.arg[1] is AxisType.REDUCE]:
        if (range_size(red) or SMALL_REDUCE + 1) <= SMALL_REDUCE:  # a conv's window: straight-line code
            h.add("UNROLL", red, 0)
    if rows is not None:
        h.add("UPCAST", rows, 2)


def _parallel_panel(h: _Heuristic, contiguous: UOp | None, tile: UOp, tiled: set[int]) -> None:
    """Stage 3: choose the parallel (GLOBAL) loop and what to PACK: a batch whose whole panel fits, a conv's images,
    or the blocks of the tiled axis whose panel is read with a stride (SPLIT first when one panel can cover several
    tiles)."""
    if h.scratch and (batch := _batch_panel(h.ast, tiled)):
        h.add("GLOBAL", batch[0])
        h.add("PACK", batch[1])
        return
    if (images := _window_batch(h.ast, tiled)) is not None:
        h.add("GLOBAL", images)
        if h.scratch and (weights := _unread_panel(h.ast)) is not None:
            h.add("PACK", weights, 1)
        return
    for axis in (contiguous, tile):  # their outer parts keep the axis ids
        blocks = h.find(axis) if axis is not None else None
        if blocks is None or blocks.arg[1] is not AxisType.LOOP or (range_size(blocks) or 0) < 2:
            continue
        swapped = apply_opt(h.ast, Opt("GLOBAL", blocks.arg[0]))
        if (which := _strided_panel(swapped)) is not None:
            h.add("GLOBAL", blocks)
            if h.scratch:
                if (split := _panel_split(h.ast, which)) > 1:
                    glob = next(r for r in kernel_ranges(h.ast) if r.arg[1] is AxisType.GLOBAL)
                    h.add("SPLIT", glob, split)
                    which = _strided_panel(h.ast)
                if which is not None:
                    h.add("PACK", which)
            return


def _untiled_lanes(h: _Heuristic, contiguous: UOp | None, amount: int, base: UOp) -> None:
    """Stage 4: a reduction without a register tile. With no vector axis, lanes that share index math
    (`_linear_lanes`) and then lanes that reuse loaded values (`_reuse_lanes`); else up to 4 vector chains side by
    side (a matrix-vector product, whose vectors are contiguous loads: not when a load gathers them, `_gathered` on
    the kernel as it came, `base`) and the innermost reduction unrolled by 4."""
    reds = [r for r in kernel_ranges(h.ast) if r.arg[1] is AxisType.REDUCE]
    if reds and not h.opts and (lanes := _linear_lanes(h.ast)) is not None:
        h.add("UPCAST", lanes[0], lanes[1])
        upcast, total = {lanes[0].arg[0]}, lanes[1]
        while (more := _reuse_lanes(h.ast, upcast, MAX_REUSE_LANES // total)) is not None:
            h.add("UPCAST", more[0], more[1])
            upcast.add(more[0].arg[0])
            total *= more[1]
    elif reds and not h.opts and (shared := _reuse_lanes(h.ast, set(), MAX_REUSE_LANES)) is not None:
        # no loop to share index math, but one that a load does not read (attention's query heads over one key: each
        # score a dot product over the head's width): its lanes are independent chains that share that load
        h.add("UPCAST", shared[0], shared[1])
    elif reds and (size := range_size(reds[-1])) is not None and size % 4 == 0 and size >= 8:
        steps = prod(range_size(r) or 64 for r in reds)  # the chain's length (a quantised matrix's groups x group)
        if amount and contiguous is not None and (rest := range_size(contiguous)) and steps >= 64:
            # one vector of outputs (a matrix-vector product) is one chain of dependent FMAs, as slow as their latency:
            # up to 4 vectors side by side are independent chains that overlap. Gathered vectors (a softmax's row
            # sums, 8 rows a vector) are not: 4 x 8 rows' streams at once ran its kernel 2x slower than 8 rows'.
            chains = next((c for c in (4, 2) if rest % (c * amount) == 0 and rest >= 2 * c * amount), 1)
            if chains > 1 and not _gathered(base, contiguous):  # checked last: index math per load
                h.add("UPCAST", contiguous, chains)
        h.add("UNROLL", reds[-1], 4)


def _linear_lanes(ast: UOp) -> tuple[UOp, int] | None:
    """For a reduction with no vector axis: the output loop to upcast and by how much (16, 8 or 4, leaving at least 2
    iterations): the largest amount wins, then a loop that every memory access steps through by a constant stride
    (its lanes share the rest of the index math, which in a conv's gradient is div/mod of window views and costs more
    than the FMAs), then the outermost. Independent lanes overlap even when they share nothing."""
    indexes = [u for u in ast.toposort if u.op is Ops.INDEX]
    best: tuple[int, bool, int, UOp] | None = None
    for pos, r in enumerate(r for r in kernel_ranges(ast) if r.arg[1] is AxisType.LOOP):
        size = range_size(r)
        amount = next((a for a in LINEAR_LANES if size is not None and size % a == 0 and size >= 2 * a), None)
        if amount is None:
            continue
        linear = all(index_step(i.src[1], r) is not None for i in indexes if r in i.toposort)
        if best is None or (amount, linear, -pos) > best[:3]:
            best = (amount, linear, -pos, r)
    return None if best is None else (best[3], best[0])


def _reuse_lanes(ast: UOp, upcast: set[int], most: int) -> tuple[UOp, int] | None:
    """After `_linear_lanes` upcast a loop (the axes in `upcast` are taken): the outermost other output loop that
    some load does not read, and how much of it: all of it when it is at most 8 long, else 8, 4 or 3, whichever
    divides it first (never more than `most`). Each value such a load gives then feeds all of the loop's lanes: an
    outer product in registers (a conv's weight gradient reads the output gradient per output channel and the input
    per input channel: with 8 x 8 lanes each load feeds 8 FMAs, the demo's went from 225 to 54 us; the first conv's,
    4 output channels x its 3 x 3 window, from 90 to 23 us)."""
    reads = [_axes_read(u) for u in ast.toposort if u.op is Ops.LOAD]
    cap = min(most, max(REUSE_LANES))
    for r in kernel_ranges(ast):
        if r.arg[1] is not AxisType.LOOP or r.arg[0] in upcast or not (size := range_size(r)):
            continue  # unknown size, or an empty loop (nonzero(size=0)): no lanes to share a load
        amount = next((a for a in (size, *REUSE_LANES) if size % a == 0 and a <= cap), None)
        if amount is not None and any(r.arg[0] not in axes for axes in reads):
            return r, amount
    return None


def optimize(ast: UOp, opts: list[Opt] | None = None, vector_width: int = 4, scratch: bool = False) -> UOp:
    """Apply `opts` (default: the heuristic; `scratch`: the renderer can hold PACKed panels), then make the outermost
    output loop GLOBAL unless an action chose one."""
    chosen = heuristic_opts(ast, vector_width, scratch) if opts is None else opts
    for opt in chosen:
        ast = apply_opt(ast, opt)
    loops = [r for r in kernel_ranges(ast) if r.arg[1] is AxisType.LOOP]
    if loops and not any(r.arg[1] is AxisType.GLOBAL for r in kernel_ranges(ast)):
        ast = apply_opt(ast, Opt("GLOBAL", loops[0].arg[0]))
    info = ast.arg if isinstance(ast.arg, KernelInfo) else KernelInfo()
    return ast.replace(arg=KernelInfo(info.name, tuple(chosen), True))


# ---- expanding UPCAST/UNROLL ranges into lanes ----
def _lane_ranges(u: UOp, kinds: tuple[AxisType, ...]) -> list[UOp]:
    return sorted((x for x in u.toposort if x.op is Ops.RANGE and x.arg[1] in kinds), key=lambda r: r.arg[0])


def _lanes(u: UOp, rngs: list[UOp]) -> list[UOp]:
    sizes = [range_size(r) or 1 for r in rngs]
    out = []
    for combo in itertools.product(*(range(s) for s in sizes)):
        out.append(substitute(u, {r: UOp.const(dtypes.index, v) for r, v in zip(rngs, combo)}))
    return out


def _combine(op: Ops, vals: list[UOp]) -> UOp:
    ret = vals[0]
    for v in vals[1:]:
        ret = UOp(op, ret.dtype, (ret, v))
    return ret


def expand_unroll(red: UOp) -> UOp | None:
    """REDUCE over UNROLL ranges: combine the lanes in straight-line code, keep looping over the rest."""
    unrolls = [r for r in red.src[1:] if r.arg[1] is AxisType.UNROLL]
    if not unrolls:
        return None
    rest = tuple(r for r in red.src[1:] if r.arg[1] is not AxisType.UNROLL)
    value = _combine(red.arg, _lanes(red.src[0], unrolls))
    return UOp(Ops.REDUCE, red.dtype, (value, *rest), red.arg) if rest else value


def expand_upcast(sink: UOp) -> UOp | None:
    """A STORE that depends on UPCAST ranges becomes one STORE per lane."""
    stores: list[UOp] = []
    changed = False
    for st in sink.src:
        # lanes in the output's memory order (the range with the largest stride outermost), so a register tile's
        # values are computed row by row: each broadcast operand is used by the row's vectors and then dies
        ups = sorted(_lane_ranges(st, (AxisType.UPCAST,)), key=lambda r: -abs(index_step(st.src[0].src[1], r) or 0))
        if ups:
            changed = True
            stores.extend(_lanes(st, ups))
        else:
            stores.append(st)
    return sink.replace(src=tuple(stores)) if changed else None


pm_expand_lanes = PatternMatcher(
    [
        (UPat(Ops.REDUCE, name="red"), expand_unroll),
    ]
)


def expand_lanes(ast: UOp) -> UOp:
    ast = graph_rewrite(ast, pm_expand_lanes, name="expand unroll")
    return expand_upcast(ast) or ast


def estimate_trips(ranges: list[UOp]) -> int:
    return int(prod(range_size(r) or 1 for r in ranges))
