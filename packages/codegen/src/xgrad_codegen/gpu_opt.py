"""GPU optimizer actions (LOCAL, GROUP, GROUPTOP) and the GPU heuristic, for renderers with workgroups (`has_local`).

IR in: a kernel AST as `optimize` takes it (ranges of kind LOOP/REDUCE). IR out: the same AST with ranges split and
re-kinded: LOCAL ranges are threads of a workgroup over output elements, GROUP ranges threads of a workgroup that
share one reduction (each adds a part; `xgrad_codegen.gpu` combines the parts through shared memory), every remaining
output LOOP becomes GLOBAL (one workgroup per iteration). `xgrad_codegen.gpu` then maps GLOBAL/LOCAL/GROUP ranges onto
the renderer's launch dimensions.

The CPU path never comes here: `optimize_for` hands renderers without workgroups to `opt.optimize` unchanged.
"""

from __future__ import annotations

from xgrad.helpers import NOOPT, prod
from xgrad.uop.ops import AxisType, KernelInfo, Ops, UOp
from xgrad.uop.pattern import graph_rewrite, substitute
from xgrad_codegen.opt import (
    Opt,
    OptError,
    apply_opt,
    heuristic_opts,
    kernel_ranges,
    optimize,
    pm_reduce_ranges,
    range_of,
    range_size,
)
from xgrad_codegen.pack import index_step
from xgrad_codegen.renderer import Renderer
from xgrad_codegen.tc import apply_tensor_core, match_matmul, tensor_core_for
from xgrad_codegen.tc_tile import TILE_SHAPES, TileShape, apply_tiled_tensor_core, pick_tile

# the actions this module adds, what their axis refers to and the amounts BEAM tries (see opt.OPT_ACTIONS)
GPU_ACTIONS: dict[str, tuple[str, tuple[int, ...]]] = {
    # split an output loop; the inner part becomes threads of one workgroup (0: the whole loop)
    "LOCAL": ("an output LOOP or GLOBAL range of constant size", (0, 2, 4, 8, 16, 32, 64, 128, 256)),
    # split a reduction; the inner part becomes threads of one workgroup, each adding every amount-th element
    "GROUP": ("a REDUCE range of constant size", (0, 2, 4, 8, 16, 32, 64, 128, 256)),
    # split a reduction; the outer part becomes threads of one workgroup, each adding one contiguous chunk
    "GROUPTOP": ("a REDUCE range of constant size", (0, 2, 4, 8, 16, 32, 64, 128, 256)),
}
THREAD_KINDS = (AxisType.LOCAL, AxisType.GROUP)
REDUCING_KINDS = (AxisType.REDUCE, AxisType.UNROLL, AxisType.GROUP)  # the other kinds of range index outputs
# a reduction at least this long is split over a workgroup's threads (softmax, norms, sums), unless the kernel has
# `renderer.group_max_outputs` outputs: one thread per output is then parallel enough
GROUP_MIN_REDUCE = 1024
GROUP_MIN_STEPS = 16  # each thread of a group adds at least this many elements
GROUP_AMOUNTS = (256, 128, 64, 32, 16)
LOCAL_AMOUNTS = (64, 32, 16, 8, 4, 2)
LOCAL_MIN = 16  # an output loop longer than LOCAL_PAD that no LOCAL_AMOUNTS down to this divides ...
LOCAL_PAD = 64  # ... is padded to a multiple of this


def threads_of(ast: UOp) -> int:
    """Threads in one workgroup of `ast`: the product of its LOCAL and GROUP ranges."""
    return int(prod(range_size(r) or 1 for r in kernel_ranges(ast) if r.arg[1] in THREAD_KINDS))


