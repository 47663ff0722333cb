"""The realize engine: schedule a set of tensors, compile each kernel on its device, run the list.

IR in: tensor-graph UOps of the tensors to realize. Out: filled buffers; each tensor's uop becomes a view of its
buffer, and every later graph that reaches the same node reads that buffer instead of recomputing it.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from xgrad.buffer import Buffer, new_buffer_uop
from xgrad.device import Device
from xgrad.dtype import DType, dtypes
from xgrad.engine.capture import capturing, record
from xgrad.engine.indexing import contiguous_range, range_view
from xgrad.engine.memory import plan_memory
from xgrad.engine.multi import schedule_multi
from xgrad.engine.schedule import ScheduleItem
from xgrad.engine.schedule_cache import GraphScan, cached_schedule, scan_graph
from xgrad.errors import DeviceError
from xgrad.helpers import DEBUG, GlobalCounters, KeyedRef  # GlobalCounters: also imported from here
from xgrad.uop.ops import Ops, UOp
from xgrad.uop.pattern import substitute
from xgrad.uop.symshape import rebind, unbind_graph

if TYPE_CHECKING:
    from xgrad.tensor import Tensor


class LiveSet:
    """Objects held weakly and told apart by identity (a WeakSet compares members with ==, which Tensor overloads
    elementwise). Adding and forgetting a member costs ~0.6 us (with a `functools.partial` callback per member:
    ~1.1 us); every Tensor joins one or two sets."""

    def __init__(self, on_forget: Callable[[int], None] | None = None, watched: dict[int, Any] | None = None) -> None:
        """`on_forget(id)`: called when a member whose id is a key of `watched` dies, e.g. to drop what is kept for it
        (the check is inline: most members die unwatched, and a call per death would cost ~0.1 us)."""
        refs: dict[int, KeyedRef[Any]] = {}

        def forget(ref: KeyedRef[Any]) -> None:  # closes over the dict, not the set: no reference cycle
            if refs.get(ref.key) is ref:
                del refs[ref.key]
                if watched is not None and ref.key in watched and on_forget is not None:
                    on_forget(ref.key)

        self._refs = refs
        self._forget = forget

    def add(self, x: Any) -> None:
        if (key := id(x)) not in self._refs:
            ref = self._refs[key] = KeyedRef(x, self._forget)
            ref.key = key

    def discard(self, x: Any) -> None:
        self._refs.pop(id(x), None)

    def __contains__(self, x: Any) -> bool:
        return id(x) in self._refs

    def members(self) -> list[Any]:
        """The live members now (a list: the caller may add and discard while going through it)."""
        return [x for ref in list(self._refs.values()) if (x := ref()) is not None]


_recent: list[tuple[UOp, GraphScan]] = []  # the SINKs the latest realize scanned (at most two), with their scans

# the input buffers of the kept graphs and the live tensors holding them: id(tensor) -> the inputs it holds (its node
# is a view of one, or its lazy graph reads it), and input -> how many of those tensors hold it. When one input has no
# holder left, the kept nodes that read it go (`_prune_kept`): kept, they would hold a buffer no tensor refers to (a
# loader's 178 MB copy, dropped after packing, stayed allocated until the next realize)
_holders_of: dict[int, tuple[UOp, ...]] = {}
_holder_count: dict[UOp, int] = {}
_watch_due = False  # the kept graphs changed, or a tensor holding their inputs was pointed elsewhere: count again
# what is left of the kept graphs after a prune: their nodes that read no dropped buffer, sources first. A training
# loop drops each step's batch, and the step after still finds the nodes that do not depend on it (weight views,
# optimizer constants) in the UOp cache: ~35 of ~130 a step for a small MLP with Adam
_survivors: list[UOp] = []

# the walks of live lazy tensors' nodes by id(tensor), as (node, walk): each realize keeps those of the tensors that
# stay lazy with the same node, so a realize does not walk every other lazy graph again (300 lazy parameters realized
# one by one: 0.5 s with the walks kept, 9.7 s without); a tensor's entry goes when it dies (a walk cached on the node
# itself would hold the graph until the cyclic GC, see `UOp.walk`)
_lazy_walks: dict[int, tuple[UOp, dict[UOp, None]]] = {}


def _prune_kept(
    dropped: list[UOp],
    recent: list[tuple[UOp, GraphScan]] = _recent,
    survivors: list[UOp] = _survivors,
    count: dict[UOp, int] = _holder_count,
) -> None:
    """Keep only the nodes of the kept graphs that read none of the `dropped` buffers: the SINKs go (their walks hold
    them in a cycle: dropped first, see `UOp.walk`), the nodes that do not depend on `dropped` stay in `_survivors`.
    The tables are bound as defaults: tensors die while the interpreter clears this module's globals."""
    dead = set(dropped)
    order = dict.fromkeys(itertools.chain.from_iterable(sink.walk() for sink, _ in recent) if recent else survivors)
    keep = []
    for n in order:  # sources before users
        if n in dead:
            continue
        for s in n.src:
            if s in dead:
                dead.add(n)
                break
        else:
            keep.append(n)
    for sink, _ in recent:
        sink.drop_walk()
    recent.clear()
    survivors[:] = keep
    for b in dropped:
        count.pop(b, None)


