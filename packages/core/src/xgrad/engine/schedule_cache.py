"""The schedule cache: graphs of the same structure (same ops, shapes, dtypes and devices; other buffers) reuse
the schedule made for the first one, with their own buffers bound in. `SCACHE=0` turns it off.

In: the roots of a tensor graph. Out: what `create_schedule` returns, built from a template when the structure was
seen before. The key is the graph's structure with every BUFFER replaced by a numbered placeholder, and the values of
the knobs declared to change a schedule (`knobs_key(Effect.SCHEDULE)`). Graphs come here
with their bound variables stripped (see `xgrad.uop.symshape`), so different values of one variable hit the same entry.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from xgrad.buffer import Buffer, buffer_of, new_buffer_uop
from xgrad.dtype import DType, dtypes
from xgrad.engine.indexing import buffer_view
from xgrad.engine.multi import devices_of
from xgrad.engine.schedule import ScheduleItem, ScheduleStats, create_schedule
from xgrad.helpers import SCACHE, Effect, knobs_key
from xgrad.uop.ops import Ops, UOp, sint
from xgrad.uop.symshape import tuple_holds_uops

INPUT, NEW, VIEW = 0, 1, 2
SCHEDULE_KNOBS = Effect.SCHEDULE  # a module global: reading an Enum member off its class costs ~100 ns
Slot = tuple[int, int]  # (INPUT | NEW | VIEW, index among inputs / new buffers / views)


@dataclass(frozen=True)
class ScheduleTemplate:
    items: tuple[tuple[UOp, tuple[Slot, ...], str], ...]  # (ast, buffer slots, device) per item
    new_buffers: tuple[tuple[str, int, DType], ...]  # (device, size, dtype) of each buffer the schedule creates
    views: tuple[tuple[Slot, int, int, DType], ...]  # (base, byte offset, size, dtype): a copy reading part of a buffer
    becomes: tuple[tuple[int, Slot, tuple[sint, ...]] | tuple[int, None, None], ...]  # root index -> buffer view


_cache: dict[tuple[tuple[Any, ...], str], ScheduleTemplate] = {}  # (graph structure, knobs); see scan_graph


def _make_template(
    roots: list[UOp], inputs: list[UOp], items: list[ScheduleItem], becomes: dict[UOp, UOp]
) -> ScheduleTemplate:
    slots: dict[int, Slot] = {id(buffer_of(b)): (INPUT, i) for i, b in enumerate(inputs)}
    new: list[Buffer] = []
    views: list[tuple[Slot, int, int, DType]] = []
    for it in items:
        for b in it.bufs:
            if id(b) in slots:
                continue
            if b.base is not None and id(b.base) in slots:  # a view of a buffer of this schedule, not a new buffer
                slots[id(b)] = (VIEW, len(views))
                views.append((slots[id(b.base)], b.offset, b.size, b.dtype))
            else:
                slots[id(b)] = (NEW, len(new))
                new.append(b)
    item_tpl = tuple((it.ast, tuple(slots[id(b)] for b in it.bufs), it.device) for it in items)
    becomes_tpl: list[tuple[int, Slot, tuple[sint, ...]] | tuple[int, None, None]] = []
    for i, r in enumerate(roots):
        if r not in becomes:
            continue
        if r.op is Ops.ASSIGN:
            becomes_tpl.append((i, None, None))
        else:
            view = becomes[r]
            becomes_tpl.append((i, slots[id(buffer_of(view))], tuple(view.shape or ())))
    return ScheduleTemplate(item_tpl, tuple((b.device, b.size, b.dtype) for b in new), tuple(views), tuple(becomes_tpl))


def _instantiate(
    tpl: ScheduleTemplate, roots: list[UOp], inputs: list[UOp]
) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
    # no nested (and recursive) functions here: a closure cycle would hold the fresh buffers until the cyclic GC runs,
    # so the allocator could not reuse their memory for the next call
    fresh = [new_buffer_uop(dev, size, dt) for dev, size, dt in tpl.new_buffers]
    items = [
        ScheduleItem(ast, tuple(_slot_buffer(tpl, s, inputs, fresh) for s in slots), dev)
        for ast, slots, dev in tpl.items
    ]
    becomes: dict[UOp, UOp] = {}
    for i, slot, shape in tpl.becomes:
        root = roots[i]
        becomes[root] = (
            root.src[0] if slot is None or shape is None else buffer_view(_slot_uop(slot, inputs, fresh), shape)
        )
    return items, becomes


def _slot_uop(slot: Slot, inputs: list[UOp], fresh: list[UOp]) -> UOp:
    return inputs[slot[1]] if slot[0] == INPUT else fresh[slot[1]]


def _slot_buffer(tpl: ScheduleTemplate, slot: Slot, inputs: list[UOp], fresh: list[UOp]) -> Buffer:
    if slot[0] != VIEW:
        return buffer_of(_slot_uop(slot, inputs, fresh))
    base_slot, offset, size, dtype = tpl.views[slot[1]]
    base = _slot_buffer(tpl, base_slot, inputs, fresh)
    return Buffer(base.device, size, dtype, base=base, offset=offset)


class GraphScan(NamedTuple):
    """One walk over a graph (`scan_graph`): its schedule-cache key, its input BUFFERs in order, and what it holds
    that a plain realize does not handle. A plain graph (none of the three) schedules straight from its scan."""

    rows: tuple[tuple[Any, ...], ...]  # the key: every node as (op, dtype, positions of its sources, arg, ...)
    inputs: list[UOp]
    assigns: bool  # an ASSIGN
    symbolic: bool  # a symbolic size (bound variables), as `unbind_graph` finds them
    multi: bool  # a node on a device tuple

    @property
    def plain(self) -> bool:
        return not (self.assigns or self.symbolic or self.multi)


def scan_graph(sink: UOp, smaller: tuple[UOp, GraphScan] | None = None) -> GraphScan:
    """The scan of the graph under `sink`. The key lists every node as (op, dtype, positions of its sources, arg,
    type of arg), with the k-th BUFFER as a placeholder (k, size): equal keys are graphs that differ only in which
    buffers they read. Args are told apart like the UOp cache does (1, 1.0, True, -0.0).

    `smaller`: a SINK whose sources are the first of `sink`'s, in the same order, and its scan (a realize that
    assigns scans its roots, then those with the lazy tensors that read the assigned buffers). `sink`'s walk is
    then the smaller one's without its SINK, the new nodes, and `sink`: the shared part's rows are taken as they
    are, and only the new nodes are walked and scanned."""
    rows: list[tuple[Any, ...]] = []
    inputs: list[UOp] = []
    assigns = symbolic = multi = False
    if smaller is None:
        order = sink.toposort
        start = 0
    else:
        small, small_scan = smaller
        assert sink.src[: len(small.src)] == small.src, "the smaller SINK's sources must come first"
        order = dict(small.toposort)
        del order[small]  # (its last node)
        for root in sink.src[len(small.src) :]:
            root.toposort_into(order)
        order[sink] = None
        sink.__dict__.setdefault("toposort", order)  # (the passes after the scan walk this SINK again)
        rows, inputs = list(small_scan.rows[:-1]), list(small_scan.inputs)
        assigns, symbolic, multi = small_scan.assigns, small_scan.symbolic, small_scan.multi
        start = len(rows)
    index = dict(zip(order, range(len(order))))  # (one C call: no per-node Python for the positions)
    position, append = index.__getitem__, rows.append
    # locals: reading an Enum member off its class costs ~100 ns on Python 3.11 (EnumType has a __getattr__)
    buffer_op, assign_op, device_op = Ops.BUFFER, Ops.ASSIGN, Ops.DEVICE
    for u in itertools.islice(order, start, None):  # the hot path of a schedule-cache hit: checks by type, inline
        op, arg = u.op, u.arg
        if op is buffer_op:
            append((op, u.dtype, tuple(map(position, u.src)), len(inputs), arg[1]))
            inputs.append(u)
            continue
        kind = type(arg)
        if kind is float:
            append((op, u.dtype, tuple(map(position, u.src)), arg, float, math.copysign(1.0, arg)))
            continue
        append((op, u.dtype, tuple(map(position, u.src)), arg, kind))
        if kind is tuple:  # a symbolic size, as `unbind_graph` finds them (see `holds_uops`)
            symbolic = symbolic or tuple_holds_uops(arg)
        elif kind is UOp:
            symbolic = True
        if op is assign_op:
            assigns = True
        elif op is device_op and not multi:
            multi = devices_of(u) is not None
    return GraphScan(tuple(rows), inputs, assigns, symbolic, multi)


def cached_schedule(roots: list[UOp], scan: GraphScan | None = None) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
    """The schedule of `roots`; `scan`: their graph's scan, when the caller has made it already."""
    if not SCACHE:
        return create_schedule(roots)
    own = None  # a graph only this call walks (e.g. the per-device graph of a multi-device realize)
    if scan is None:
        own = UOp(Ops.SINK, dtypes.void, tuple(roots))
        scan = scan_graph(own)
    rows, inputs = scan[:2]
    key = (rows, knobs_key(SCHEDULE_KNOBS))  # the knobs that change kernel boundaries (SPLIT_REDUCEOP, ...)
    if (tpl := _cache.get(key)) is not None:
        ScheduleStats.calls += 1
        items, becomes = _instantiate(tpl, roots, inputs)
    else:
        items, becomes = create_schedule(roots)
        _cache[key] = _make_template(roots, inputs, items, becomes)
    if own is not None:  # its cached walk would hold the graph and its buffers until the cyclic GC (see `UOp.walk`)
        own.drop_walk()
    return items, becomes


def schedule_cache_size() -> int:
    return len(_cache)
