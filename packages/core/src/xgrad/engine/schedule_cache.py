"""The schedule cache: graphs of the same structure (same ops, shapes, dtypes and devices; other buffers) reuse
the schedule made for the first one, with their own buffers bound in. `SCACHE=0` turns it off.

In: the roots of a tensor graph. Out: what `create_schedule` returns, built from a template when the structure was
seen before. The key is the graph with every BUFFER replaced by a numbered placeholder.
"""

from __future__ import annotations

from dataclasses import dataclass

from xgrad.buffer import Buffer
from xgrad.dtype import DType, dtypes
from xgrad.engine.schedule import ScheduleItem, ScheduleStats, buffer_of, create_schedule, new_buffer_uop
from xgrad.helpers import SCACHE
from xgrad.uop.ops import Ops, UOp
from xgrad.uop.pattern import substitute

Slot = tuple[bool, int]  # (is an input buffer, index among inputs / among new buffers)


@dataclass(frozen=True)
class ScheduleTemplate:
    items: tuple[tuple[UOp, tuple[Slot, ...], str], ...]  # (ast, buffer slots, device) per item
    new_buffers: tuple[tuple[str, int, DType], ...]  # (device, size, dtype) of each buffer the schedule creates
    becomes: tuple[tuple[int, Slot, tuple[int, ...]] | tuple[int, None, None], ...]  # root index -> buffer view


_cache: dict[UOp, ScheduleTemplate] = {}


def _make_template(
    roots: list[UOp], inputs: list[UOp], items: list[ScheduleItem], becomes: dict[UOp, UOp]
) -> ScheduleTemplate:
    slots: dict[int, Slot] = {id(buffer_of(b)): (True, i) for i, b in enumerate(inputs)}
    new: list[Buffer] = []
    for it in items:
        for b in it.bufs:
            if id(b) not in slots:
                slots[id(b)] = (False, len(new))
                new.append(b)
    item_tpl = tuple((it.ast, tuple(slots[id(b)] for b in it.bufs), it.device) for it in items)
    becomes_tpl: list[tuple[int, Slot, tuple[int, ...]] | tuple[int, None, None]] = []
    for i, r in enumerate(roots):
        if r not in becomes:
            continue
        if r.op is Ops.ASSIGN:
            becomes_tpl.append((i, None, None))
        else:
            view = becomes[r]
            becomes_tpl.append((i, slots[id(buffer_of(view))], tuple(int(s) for s in view.shape or ())))
    return ScheduleTemplate(item_tpl, tuple((b.device, b.size, b.dtype) for b in new), tuple(becomes_tpl))


def _instantiate(
    tpl: ScheduleTemplate, roots: list[UOp], inputs: list[UOp]
) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
    fresh = [new_buffer_uop(dev, size, dt) for dev, size, dt in tpl.new_buffers]

    def resolve(slot: Slot) -> UOp:
        return inputs[slot[1]] if slot[0] else fresh[slot[1]]

    items = [ScheduleItem(ast, tuple(buffer_of(resolve(s)) for s in slots), dev) for ast, slots, dev in tpl.items]
    becomes: dict[UOp, UOp] = {}
    for i, slot, shape in tpl.becomes:
        root = roots[i]
        becomes[root] = root.src[0] if slot is None or shape is None else resolve(slot).reshape(shape)
    return items, becomes


def cached_schedule(roots: list[UOp]) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
    if not SCACHE:
        return create_schedule(roots)
    sink = UOp(Ops.SINK, dtypes.void, tuple(roots))
    inputs = [u for u in sink.toposort if u.op is Ops.BUFFER]
    placeholders = {b: UOp(Ops.BUFFER, b.dtype, b.src, (-1 - i, b.arg[1])) for i, b in enumerate(inputs)}
    key = substitute(sink, placeholders)
    if (tpl := _cache.get(key)) is not None:
        ScheduleStats.calls += 1
        return _instantiate(tpl, roots, inputs)
    items, becomes = create_schedule(roots)
    _cache[key] = _make_template(roots, inputs, items, becomes)
    return items, becomes


def schedule_cache_size() -> int:
    return len(_cache)
