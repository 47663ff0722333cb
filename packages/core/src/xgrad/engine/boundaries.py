"""Kernel boundaries: which nodes of the tensor graph are computed once into a buffer (the scheduler's first passes).

IR in: the tensor graph under a SINK. IR out: the same graph (`split_reductions` rewrites big reductions into two
steps) and the set of its boundary nodes, each the output of one kernel or copy: the roots, CONTIGUOUS, ASSIGN, COPY
and COLLECTIVE (and their sources when not one run of a buffer), reductions that an expand would recompute or
that several nodes use, elementwise results over several buffers that an expand repeats RECOMPUTE_LIMIT times or
more, and what a device that binds few buffers per kernel needs (`realizes_for_buffer_limit`).
"""

from __future__ import annotations

from xgrad.engine.indexing import concrete_shape, contiguous_range, is_contiguous_view, is_realized, shape_of
from xgrad.engine.kernel_buffers import realizes_for_buffer_limit
from xgrad.helpers import prod
from xgrad.uop.ops import GroupOp, Ops, UOp
from xgrad.uop.pattern import PatternMatcher, UPat, graph_rewrite
from xgrad.uop.symshape import is_symbolic, sint_max, sym_prod

# ---- splitting big reductions (SPLIT_REDUCEOP) ----
SPLIT_MIN = 1 << 15  # split only reductions of at least this many elements ...
SPLIT_MAX_OUTPUTS = 64  # ... into at most this many outputs (more outputs already give every core work)


def split_reduce(red: UOp) -> UOp | None:
    """A reduction of many elements into few outputs runs on one core; reduce k chunks first (in parallel, one kernel),
    then the k partial results (a second kernel)."""
    x = red.src[0]
    op, axes = red.arg
    if is_symbolic(shape_of(x)):
        return None
    shape = concrete_shape(x)
    out_numel = prod(concrete_shape(red))
    reduced = prod(shape[a] for a in axes)
    if reduced < SPLIT_MIN or out_numel > SPLIT_MAX_OUTPUTS:
        return None
    if len(axes) == len(shape) and len(shape) > 1:  # everything: flatten first
        flat = UOp(Ops.REDUCE_AXIS, red.dtype, (x.reshape((reduced,)),), (op, (0,)))
        done = split_reduce(flat)
        return None if done is None else done.reshape(shape_of(red))
    if len(axes) != 1:
        return None
    a = axes[0]
    lanes = 8  # a vector of neighbours per chunk: the partial kernel streams its chunk with vector loads
    k = next((k for k in (256, 128, 64, 32, 16) if shape[a] % (k * lanes) == 0), None)
    if k is None:
        return None
    # partial[i, l] reduces chunk i of the axis, lane l of every vector in it: each chunk is read contiguously
    split = x.reshape(shape[:a] + (k, shape[a] // (k * lanes), lanes) + shape[a + 1 :])
    partial = UOp(Ops.CONTIGUOUS, red.dtype, (UOp(Ops.REDUCE_AXIS, red.dtype, (split,), (op, (a + 1,))),))
    total = UOp(Ops.REDUCE_AXIS, red.dtype, (partial,), (op, (a, a + 1, a + 2)))
    return total.reshape(shape_of(red))


pm_split_reduce = PatternMatcher(
    [
        (UPat(Ops.REDUCE_AXIS, name="red"), split_reduce),
    ]
)


def split_reductions(sink: UOp) -> UOp:
    """The graph under `sink` with its big reductions into few outputs split in two (`split_reduce`)."""
    return graph_rewrite(sink, pm_split_reduce, name="split reduce")


# ---- kernel boundaries ----
RECOMPUTE_LIMIT = 16  # an elementwise result repeated this many times by expands is computed once, into a buffer


def find_realizes(roots: list[UOp], walk: dict[UOp, None]) -> set[UOp]:
    """The kernel boundaries of the graph under `roots`; `walk` is its SINK's topological order."""
    sink_order = list(walk)[:-1]
    users: dict[UOp, set[UOp]] = {u: set() for u in sink_order}
    for u in sink_order:
        for s in u.src:
            users[s].add(u)
    realizes: set[UOp] = {r for r in roots if not is_realized(r)}
    for u in sink_order:
        if u.op in (Ops.CONTIGUOUS, Ops.ASSIGN, Ops.COPY, Ops.COLLECTIVE):
            realizes.add(u)
        if u.op is Ops.COPY and not (is_realized(u.src[0]) and contiguous_range(u.src[0]) is not None):
            realizes.add(u.src[0])
        if u.op is Ops.COLLECTIVE:  # each source is one run of a buffer
            realizes.update(s for s in u.src if not (is_realized(s) and contiguous_range(s) is not None))
    # Walk users before sources, tracking how many times an expand between here and a boundary repeats each node.
    # Reductions: realize when repeated (they would be recomputed per broadcast element) or when several nodes use
    # them. Elementwise results that read several buffers: realize when repeated many times (a conv's input gradient
    # would recompute the activation's gradient for every window position that reads it). Each rule counts its own
    # repeats: what an elementwise boundary reads is not repeated for the elementwise rule, still is for reductions.
    repeats: dict[UOp, tuple[int, int]] = {}  # node -> (repeats for the reduction rule, for the elementwise rule)
    elementwise_cuts: set[UOp] = set()
    for u in reversed(sink_order):
        for_reduce = for_elementwise = 1
        for user in users[u]:
            if user in realizes and user not in elementwise_cuts:
                continue
            n_reduce, n_elementwise = repeats.get(user, (1, 1))
            if user in elementwise_cuts:
                n_elementwise = 1
            if user.op is Ops.EXPAND:
                factor = max(1, sint_max(sym_prod(user.shape or ())) // max(1, sint_max(sym_prod(u.shape or ()))))
                n_reduce, n_elementwise = n_reduce * factor, n_elementwise * factor
            for_reduce, for_elementwise = max(for_reduce, n_reduce), max(for_elementwise, n_elementwise)
        if u.op is Ops.REDUCE_AXIS and u not in realizes and (for_reduce > 1 or len(_consumers(u, users)) > 1):
            realizes.add(u)
            for_reduce = for_elementwise = 1
        elif (
            u.op in GroupOp.Elementwise
            and u not in realizes
            and for_elementwise >= RECOMPUTE_LIMIT
            and _reads_buffers(u, realizes, 2)
        ):
            realizes.add(u)
            elementwise_cuts.add(u)
        repeats[u] = (for_reduce, for_elementwise)
    realizes |= realizes_for_buffer_limit(sink_order, realizes)  # devices that bind few buffers per kernel
    return {r for r in realizes if not (is_realized(r) and is_contiguous_view(r))}


def _reads_buffers(u: UOp, realizes: set[UOp], n: int) -> bool:
    """Whether computing `u` in a kernel loads at least `n` different buffers (kernel boundaries count as one)."""
    found: set[UOp] = set()
    seen: set[UOp] = set()
    stack = [u]
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        if x is not u and (x in realizes or x.op is Ops.BUFFER):
            found.add(x)
            if len(found) >= n:
                return True
        else:
            stack.extend(x.src)
    return False


def _consumers(u: UOp, users: dict[UOp, set[UOp]]) -> set[UOp]:
    """The nodes that use `u`, looking through movement ops."""
    out: set[UOp] = set()
    seen: set[UOp] = set()
    stack = list(users[u])
    while stack:  # no recursion: chains of movement ops can be long
        user = stack.pop()
        if user in seen:
            continue
        seen.add(user)
        if user.op in GroupOp.Movement:
            stack.extend(users[user])
        else:
            out.add(user)
    return out
