"""Linearization: a kernel graph with RANGEs and REDUCEs becomes a list of UOps in execution order with explicit loops.

IR in: SINK of STOREs whose values may hold REDUCE(value, *ranges). IR out: a linear program (see xgrad.uop.ops):
REDUCE is replaced by DEFINE_ACC (before its loops) and ASSIGN_ACC (inside); every RANGE gets an END. While ordering,
reads after a loop go through NOOP(acc, END) and END carries the loop body as extra sources; both are dropped once
the order is fixed.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

from xgrad.dtype import DType, dtypes
from xgrad.uop.ops import AxisType, Ops, UOp
from xgrad.uop.pattern import PatternMatcher, UPat, graph_rewrite, substitute
from xgrad_codegen.pack import is_scratch

_KIND_ORDER = {
    AxisType.GLOBAL: 0,
    AxisType.LOCAL: 1,
    AxisType.LOOP: 2,
    AxisType.GROUP: 3,
    AxisType.REDUCE: 4,
    AxisType.UPCAST: 5,
    AxisType.UNROLL: 6,
}


def identity_element(op: Ops, dtype: DType) -> UOp:
    if op is Ops.ADD:
        return UOp.const(dtype, 0)
    if op is Ops.MUL:
        return UOp.const(dtype, 1)
    return UOp.const(dtype, dtypes.min(dtype.scalar()))


@dataclass
class AccCtx:
    counter: itertools.count[int] = field(default_factory=itertools.count)
    context: dict[UOp, frozenset[UOp]] = field(default_factory=dict)  # REDUCE -> the loops around its use
    loops: dict[UOp, frozenset[UOp]] = field(default_factory=dict)  # DEFINE_ACC / ASSIGN_ACC -> their exact loops
    free: dict[UOp, frozenset[UOp]] = field(default_factory=dict)  # free_ranges of the nodes seen so far


def _chain_terms(value: UOp, op: Ops) -> list[UOp]:
    """The terms of a left-deep chain op(op(t0, t1), t2) ... (what an UNROLL makes), in order; [value] if none."""
    terms = []
    while value.op is op and len(value.src) == 2:
        terms.append(value.src[1])
        value = value.src[0]
    terms.append(value)
    return terms[::-1]


def _accumulate(op: Ops, step: UOp, term: UOp) -> UOp:
    """op(step, term); a sum of WMMA(a, b, 0) terms accumulates in the instruction itself: WMMA(a, b, step)."""
    c = term.src[2] if term.op is Ops.WMMA else None
    if op is Ops.ADD and c is not None and c.op is Ops.CONST and c.arg == 0:
        return term.replace(src=(term.src[0], term.src[1], step))
    return UOp(op, step.dtype, (step, term))


def lower_reduce(ctx: AccCtx, red: UOp) -> UOp:
    """REDUCE -> an accumulator defined in the loops around the reduction's use, updated inside its own loops."""
    value, ranges = red.src[0], sorted(red.src[1:], key=lambda r: (_KIND_ORDER[r.arg[1]], r.arg[0]))
    acc = UOp(Ops.DEFINE_ACC, red.dtype, (identity_element(red.arg, red.dtype),), next(ctx.counter))
    outer = ctx.context.get(red, frozenset()) | (free_ranges(value, ctx.free) - set(ranges))
    # each term of an unrolled chain is its own update of the register: acc = acc + t0; acc = acc + t1; ... so a
    # term's operands die once it is added (a conv's 9 window taps need not all be live at once), and the updates of
    # several accumulators can interleave (see `program_order`)
    step: UOp = acc
    for term in _chain_terms(value, red.arg):
        combined = _accumulate(red.arg, step, term)
        step = UOp(Ops.ASSIGN_ACC, red.dtype, (acc, combined))
        ctx.loops[combined] = ctx.loops[step] = outer | set(ranges)  # in every reduce loop, as the register is read
    ctx.loops[acc] = outer
    for rng in reversed(ranges):
        step = UOp(Ops.END, dtypes.void, (rng, step))
    return UOp(Ops.NOOP, red.dtype, (acc, step))