def _tensor_dropped(
    key: int,
    holders_of: dict[int, tuple[UOp, ...]] = _holders_of,
    count: dict[UOp, int] = _holder_count,
    prune: Callable[[list[UOp]], None] = _prune_kept,
) -> None:
    """A tensor died: the inputs of the kept graphs it was the last holder of go, with the kept nodes that read them."""
    held = holders_of.pop(key, None)
    if held is None:
        return
    dropped = []
    for b in held:
        left = count.get(b)
        if left is None:  # pruned already
            continue
        count[b] = left - 1
        if left == 1:
            dropped.append(b)
    if dropped:
        prune(dropped)


def _lazy_dropped(key: int, walks: dict[int, tuple[UOp, dict[UOp, None]]] = _lazy_walks) -> None:
    walks.pop(key, None)


# every live Tensor (backward looks for the ones in a graph)
all_tensors = LiveSet(_tensor_dropped, _holders_of)
# the live Tensors whose node may be more than a realized buffer: after a realize, each one whose graph contains a
# computed node reads its buffer instead. Tensor adds itself whenever its node is set to one that is not a
# `plain_buffer`; a realize drops those, so it never walks the (many) realized parameters and data
lazy_tensors = LiveSet(_lazy_dropped, _lazy_walks)


def _scan(sink: UOp, smaller: tuple[UOp, GraphScan] | None = None) -> GraphScan:
    """The scan of `sink`: the latest realize's when it scanned this very (hash-consed) SINK, else a new one (from
    `smaller`'s, a SINK of `sink`'s first sources, when given: see `scan_graph`)."""
    for kept, scan in _recent:
        if kept is sink:
            return scan
    return scan_graph(sink, smaller)


def _keep_recent(scanned: list[tuple[UOp, GraphScan]]) -> None:
    """Keep the graphs of the latest realize (with their cached walks) and their scans until the next one: the SINK
    of the tensors asked for and, when it assigns, the larger one with the lazy tensors that read the assigned buffers
    (see `_readers_of_assigned`). A loop that builds the same graph again then finds its nodes in the UOp cache
    instead of building and sizing them anew, and gets the same (hash-consed) SINKs, whose scans it reuses instead of
    walking the graph again: a cached 64x64 matmul realize costs ~295K instructions, ~640K without the kept graph;
    the kept scan saves ~35 of ~315 us per call after a big kernel has left the walk's memory cold, and both scans of
    a small MLP's optimizer step ~1 of ~5 ms. The ones before drop their walks (see `UOp.walk`), without the cyclic
    GC (a loop over 16 MB inputs grew the process by over 400 MB before). Only nodes that could be built again are
    worth keeping: those that read a buffer no live tensor holds go (`_watch_kept_inputs`, `_prune_kept`)."""
    same = len(scanned) == len(_recent)
    for (sink, _), (kept, _) in zip(scanned, _recent):  # a loop, not all(...): this runs on every cached realize
        same = same and sink is kept
    if same:
        _recent[:] = scanned  # the same graphs (a loop's cached realize): their holders are counted already
        return
    keep = {id(sink) for sink, _ in scanned}
    for sink, _ in _recent:
        if id(sink) not in keep:
            sink.drop_walk()
    _recent[:] = scanned
    _survivors.clear()
    global _watch_due
    _holders_of.clear()
    _holder_count.clear()
    _watch_due = True


