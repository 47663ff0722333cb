"""The scheduler: tensor graph in, an ordered list of kernels and copies out.

IR in: the tensor graph (BUFFER, CONST, movement ops, ALU, REDUCE_AXIS, CONTIGUOUS, COPY, ASSIGN) on single devices.
IR out: `ScheduleItem`s. A kernel item holds a kernel AST: SINK(STORE(INDEX(PARAM(0), index), value)) where
movement ops have become index expressions over RANGEs and reductions are REDUCE(value, *ranges).

`create_schedule` lists the passes in order. A graph on several devices arrives here already lowered to one graph per
device: `xgrad.engine.multi.lower_multi` (the `pm_shard` table) runs first, before the schedule cache, whose key is
the per-device graph.
"""

from __future__ import annotations

import functools
import heapq
from dataclasses import dataclass, field

from xgrad.buffer import Buffer, buffer_of, new_buffer_uop
from xgrad.dtype import dtypes
from xgrad.engine.boundaries import find_realizes, split_reductions
from xgrad.engine.indexing import buffer_view, contiguous_range, is_realized, lower_kernel, range_view, shape_of
from xgrad.helpers import DEBUG, SPEC, SPLIT_REDUCEOP
from xgrad.uop.ops import Ops, UOp
from xgrad.uop.passes import run_pass
from xgrad.uop.spec import check_tensor_graph
from xgrad.uop.symshape import sint_max, sym_prod


@dataclass
class ScheduleItem:
    """One step: a kernel (`ast` is its SINK), a copy (`ast.op` is COPY) or a collective across processes (`ast.op`
    is COLLECTIVE, `ast.arg` runs it). `bufs[0]` is the output; a copy reads `bufs[1]`, a collective `bufs[1:]`."""

    ast: UOp
    bufs: tuple[Buffer, ...]
    device: str

    @property
    def is_copy(self) -> bool:
        return self.ast.op is Ops.COPY

    @property
    def is_kernel(self) -> bool:
        """A compiled kernel (not a copy or a collective, which the engine runs itself)."""
        return self.ast.op is Ops.SINK


class ScheduleStats:
    """How often the scheduler ran (tests count it: a TinyJit replay must not schedule)."""

    calls: int = 0


@dataclass
class ScheduleCtx:
    """What the passes of one `create_schedule` hand on to the next."""

    walk: dict[UOp, None] = field(default_factory=dict)  # the graph's topological order (walked once)
    boundaries: set[UOp] = field(default_factory=set)  # the nodes computed into a buffer, each by one item
    order: list[UOp] = field(default_factory=list)  # the boundaries in the order their items run
    realizes: dict[UOp, UOp] = field(default_factory=dict)  # boundary -> its BUFFER (an ASSIGN: its target's)
    items: list[ScheduleItem] = field(default_factory=list)

    def show_boundaries(self, sink: UOp) -> str:
        return "\n".join(f"{u.op.name} {u.dtype} {u.shape}" for u in self.walk if u in self.boundaries)

    def show_order(self, sink: UOp) -> str:
        return "\n".join(f"{i:4d} {u.op.name} {u.dtype} {u.shape}" for i, u in enumerate(self.order))

    def show_items(self, sink: UOp) -> str:
        return "\n".join(f"{i:4d} {it.device} {it.ast}" for i, it in enumerate(self.items))


def create_schedule(roots: list[UOp]) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
    """Kernels and copies that realize `roots`, in order, and what each root becomes (a view of its new buffer)."""
    ScheduleStats.calls += 1
    ctx = ScheduleCtx()
    sink = UOp(Ops.SINK, dtypes.void, tuple(roots))
    if SPEC:  # the graph Tensor built is legal (spec_tensor_graph)
        sink = run_pass("check tensor graph", check_graph, sink)
    if SPLIT_REDUCEOP:  # a big reduction into few outputs: a parallel kernel of partial results, then the rest
        sink = run_pass("split reductions", split_reductions, sink)
    # what is computed once into a buffer: the rest is fused into the kernels that read it
    sink = run_pass("kernel boundaries", functools.partial(find_boundaries, ctx=ctx), sink, ctx.show_boundaries)
    # every kernel after the kernels it reads; an ASSIGN after the kernels that read the value it overwrites
    sink = run_pass("order kernels", functools.partial(order_kernels, ctx=ctx), sink, ctx.show_order)
    # each boundary becomes a kernel AST (indices pushed down to buffers by pm_push_index) or a copy
    sink = run_pass("lower kernels", functools.partial(lower_kernels, ctx=ctx), sink, ctx.show_items)
    becomes = {}
    for orig, r in zip(roots, sink.src):
        if r in ctx.realizes:
            becomes[orig] = buffer_view(ctx.realizes[r], shape_of(r)) if r.op is not Ops.ASSIGN else r.src[0]
    if DEBUG >= 3:
        for i, it in enumerate(ctx.items):
            print(f"schedule {i}: {'copy' if it.is_copy else it.ast.arg.name} on {it.device} bufs={list(it.bufs)}")
    return ctx.items, becomes


# ---- the passes ----
def check_graph(sink: UOp) -> UOp:
    """`sink` unchanged, once its graph passed the tensor-graph spec."""
    check_tensor_graph(sink)
    return sink


def find_boundaries(sink: UOp, ctx: ScheduleCtx) -> UOp:
    """Fill `ctx.boundaries` (see `xgrad.engine.boundaries`)."""
    ctx.walk = sink.walk()  # once: not cached on a graph the caller may drop
    ctx.boundaries = find_realizes(list(sink.src), ctx.walk)
    return sink