def free_ranges(u: UOp, free: dict[UOp, frozenset[UOp]] | None = None) -> frozenset[UOp]:
    """The RANGEs `u` depends on that no REDUCE inside it binds. `free` (node -> its answer) is read and filled: share
    it between calls on one graph."""
    free = {} if free is None else free
    for x in u.toposort:
        if x in free:
            continue
        inner = frozenset().union(*(free[s] for s in x.src)) if x.src else frozenset()
        free[x] = inner | {x} if x.op is Ops.RANGE else inner - set(x.src[1:]) if x.op is Ops.REDUCE else inner
    return free[u]


def reduce_contexts(sink: UOp) -> dict[UOp, frozenset[UOp]]:
    """For every REDUCE, the loops its result is used in: the store's output loops, plus the loops of every
    reduction it sits inside (its accumulator must be reset in each of their iterations)."""
    context: dict[UOp, frozenset[UOp]] = {}
    free: dict[UOp, frozenset[UOp]] = {}
    for st in sink.src:
        context[st] = free_ranges(st, free)
    for x in reversed(list(sink.toposort)):
        here = context.get(x, frozenset())
        inner = here | set(x.src[1:]) if x.op is Ops.REDUCE else here
        # NOOP(value, *after): `after` only orders (a group reduction's shared memory is read after its BARRIER); a
        # REDUCE reached through it is computed before, not inside the loops of the reduction that reads the value
        for s in x.src[:1] if x.op is Ops.NOOP else x.src:
            context[s] = context.get(s, frozenset()) | inner
    return {x: c for x, c in context.items() if x.op is Ops.REDUCE}


pm_lower_reduce = PatternMatcher(
    [
        (UPat(Ops.REDUCE, name="red"), lower_reduce),
    ]
)


def close_output_loops(sink: UOp) -> UOp:
    """Wrap the STOREs in ENDs of the output loops they run in (innermost first); stores in the same loops share
    one END per loop."""
    groups: dict[tuple[UOp, ...], list[UOp]] = {}
    rs: dict[UOp, frozenset[UOp]] = {}
    for st in sink.src:
        rngs = tuple(sorted(_open_ranges_of(st, rs), key=lambda r: (_KIND_ORDER[r.arg[1]], r.arg[0])))
        groups.setdefault(rngs, []).append(st)
    ends: list[UOp] = []
    for rngs, stores in groups.items():
        body: tuple[UOp, ...] = tuple(stores)
        for rng in reversed(rngs):
            body = (UOp(Ops.END, dtypes.void, (rng, *body)),)
        ends.extend(body)
    return merge_ends(sink.replace(src=tuple(ends)))


def merge_ends(sink: UOp) -> UOp:
    """Loops over the same RANGE are one loop: lanes of an upcast reduction share their reduce loop."""
    while True:
        by_range: dict[UOp, list[UOp]] = {}
        for u in sink.toposort:
            if u.op is Ops.END:
                by_range.setdefault(u.src[0], []).append(u)
        dup = next((ends for ends in by_range.values() if len(ends) > 1), None)
        if dup is None:
            return sink
        merged = UOp(Ops.END, dtypes.void, (dup[0].src[0], *dict.fromkeys(d for e in dup for d in e.src[1:])))
        sink = substitute(sink, {e: merged for e in dup})


def _fills_scratch(u: UOp) -> bool:
    """A STORE into a scratch buffer (a PACKed panel)."""
    return u.op is Ops.STORE and is_scratch(u.src[0].src[0])


def order_scratch_reads(sink: UOp) -> UOp:
    """A read of a scratch buffer (see xgrad_codegen.pack) waits for the loops that fill it: the INDEX of every scratch
    LOAD takes its PARAM through NOOP(param, *the outermost ENDs of the fill loops)."""
    fill_ranges: dict[UOp, set[UOp]] = {}
    for u in sink.toposort:
        if _fills_scratch(u):
            rngs = {x for x in u.src[0].src[1].toposort if x.op is Ops.RANGE}
            fill_ranges.setdefault(u.src[0].src[0], set()).update(rngs)
    if not fill_ranges:
        return sink
    store_indexes = {u.src[0] for u in sink.toposort if u.op is Ops.STORE}
    mapping: dict[UOp, UOp] = {}
    for param, rngs in fill_ranges.items():
        ends = [u for u in sink.toposort if u.op is Ops.END and u.src[0] in rngs]
        outermost = [e for e in ends if not any(e is not o and e in o.toposort for o in ends)]
        after_fill = UOp(Ops.NOOP, param.dtype, (param, *outermost))
        for u in sink.toposort:
            if u.op is Ops.INDEX and u.src[0] is param and u not in store_indexes:
                mapping[u] = u.replace(src=(after_fill, *u.src[1:]))
    return substitute(sink, mapping)