def _watch_kept_inputs() -> None:
    """Find the live tensors that hold each input buffer of the kept graphs (see `_holders_of`); the inputs that have
    none (the tensors just realized were the only ones reading them, as in `Tensor(array).contiguous().realize()`) go
    now, with the kept nodes that read them. Runs when the kept graphs change, not on a loop's cached realize of the
    same graph: one pass over the live tensors."""
    global _watch_due
    _watch_due = False
    _holders_of.clear()
    _holder_count.clear()
    if _recent:
        count = {b: 0 for _, scan in _recent for b in scan.inputs}
    else:
        count = {n: 0 for n in _survivors if n.op is Ops.BUFFER}
    if not count:
        return
    holders: dict[int, tuple[UOp, ...]] = {}
    for t in all_tensors.members():
        base = t.uop.base
        if base.op is Ops.BUFFER:
            held: tuple[UOp, ...] = (base,) if base in count else ()
        else:  # a lazy graph: its walk is kept for the realizes to come (see `lazy_walk`)
            walk = lazy_walk(t)
            held = tuple(b for b in count if b in walk)
        if held:
            holders[id(t)] = held
            for b in held:
                count[b] += 1
    _holders_of.update(holders)
    _holder_count.update(count)
    if dropped := [b for b, n in count.items() if n == 0]:
        _prune_kept(dropped)


def lazy_walk(t: Tensor) -> dict[UOp, None]:
    """The walk of a live lazy tensor's node, kept by tensor (see `_lazy_walks`)."""
    u = t.uop
    walked = _lazy_walks.get(id(t))
    if walked is None or walked[0] is not u:
        walked = _lazy_walks[id(t)] = (u, u.walk())
    return walked[1]


# ---- assigns into views ----
# base BUFFER -> the tensor holding a pending ASSIGN into a view of it (`x[1:3].assign(v)`, not realized yet). As in
# tinygrad, the write belongs to the buffer: realizing anything that reads the buffer (reading `x`) runs it first.
_view_assigns: dict[UOp, Tensor] = {}


def note_view_assign(t: Tensor) -> None:
    """Record `t` (its uop an ASSIGN into a view of a buffer). An earlier pending assign into the same buffer runs
    first, so writes to one buffer keep their program order."""
    buf = t.uop.src[0].base
    earlier = _view_assigns.pop(buf, None)
    if earlier is not None and earlier.uop.op is Ops.ASSIGN:
        realize_tensors([earlier])
    _view_assigns[buf] = t


def _flush_view_assigns(tensors: list[Tensor]) -> None:
    """Run the pending view assigns (those not among `tensors` themselves) before `tensors` are scheduled: every one,
    or during a TinyJit capture those into buffers that `tensors` read."""
    chosen = {id(t) for t in tensors}
    for buf, t in list(_view_assigns.items()):
        if t.uop.op is not Ops.ASSIGN or id(t) in chosen:  # realized already, or now with the others
            del _view_assigns[buf]
    if not _view_assigns:
        return
    if capturing():  # inside a TinyJit capture only what the captured function reads joins the capture
        due = [
            _view_assigns.pop(buf)
            for buf in list(_view_assigns)
            if any(t.uop.base is buf or buf in lazy_walk(t) for t in tensors)
        ]
    else:  # all of them: a write nothing reads again must not keep its tensor (and buffer) alive
        due = list(_view_assigns.values())
        _view_assigns.clear()
    if due:  # the tensors reading the buffer see the write (tinygrad's): they are not computed before it
        items, var_vals = schedule_tensors(due, readers_first=False)
        if items:
            run_schedule(items, var_vals)


def realize_base(t: Tensor) -> None:
    """Make `t` a view of a buffer without a kernel on its own device (DISK runs none): the tensors that stand for its
    base node are realized (a copy onto DISK), and every lazy view of that node, `t` among them, then reads it."""
    base = t.uop.base
    if base.op is Ops.BUFFER:
        return
    owners = [o for o in lazy_tensors.members() if o.uop is base]
    realize_tensors(owners or [type(t)(base)])


def view_memory(u: UOp) -> Buffer:
    """The memory that the realized view `u` covers, as a Buffer sharing it: a view must be one contiguous run of its
    buffer (devices that run no kernels, like DISK, are read and written this way, without a kernel)."""
    if contiguous_range(u) is None:
        raise DeviceError(
            f"a non-contiguous view is not supported on {u.device}, which runs no kernels; copy the whole tensor "
            "to a compute device first (t.to('CPU')) and index it there"
        )
    return range_view(u)


def reinterpret_memory(u: UOp, dtype: DType) -> UOp:
    """A BUFFER node of `dtype` over the same bytes as the realized contiguous view `u` (a bitcast on DISK, which
    runs no kernels: the new items are read and written in place)."""
    mem = view_memory(u)
    root = mem.base if mem.base is not None else mem
    count = mem.nbytes // dtype.itemsize
    out = new_buffer_uop(root.device, count, dtype)
    out.__dict__["buffer"] = Buffer(root.device, count, dtype, base=root, offset=mem.offset)  # the same bytes
    return out


