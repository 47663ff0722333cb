"""The schedule cache: graphs of the same structure (same ops, shapes, dtypes and devices; other buffers) reuse
the schedule made for the first one, with their own buffers bound in. `SCACHE=0` turns it off.

In: the roots of a tensor graph. Out: what `create_schedule` returns, built from a template when the structure was
seen before. The key is the graph's structure with every BUFFER replaced by a numbered placeholder. Graphs come here
with their bound variables stripped (see `xgrad.uop.symshape`), so different values of one variable hit the same entry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from xgrad.buffer import Buffer
from xgrad.dtype import DType, dtypes
from xgrad.engine.schedule import (
    ScheduleItem,
    ScheduleStats,
    buffer_of,
    buffer_view,
    create_schedule,
    new_buffer_uop,
)
from xgrad.helpers import MAX_KERNEL_BUFFERS, SCACHE
from xgrad.uop.ops import Ops, UOp, sint

INPUT, NEW, VIEW = 0, 1, 2
Slot = tuple[int, int]  # (INPUT | NEW | VIEW, index among inputs / new buffers / views)


@dataclass(frozen=True)
class ScheduleTemplate:
    items: tuple[tuple[UOp, tuple[Slot, ...], str], ...]  # (ast, buffer slots, device) per item
    new_buffers: tuple[tuple[str, int, DType], ...]  # (device, size, dtype) of each buffer the schedule creates
    views: tuple[tuple[Slot, int, int, DType], ...]  # (base, byte offset, size, dtype): a copy reading part of a buffer
    becomes: tuple[tuple[int, Slot, tuple[sint, ...]] | tuple[int, None, None], ...]  # root index -> buffer view


_cache: dict[tuple[tuple[Any, ...], int], ScheduleTemplate] = {}  # (graph structure, knobs); see _structure


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


def _structure(sink: UOp) -> tuple[tuple[Any, ...], list[UOp]]:
    """The cache key of the graph under `sink` and its input BUFFERs in order. The key lists every node as
    (op, dtype, arg, positions of its sources), with the k-th BUFFER as a placeholder (k, size): equal keys are graphs
    that differ only in which buffers they read. Args are told apart like the UOp cache does (1, 1.0, True, -0.0)."""
    index: dict[UOp, int] = {}
    rows: list[tuple[Any, ...]] = []
    inputs: list[UOp] = []
    position = index.__getitem__
    for i, u in enumerate(sink.toposort):
        index[u] = i
        src = tuple(map(position, u.src))
        if u.op is Ops.BUFFER:
            rows.append((Ops.BUFFER, u.dtype, src, len(inputs), u.arg[1]))
            inputs.append(u)
        elif type(arg := u.arg) is float:
            rows.append((u.op, u.dtype, src, arg, float, math.copysign(1.0, arg)))
        else:
            rows.append((u.op, u.dtype, src, arg, type(arg)))
    return tuple(rows), inputs


def cached_schedule(roots: list[UOp]) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
    if not SCACHE:
        return create_schedule(roots)
    rows, inputs = _structure(UOp(Ops.SINK, dtypes.void, tuple(roots)))
    key = (rows, MAX_KERNEL_BUFFERS.value)  # the knob changes the kernel boundaries
    if (tpl := _cache.get(key)) is not None:
        ScheduleStats.calls += 1
        return _instantiate(tpl, roots, inputs)
    items, becomes = create_schedule(roots)
    _cache[key] = _make_template(roots, inputs, items, becomes)
    return items, becomes


def schedule_cache_size() -> int:
    return len(_cache)