def apply_gpu_opt(ast: UOp, opt: Opt) -> UOp:
    """`ast` with LOCAL, GROUP or GROUPTOP applied; OptError when it does not apply. The renderer's thread limits are
    checked where the ranges are mapped onto launch dimensions (`xgrad_codegen.gpu.lower_gpu_dims`)."""
    if opt.op == "TC":
        raise OptError(
            "TC picks one of the renderer's tensor_cores: apply it with gpu_opt.apply_opts(ast, opts, renderer)"
        )
    rngs = kernel_ranges(ast)
    rng = range_of(ast, opt.axis)
    axis_id, kind = rng.arg
    size = range_size(rng)
    if opt.op == "LOCAL" and any(u.op is Ops.WMMA for u in ast.toposort):
        # a later LOCAL range maps to the threads' x dimension ahead of the WMMA's lanes, so a warp (32 consecutive
        # threads) would hold lanes of several tiles: the tensor core would multiply mixed fragments
        raise OptError("LOCAL after TC would split a tensor core's lanes across warps")
    want = (AxisType.LOOP, AxisType.GLOBAL) if opt.op == "LOCAL" else (AxisType.REDUCE,)
    if kind not in want:
        raise OptError(f"{opt.op} applies to a {' or '.join(k.name for k in want)} range, not to a {kind.name} range")
    amount = opt.amount or size
    if size is None or not amount or amount < 2 or size % amount:
        raise OptError(f"{opt.op} cannot split a range of size {size} by {opt.amount}")
    new_kind = AxisType.LOCAL if opt.op == "LOCAL" else AxisType.GROUP
    inner = UOp.range(amount, max(r.arg[0] for r in rngs) + 1, new_kind)
    if amount == size:
        return graph_rewrite(substitute(ast, {rng: inner}), pm_reduce_ranges, name="reduce ranges")
    outer = UOp.range(size // amount, axis_id, kind)
    split = inner * (size // amount) + outer if opt.op == "GROUPTOP" else outer * amount + inner
    return graph_rewrite(substitute(ast, {rng: split}), pm_reduce_ranges, name="reduce ranges")


def gpu_candidates(ast: UOp, renderer: Renderer) -> list[Opt]:
    """The legal GPU actions on `ast` for `renderer` (BEAM's moves besides opt.candidate_opts), within its limits.
    GROUP and GROUPTOP only in a kernel with fewer outputs than `renderer.group_max_outputs`, as the heuristic: on
    lavapipe a candidate with barriers and wide unrolls took LLVM minutes to compile (coroutine frames), and with that
    many outputs a group reduction is slower there anyway."""
    if not renderer.has_local:
        return []
    out: list[Opt] = []
    outputs = prod(range_size(r) or 1 for r in kernel_ranges(ast) if r.arg[1] not in REDUCING_KINDS)
    may_group = renderer.supports_group_reduce and outputs < renderer.group_max_outputs
    if renderer.has_shared and not any(u.op in (Ops.WMMA, Ops.DEFINE_LOCAL) for u in ast.toposort):
        out.extend(tile_candidates(ast, renderer))
    room = renderer.max_threads // max(threads_of(ast), 1)
    for r in kernel_ranges(ast):
        i, size = r.arg[0], range_size(r)
        if size is None or size < 2:
            continue
        fits = [a for a in GPU_ACTIONS["LOCAL"][1] if a and a <= min(size, room) and size % a == 0]
        if r.arg[1] in (AxisType.LOOP, AxisType.GLOBAL) and renderer.local_max:
            out.extend(Opt("LOCAL", i, a) for a in fits if a <= renderer.local_max[0])
        if r.arg[1] is AxisType.REDUCE and may_group:
            out.extend(Opt(op, i, a) for op in ("GROUP", "GROUPTOP") for a in fits)
    return out


def tile_candidates(ast: UOp, renderer: Renderer) -> list[Opt]:
    """Tensor cores tiled through shared memory (`tc_tile`), each shape that fits the renderer's threads and shared
    memory, for each instruction that takes the kernel's matmul (BEAM's TC moves)."""
    out: list[Opt] = []
    for i, tc in enumerate(renderer.tensor_cores):
        try:
            match_matmul(ast, tc)
        except OptError:
            continue
        fits = (
            s for s in TILE_SHAPES if s.fits(tc, renderer.max_threads, renderer.shared_max, renderer.async_copy_bytes)
        )
        out.extend(Opt("TC", i, shape.code) for shape in fits)
    return out


def _contiguous_loop(ast: UOp) -> UOp | None:
    """The output loop that consecutive stores step through by the fewest elements, innermost first (neighbouring
    threads then touch neighbouring memory; after an UPCAST that is the upcast loop's outer part)."""
    best: tuple[int, UOp] | None = None
    for r in reversed([r for r in kernel_ranges(ast) if r.arg[1] in (AxisType.LOOP, AxisType.GLOBAL)]):
        steps = [index_step(st.src[0].src[1], r) for st in ast.src]
        step = max((abs(x) if x is not None else 1 << 62) for x in steps) if steps else 1 << 62
        if best is None or step < best[0]:
            best = (step, r)
    return best[1] if best is not None else None


def gpu_heuristic_opts(ast: UOp, renderer: Renderer) -> list[Opt]:
    """The GPU heuristic. Each opt's axis is the id of a range of the kernel (see opt.Opt).

    1. a long reduction (at least GROUP_MIN_REDUCE steps over all its loops: a softmax or norm row, a big sum, a
       conv's weight gradient) in a kernel with fewer than `renderer.group_max_outputs` outputs (a GPU: 16384;
       lavapipe, where barriers cost far more: 16 per SIMD lane of its threads) is split over the threads of a
       workgroup: its longest loop by the largest of GROUP_AMOUNTS that divides it, leaves GROUP_MIN_STEPS steps per
       thread and fits the renderer (GROUP: thread t adds elements t, t+n, ..., so neighbouring threads read
       neighbouring memory); the parts meet in shared memory;
    2. without a group (each grouped row is its own workgroup): the CPU heuristic's register tiles and unrolled
       windows (`opt.heuristic_opts` without scratch panels: UPCAST, UNROLL, PADTO), then the store-contiguous output
       loop (what is left of it) is split so that its inner part becomes the workgroup's threads (LOCAL, the largest
       of LOCAL_AMOUNTS that divides it and fits); a loop longer than LOCAL_PAD that nothing down to LOCAL_MIN
       divides is padded to a multiple of LOCAL_PAD first (its extra threads store nothing); a workgroup left with
       fewer threads than that is filled from the other output loops, and padded up to the renderer's `min_local`
       (`_more_threads`);
    3. every other output loop becomes a workgroup dimension (GLOBAL, see `optimize_for`)."""
    if NOOPT or not renderer.has_local:
        return []
    opts: list[Opt] = []

    def add(opt: Opt) -> None:
        nonlocal ast
        opts.append(opt)
        ast = apply_opt(ast, opt)

    rngs = kernel_ranges(ast)
    outputs = int(prod(range_size(r) or renderer.group_max_outputs for r in rngs if r.arg[1] is AxisType.LOOP))
    reds = [r for r in rngs if r.arg[1] is AxisType.REDUCE and range_size(r) is not None]
    total = int(prod(range_size(r) or 1 for r in reds))
    few = outputs < renderer.group_max_outputs
    if renderer.supports_group_reduce and reds and total >= GROUP_MIN_REDUCE and few:
        red = max(reds, key=lambda r: range_size(r) or 0)  # the longest of the reduce loops (a conv's batch)
        size = range_size(red) or 0
        amounts = [a for a in GROUP_AMOUNTS if size % a == 0 and total >= GROUP_MIN_STEPS * a]
        if amount := next((a for a in amounts if a <= renderer.max_threads), 0):
            add(Opt("GROUP", red.arg[0], amount))
    grouped = bool(opts)  # a workgroup per reduced row: its outputs stay separate workgroups
    if not grouped:  # the register tiles and unrolled windows of the CPU heuristic, without its scratch panels
        for opt in heuristic_opts(ast, renderer.max_vector_width, scratch=False):
            add(opt)
    if not grouped and (loop := _contiguous_loop(ast)) is not None and renderer.local_max:
        size = range_size(loop) or 0
        room = min(renderer.max_threads // threads_of(ast), renderer.local_max[0])
        fits = [a for a in LOCAL_AMOUNTS if size % a == 0 and a <= room and a < size]
        amount = next((a for a in fits if a >= LOCAL_MIN), 0)
        if not amount and size > LOCAL_PAD and LOCAL_PAD <= room and loop.arg[1] is AxisType.LOOP:
            add(Opt("PADTO", loop.arg[0], LOCAL_PAD))
            loop = range_of(ast, loop.arg[0])
            amount = LOCAL_PAD
        amount = amount or next(iter(fits), 0)
        if amount >= 2:
            add(Opt("LOCAL", loop.arg[0], amount))
        for opt in _more_threads(ast, renderer, {o.axis for o in opts if o.op == "LOCAL"}):
            add(opt)
    return opts


def _more_threads(ast: UOp, renderer: Renderer, split: set[int]) -> list[Opt]:
    """LOCAL actions that fill a workgroup whose store-contiguous loop gave it fewer than LOCAL_AMOUNTS[0] threads
    (a loop the register tile upcast whole, a conv's short image rows): the other output loops, longest first, each
    by the largest amount that divides it and fits. When the workgroup is still narrower than the renderer's
    `min_local` (lavapipe's SIMD lanes), the loop that needs the least padding is padded to make up the rest. `split`:
    the ids of the loops LOCAL has split already."""
    opts: list[Opt] = []
    threads = threads_of(ast)
    loops = [r for r in kernel_ranges(ast) if r.arg[1] in (AxisType.LOOP, AxisType.GLOBAL) and r.arg[0] not in split]
    for loop in sorted(loops, key=lambda r: -(range_size(r) or 0)):
        room = min(LOCAL_AMOUNTS[0] // threads, renderer.max_threads // threads, renderer.local_max[0])
        size = range_size(loop) or 0  # 0: a symbolic size, which LOCAL does not split
        if (amount := next((a for a in LOCAL_AMOUNTS if size and size % a == 0 and a <= room), 0)) < 2:
            continue
        opts.append(Opt("LOCAL", loop.arg[0], amount))
        ast = apply_opt(ast, opts[-1])
        threads *= amount
        split.add(loop.arg[0])
    need = -(-renderer.min_local // threads)
    room = min(renderer.max_threads // threads, renderer.local_max[0])
    short = [r for r in kernel_ranges(ast) if r.arg[1] is AxisType.LOOP and (range_size(r) or 0) >= need]
    short = [r for r in short if r.arg[0] not in split]
    if need < 2 or need > room or not short:
        return opts
    loop = min(short, key=lambda r: (-(range_size(r) or 0) % need) / (range_size(r) or 1))
    opts.append(Opt("PADTO", loop.arg[0], need))
    ast = apply_opt(ast, opts[-1])
    size = range_size(range_of(ast, loop.arg[0])) or 0
    amount = max(a for a in (need, *LOCAL_AMOUNTS) if size % a == 0 and a % need == 0 and a <= room)
    opts.append(Opt("LOCAL", loop.arg[0], amount))
    return opts


def apply_opts(ast: UOp, opts: list[Opt], renderer: Renderer) -> UOp:
    """`opts` applied in order; TC (whose axis indexes the renderer's `tensor_cores`) needs the renderer: amount 0
    is one WMMA per warp (`tc.py`), any other amount the code of a `tc_tile.TileShape` (staged through shared
    memory)."""
    for opt in opts:
        if opt.op != "TC":
            ast = apply_opt(ast, opt)
            continue
        if not 0 <= opt.axis < len(renderer.tensor_cores):
            raise OptError(f"TC {opt.axis}: the renderer declares {len(renderer.tensor_cores)} tensor cores")
        if any(u.op in (Ops.WMMA, Ops.DEFINE_LOCAL) for u in ast.toposort):
            raise OptError("TC applies once per kernel")
        tc = renderer.tensor_cores[opt.axis]
        if opt.amount == 0:
            ast = apply_tensor_core(ast, tc)
            continue
        shape, name = TileShape.from_code(opt.amount), type(renderer).__name__
        if not renderer.has_shared:
            raise OptError(f"TC {opt.axis} {opt.amount} stages tiles in shared memory, which {name} does not have")
        if shape.threads(tc) > renderer.max_threads:
            raise OptError(f"TC tile {opt.amount} needs {shape.threads(tc)} threads; {name} has {renderer.max_threads}")
        vector_bytes, async_bytes = renderer.aligned_vector_bytes, renderer.async_copy_bytes
        ast = apply_tiled_tensor_core(
            ast, tc, shape, renderer.shared_max, vector_bytes, async_bytes, renderer.matrix_loads
        )
    return ast


def _tiled_tensor_core(ast: UOp, renderer: Renderer) -> Opt | None:
    """The heuristic's tiled TC for a matmul: the first tensor core that takes it, with `tc_tile.pick_tile`'s
    shape (None: no shared memory, not such a matmul, or too small to tile without padding it much)."""
    if not renderer.has_shared:
        return None
    for i, tc in enumerate(renderer.tensor_cores):
        if (shape := pick_tile(ast, tc, renderer.max_threads, renderer.shared_max)) is not None:
            return Opt("TC", i, shape.code)
    return None


def optimize_for(ast: UOp, renderer: Renderer, opts: list[Opt] | None = None) -> UOp:
    """Apply `opts` (default: the heuristic for `renderer`). A CPU renderer gets `opt.optimize` exactly as before; a
    GPU renderer gets its tensor cores for a matmul whose dtypes one of them takes (`tc.py`, recorded as
    Opt("TC", index)), else the GPU heuristic; each output loop left becomes a GLOBAL range (a workgroup
    dimension)."""
    if not renderer.has_local:
        return optimize(ast, opts, renderer.max_vector_width, renderer.supports_scratch)
    if opts is None and not NOOPT and (tiled := _tiled_tensor_core(ast, renderer)) is not None:
        chosen = [tiled]  # a matmul on the tensor cores, blocks of warps staging tiles in shared memory
        ast = apply_opts(ast, chosen, renderer)
    elif opts is None and not NOOPT and (found := tensor_core_for(ast, renderer.tensor_cores)) is not None:
        chosen, ast = [Opt("TC", found[0])], found[1]  # a matmul on the tensor cores: nothing else to choose
    else:
        chosen = gpu_heuristic_opts(ast, renderer) if opts is None else opts
        ast = apply_opts(ast, chosen, renderer)
    for r in kernel_ranges(ast):
        if r.arg[1] is AxisType.LOOP:
            ast = substitute(ast, {r: UOp.range(r.src[0], r.arg[0], AxisType.GLOBAL)})
    info = ast.arg if isinstance(ast.arg, KernelInfo) else KernelInfo()
    return ast.replace(arg=KernelInfo(info.name, tuple(chosen), True))