def realize_tensors(tensors: list[Tensor]) -> None:
    items, var_vals = schedule_tensors(tensors)
    if items:
        run_schedule(items, var_vals)


def schedule_tensors(tensors: list[Tensor], readers_first: bool = True) -> tuple[list[ScheduleItem], dict[str, int]]:
    """The steps that compute `tensors` (memory planned, ready for `run_schedule`) and the bound variables' values.
    Every tensor the steps compute points at its buffer when this returns, so the steps must then be run (what
    `realize` does; `Tensor.linear_with_vars` hands them to the caller, as tinygrad's does). With `readers_first`,
    live lazy tensors that read a buffer an assign here overwrites are computed first, from the old values."""
    if _view_assigns:
        _flush_view_assigns(tensors)
    pending = [t for t in tensors if t.uop.base.op is not Ops.BUFFER or t.uop.op is Ops.ASSIGN]
    if not pending:
        return [], {}
    roots = list(dict.fromkeys(t.uop for t in pending))
    # held for the whole call: the passes below each build this (hash-consed) SINK and reuse its cached toposort
    whole = UOp(Ops.SINK, dtypes.void, tuple(roots))
    scanned = [(whole, _scan(whole))]
    if readers_first and scanned[0][1].assigns and (readers := _readers_of_assigned(pending)):
        pending += readers
        roots = list(dict.fromkeys(t.uop for t in pending))
        whole = UOp(Ops.SINK, dtypes.void, tuple(roots))
        scanned.append((whole, _scan(whole, scanned[0])))  # (the roots' scan is the start of this one)
    scan = scanned[-1][1]
    # bound variables leave the graph (their values go to the kernels at launch): one schedule, one compiled kernel
    unbound, var_vals = unbind_graph(roots) if scan.symbolic else (roots, {})
    whole_unbound = UOp(Ops.SINK, dtypes.void, tuple(unbound)) if scan.symbolic else whole
    if scan.multi:  # lowered to per-device graphs first
        items, becomes, outputs = schedule_multi(unbound, cached_schedule)
    else:  # the scan is the schedule cache's key, unless unbinding made a new graph
        items, becomes = cached_schedule(unbound, None if scan.symbolic else scan)
        outputs = [becomes[r] for r in unbound if r in becomes]
    planned = plan_memory(items, outputs)
    # every ASSIGN in the graph runs, roots or not (`(t * 2).realize()` runs t's pending assign): the tensors holding
    # or reading one that is not a root must read its target after this, or their next realize runs it again
    inner = [u for u in whole.walk() if u.op is Ops.ASSIGN and u not in whole.src] if scan.assigns else []
    _keep_recent(scanned)
    if whole_unbound is not whole:
        whole_unbound.drop_walk()
    del whole, whole_unbound, scanned
    if var_vals:  # the realized views show the bound values again
        becomes = {r: rebind(becomes[u], var_vals) for r, u in zip(roots, unbound) if u in becomes}
    ran = set(inner)
    for a in inner:
        becomes[a] = a.src[0]
    chosen = {id(t) for t in pending}
    kept: dict[int, tuple[UOp, dict[UOp, None]]] = {}
    global _watch_due
    for t in lazy_tensors.members():
        u = t.uop
        if (new := becomes.get(u)) is not None:
            # another tensor with an identical (hash-consed) graph stays lazy: sharing the buffer would let a later
            # assign to one tensor change the other
            if id(t) in chosen or u in ran:  # an assign that ran is the buffer it wrote, for every holder
                t.uop = new
        # a view of a buffer holds no computed node: no walk needed
        elif u.base.op is not Ops.BUFFER and not lazy_walk(t).keys().isdisjoint(becomes):
            t.uop = substitute(u, becomes)
            u.drop_walk()  # substitute walked it
        if t.uop is not u and id(t) in _holders_of:  # it may no longer read what it held
            _watch_due = True
        if t.uop.plain_buffer:
            lazy_tensors.discard(t)
        elif (walked := _lazy_walks.get(id(t))) is not None and walked[0] is t.uop:
            kept[id(t)] = walked
    _lazy_walks.clear()
    _lazy_walks.update(kept)
    if _watch_due:
        _watch_kept_inputs()
    return planned, var_vals