def order_kernels(sink: UOp, ctx: ScheduleCtx) -> UOp:
    """Fill `ctx.order`: the boundaries in a topological order (see `kernel_order`)."""
    ctx.order = kernel_order([u for u in ctx.walk if u in ctx.boundaries])
    return sink


def lower_kernels(sink: UOp, ctx: ScheduleCtx) -> UOp:
    """Fill `ctx.items`: a new buffer and a kernel (or a copy, or a collective) per boundary, in order; an ASSIGN
    writes its target."""
    realizes = ctx.realizes
    for node in ctx.order:
        device = node.device
        assert device is not None, f"{node.op} has no device"
        if node.op is Ops.ASSIGN:
            target_buf = node.src[0].base
            realizes[node] = target_buf
            ast, params = lower_kernel(node, target_buf, realizes)
            ctx.items.append(ScheduleItem(ast, tuple(buffer_of(p) for p in params), device))
            continue
        out = new_buffer_uop(device, sint_max(sym_prod(shape_of(node))), node.dtype)
        if node.op in (Ops.COPY, Ops.COLLECTIVE):  # the engine runs these on the buffers, no kernel
            srcs = node.src[:1] if node.op is Ops.COPY else node.src
            src_bufs = tuple(buffer_of(realizes[s]) if s in realizes else range_view(s) for s in srcs)
            if node.op is Ops.COPY:
                marker = UOp(Ops.COPY, node.dtype, (UOp(Ops.DEVICE, arg=srcs[0].device), UOp(Ops.DEVICE, arg=device)))
            else:
                marker = UOp(Ops.COLLECTIVE, node.dtype, (UOp(Ops.DEVICE, arg=device),), node.arg)
            ctx.items.append(ScheduleItem(marker, (buffer_of(out), *src_bufs), device))
        else:
            ast, params = lower_kernel(node, out, realizes)
            ctx.items.append(ScheduleItem(ast, tuple(buffer_of(p) for p in params), device))
        realizes[node] = out
    return sink


# ---- the order of the items ----
def kernel_order(nodes: list[UOp]) -> list[UOp]:
    """`nodes` (boundaries, in the graph's topological order) in an order to run them: each after the boundaries it
    reads, and each ASSIGN after every other item that loads what the ASSIGN overwrites (its target's buffer, or the
    node it assigns into) and does not depend on the ASSIGN. An item that reads the old value only through another
    boundary's buffer need not wait: that boundary does. Among the ready items the earliest in `nodes` runs first, so
    a graph without ASSIGN keeps its order."""
    targets = {u.src[0].base for u in nodes if u.op is Ops.ASSIGN}
    if not targets:
        return nodes
    index = {u: i for i, u in enumerate(nodes)}
    after: list[list[int]] = [[] for _ in nodes]  # i -> the items that must wait for i
    waits = [0] * len(nodes)  # how many items each one waits for
    reads: list[set[UOp]] = []  # the targets each item loads itself
    needs_assign: list[set[int]] = []  # the ASSIGNs each boundary depends on
    for i, u in enumerate(nodes):
        deps, leaves = _kernel_inputs(u, index, targets)
        reads.append(set(leaves))
        needs_assign.append(set())
        for d in deps:
            after[d].append(i)
            waits[i] += 1
            needs_assign[i] |= needs_assign[d]
            if nodes[d].op is Ops.ASSIGN:
                needs_assign[i].add(d)
    readers_first: list[list[int]] = [[] for _ in nodes]  # reader -> the ASSIGNs that wait for it
    reader_waits = [0] * len(nodes)
    for a, u in enumerate(nodes):
        if u.op is Ops.ASSIGN:
            target = u.src[0].base
            for r in range(len(nodes)):
                if r != a and target in reads[r] and a not in needs_assign[r]:
                    readers_first[r].append(a)
                    reader_waits[a] += 1
    ready = [i for i in range(len(nodes)) if not waits[i] and not reader_waits[i]]
    done = [False] * len(nodes)
    out: list[UOp] = []
    while len(out) < len(nodes):
        if ready:
            i = heapq.heappop(ready)
        else:  # ASSIGNs that each read what the other overwrites: the earliest first
            i = min(j for j in range(len(nodes)) if not done[j] and not waits[j])
        if done[i]:
            continue
        done[i] = True
        out.append(nodes[i])
        for j in after[i]:
            waits[j] -= 1
            if not waits[j] and not reader_waits[j]:
                heapq.heappush(ready, j)
        for j in readers_first[i]:
            reader_waits[j] -= 1
            if not waits[j] and not reader_waits[j]:
                heapq.heappush(ready, j)
    return out


def _kernel_inputs(u: UOp, boundaries: dict[UOp, int], targets: set[UOp]) -> tuple[set[int], set[UOp]]:
    """The boundaries (by position) the item of `u` reads, and the ASSIGN targets among the nodes it reads."""
    deps: set[int] = set()
    leaves: set[UOp] = set()
    seen: set[UOp] = set()
    stack = list(u.src)
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        if x in targets:
            leaves.add(x)
        if (d := boundaries.get(x)) is not None:
            deps.add(d)
        else:
            stack.extend(x.src)
    return deps, leaves


# kept importable from here: buffer identity lives in xgrad.buffer, views and index lowering in xgrad.engine.indexing
__all__ = [
    "ScheduleCtx",
    "ScheduleItem",
    "ScheduleStats",
    "buffer_of",
    "buffer_view",
    "contiguous_range",
    "create_schedule",
    "is_realized",
    "kernel_order",
    "new_buffer_uop",
]