def _open_ranges_of(u: UOp, rs: dict[UOp, frozenset[UOp]]) -> set[UOp]:
    for x in u.toposort:
        if x not in rs:
            rs[x] = _range_set(x, rs, {})
    return set(rs[u])


def _range_set(x: UOp, rs: dict[UOp, frozenset[UOp]], fixed: dict[UOp, frozenset[UOp]]) -> frozenset[UOp]:
    if x in fixed:
        return fixed[x]
    out: frozenset[UOp] = frozenset().union(*(rs[s] for s in x.src)) if x.src else frozenset()
    if x.op is Ops.RANGE:
        return out | {x}
    if x.op is Ops.END:
        return out - {x.src[0]}
    return out


_EXACT_LOOPS = (Ops.DEFINE_ACC, Ops.ASSIGN_ACC, Ops.STORE, Ops.BARRIER)  # a BARRIER runs exactly where its sources do


class _Ready:
    """The nodes whose sources are all placed, grouped so that choosing the next one does not scan them all: loop
    bodies by their range set (a heap each, ordered like the program should read), RANGEs, ENDs by their RANGE."""

    def __init__(self, rs: dict[UOp, frozenset[UOp]], position: dict[UOp, int]):
        self.rs, self.position = rs, position
        self.inside: dict[frozenset[UOp], list[tuple[bool, int, UOp]]] = {}  # runs where its ranges are all open
        self.exact: dict[frozenset[UOp], list[tuple[bool, int, UOp]]] = {}  # runs in exactly its ranges
        self.ranges: set[UOp] = set()
        self.ends: dict[UOp, UOp] = {}
        self.sink: UOp | None = None
        self.count = 0

    def __bool__(self) -> bool:
        return self.count > 0

    def add(self, u: UOp) -> None:
        self.count += 1
        if u.op is Ops.RANGE:
            self.ranges.add(u)
        elif u.op is Ops.END:
            self.ends[u.src[0]] = u
        elif u.op is Ops.SINK:
            self.sink = u
        else:
            groups = self.exact if u.op in _EXACT_LOOPS else self.inside
            heapq.heappush(groups.setdefault(self.rs[u], []), (u.op is not Ops.DEFINE_ACC, self.position[u], u))

    def take(self, u: UOp) -> None:
        """Remove a ready RANGE, END or SINK."""
        self.count -= 1
        if u.op is Ops.RANGE:
            self.ranges.remove(u)
        elif u.op is Ops.END:
            del self.ends[u.src[0]]
        else:
            self.sink = None

    def pop_body(self, open_set: frozenset[UOp]) -> UOp | None:
        """Remove and return the first loop-body node that can run with `open_set` open (accumulators first, then
        graph order), or None."""
        best: list[tuple[bool, int, UOp]] | None = None
        for loops, heap in self.inside.items():
            if heap and loops <= open_set and (best is None or heap[0][:2] < best[0][:2]):
                best = heap
        exact = self.exact.get(open_set)
        if exact and (best is None or exact[0][:2] < best[0][:2]):
            best = exact
        if best is None:
            return None
        self.count -= 1
        return heapq.heappop(best)[2]

    def all(self) -> list[UOp]:
        body = [u for groups in (self.inside, self.exact) for heap in groups.values() for _, _, u in heap]
        return body + list(self.ranges) + list(self.ends.values()) + ([self.sink] if self.sink is not None else [])