class Linear:
    """tinygrad's LINEAR: the ordered steps (kernels and copies) that realize some tensors; `src` holds them, and
    `run_linear(linear, var_vals)` runs them."""

    def __init__(self, items: list[ScheduleItem]):
        self.items = items

    @property
    def src(self) -> tuple[ScheduleItem, ...]:
        return tuple(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __repr__(self) -> str:
        kernels = sum(i.is_kernel for i in self.items)
        return f"<Linear {len(self.items)} steps: {kernels} kernels, {len(self.items) - kernels} copies>"


def run_linear(linear: Linear, var_vals: dict[str, int] | None = None) -> None:
    """Run the steps of `Tensor.linear_with_vars` / `Tensor.schedule_linear` (once: a second run recomputes)."""
    run_schedule(linear.items, var_vals)


def _readers_of_assigned(pending: list[Tensor]) -> list[Tensor]:
    """Live lazy tensors that read a buffer this realize assigns to: they must read the value from before the assign,
    so they are computed in the same schedule (which runs them before the assign)."""
    sink = UOp(Ops.SINK, src=tuple(t.uop for t in pending))
    targets = {u.src[0].base for u in sink.walk() if u.op is Ops.ASSIGN}
    if not targets:
        return []
    chosen = {id(t) for t in pending}
    readers = []
    for t in lazy_tensors.members():
        if id(t) in chosen or (t.uop.base.op is Ops.BUFFER and t.uop.op is not Ops.ASSIGN):
            continue
        topo = lazy_walk(t)
        if any(b in topo for b in targets) and all(_clone_assign(u, t) for u in topo if u.op is Ops.ASSIGN):
            readers.append(t)
    return readers


def _clone_assign(u: UOp, t: Tensor) -> bool:
    """Whether ASSIGN `u` is `t`'s own write into a buffer nothing holds yet (what `clone()` builds): computing it
    with the readers runs no other pending assign early."""
    buf = u.src[0].base.__dict__.get("buffer")  # None for a multi-device buffer: clone() makes none of those
    return u is t.uop and buf is not None and not buf.is_allocated


def run_schedule(items: list[ScheduleItem], var_vals: dict[str, int] | None = None) -> None:
    vals = var_vals or {}
    record(items, vals)  # a TinyJit capturing right now keeps what runs
    if DEBUG >= 1 and items:
        kernels = sum(it.is_kernel for it in items)
        print(f"*** realize: {kernels} kernel{'s' if kernels != 1 else ''}, {len(items) - kernels} copies")
    if len(items) > 1:
        compile_ahead(items)
    for item in items:
        if item.is_kernel:
            run_kernel(item, vals)
        else:
            run_transfer(item, *item.bufs)


def compile_ahead(items: list[ScheduleItem]) -> None:
    """Let each device build the kernels it is about to run all at once, where it can (the optional
    `RuntimeDevice.compile_ahead`: a schedule's cold kernels compile in parallel rather than one per launch)."""
    by_device: dict[str, list[UOp]] = {}
    for item in items:
        if item.is_kernel:
            by_device.setdefault(item.device, []).append(item.ast)
    for device, asts in by_device.items():
        if len(asts) > 1 and (ahead := getattr(Device[device], "compile_ahead", None)) is not None:
            ahead(asts)


def run_transfer(item: ScheduleItem, dst: Buffer, *srcs: Buffer) -> None:
    """Run a copy from `srcs[0]`, or a collective across processes from `srcs` (its arg runs it:
    `xgrad.distributed`), into `dst` (the item's buffers, or a TinyJit replay's)."""
    if item.ast.op is Ops.COLLECTIVE:
        item.ast.arg.run(dst.ensure_allocated(), *srcs)
        GlobalCounters.global_mem += dst.nbytes
        return
    src = srcs[0]
    dst.copyin(src.as_bytes())
    if (read_done := getattr(src.allocator, "read_done", None)) is not None:  # optional: DISK drops pages
        read_done(src.handle)
    GlobalCounters.global_mem += dst.nbytes


def run_kernel(item: ScheduleItem, vals: dict[str, int]) -> Any:
    program = Device[item.device].compile(item.ast)
    info = program.info
    GlobalCounters.kernel_count += 1
    GlobalCounters.global_ops += info.ops
    GlobalCounters.global_mem += info.mem
    handles = [b.handle for b in item.bufs]
    if DEBUG.value < 2:  # the hot path: launch and go on
        return program(handles, vals, wait=False)
    start = time.perf_counter()
    elapsed = program(handles, vals, wait=True)
    et = elapsed if elapsed is not None else time.perf_counter() - start
    GlobalCounters.time_sum_s += et
    gflops = info.ops / et * 1e-9 if et > 0 else 0.0
    gbs = info.mem / et * 1e-9 if et > 0 else 0.0
    print(
        f"{GlobalCounters.kernel_count:4d} {item.device:8s} {info.name:32s} {et * 1e6:9.2f} us "
        f"{gflops:8.2f} GFLOPS {gbs:8.2f} GB/s"
    )
    return elapsed