def linearize(sink: UOp) -> list[UOp]:
    """Order the graph into a program: each node inside exactly the loops it needs, loops properly nested."""
    ctx = AccCtx(context=reduce_contexts(sink))
    # bottom_up: a REDUCE is lowered while it is still the node `reduce_contexts` saw
    sink = graph_rewrite(sink, pm_lower_reduce, ctx=ctx, name="lower reduce", bottom_up=True)
    sink = close_output_loops(sink)
    sink = order_scratch_reads(sink)  # packed panels are read only after the loops that fill them
    nodes = program_order(sink)
    position = {u: i for i, u in enumerate(nodes)}
    rs: dict[UOp, frozenset[UOp]] = {}
    for x in nodes:
        rs[x] = _range_set(x, rs, ctx.loops)
    users: dict[UOp, list[UOp]] = {u: [] for u in nodes}
    for u in nodes:
        for s in u.src:
            users[s].append(u)
    waiting = {u: len(set(u.src)) for u in nodes}
    # how many not-yet-emitted nodes still need each range open
    need = {r: 0 for r in nodes if r.op is Ops.RANGE}
    for u in nodes:
        for r in rs[u]:
            if u is not r:
                need[r] += 1
    # the loops a packed panel's fill runs in open before any other: a panel that the parallel loop does not read (a
    # conv's weights with the batch parallel) is filled before that loop, once per call; any other panel's fill reads
    # the parallel loop, which then opens first as before
    fills = {r for u in nodes if _fills_scratch(u) for r in rs[u]}
    ready = _Ready(rs, position)
    for u in nodes:
        if waiting[u] == 0:
            ready.add(u)
    stack: list[UOp] = []
    out: list[UOp] = []

    def emit(u: UOp) -> None:
        out.append(u)
        for r in rs[u]:
            if u is not r:
                need[r] -= 1
        for user in set(users[u]):
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.add(user)

    while ready:
        open_set = frozenset(stack)
        if (first := ready.pop_body(open_set)) is not None:
            emit(first)
            continue
        if stack:
            end = ready.ends.get(stack[-1])
            if end is not None and need[stack[-1]] == 0:
                stack.pop()
                ready.take(end)
                emit(end)
                continue
        opens = [u for u in ready.ranges if rs[u] - {u} <= open_set and need[u] > 0]
        if opens:
            # ranges can share an id (a hoisted gate shortens one reduction's loop, not its twin's): graph order
            # breaks the tie, or the set's order would make the program differ between processes
            rng = min(opens, key=lambda r: (r not in fills, _KIND_ORDER[r.arg[1]], r.arg[0], position[r]))
            stack.append(rng)
            ready.take(rng)
            emit(rng)
            continue
        if not stack and ready.sink is sink:
            ready.take(sink)
            emit(sink)
            break
        raise AssertionError(
            f"linearize is stuck with loops {[r.arg for r in stack]} and ready {[u.op for u in ready.all()]}"
        )
    assert out[-1] is sink and len(out) == len(nodes), "linearize did not place every node"
    return drop_ordering_sources(out)


def program_order(sink: UOp) -> list[UOp]:
    """The order the program should read where dependencies leave a choice: the graph's order, except that the
    updates of accumulators that take several terms per step (an unrolled reduction) interleave, term by term:
    acc0 += t00; acc1 += t10; ...; acc0 += t01; ... A term's operands that the accumulators share (a conv's input
    vector for one window tap) are then live for one step, not the whole unrolled body, and neighbouring additions
    are independent instead of one dependent chain."""
    nodes = sink.toposort
    updates: dict[UOp, list[UOp]] = {}  # accumulator -> its updates in one step, in order
    for u in nodes:
        if u.op is Ops.ASSIGN_ACC:
            updates.setdefault(u.src[0], []).append(u)
    if all(len(steps) < 2 for steps in updates.values()):
        return list(nodes)
    order: dict[UOp, None] = {}
    for k in range(max(len(steps) for steps in updates.values())):
        for steps in updates.values():
            if k < len(steps):
                steps[k].toposort_into(order)
    return list(sink.toposort_into(order))


def drop_ordering_sources(program: list[UOp]) -> list[UOp]:
    """Once ordered, the ordering-only sources go: a NOOP(acc, END) read becomes the acc itself, END keeps only its
    RANGE. Renderers and the executor then see the plain linear program described in xgrad.uop.ops."""
    mapping: dict[UOp, UOp] = {}
    out: list[UOp] = []
    for u in program:
        if u.op is Ops.NOOP:
            mapping[u] = mapping[u.src[0]]
            continue
        src = (mapping[u.src[0]],) if u.op is Ops.END else tuple(mapping[s] for s in u.src)
        new = u.replace(src=src)
        mapping[u] = new
        out.append(new)
    return out
