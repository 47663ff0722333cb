"""Memory planning: intermediate buffers of a schedule reuse the memory of intermediates that are no longer needed.

In: the ordered schedule and the buffers that must survive it (the realized outputs). Out: the same schedule with
some intermediate Buffers replaced by earlier, now dead ones of the same device and byte size.
"""

from __future__ import annotations

from collections import defaultdict

from xgrad.buffer import Buffer
from xgrad.engine.schedule import ScheduleItem, buffer_of
from xgrad.helpers import NO_MEMORY_PLANNER
from xgrad.uop.ops import UOp


def plan_memory(items: list[ScheduleItem], outputs: list[UOp]) -> list[ScheduleItem]:
    if NO_MEMORY_PLANNER or len(items) < 3:
        return items
    keep = {id(buffer_of(o)) for o in outputs}
    produced = {id(it.bufs[0]) for it in items}
    last_use: dict[int, int] = {}
    for i, it in enumerate(items):
        for b in it.bufs:
            last_use[id(b)] = i
    # intermediates: made inside this schedule, not outputs, not yet allocated
    free: dict[tuple[str, int], list[Buffer]] = defaultdict(list)
    swap: dict[int, Buffer] = {}
    planned = []
    for i, it in enumerate(items):
        out = it.bufs[0]
        if id(out) in produced and id(out) not in keep and not out.is_allocated and out.base is None:
            pool = free[(out.device, out.nbytes)]
            if pool:
                swap[id(out)] = pool.pop()
        bufs = tuple(swap.get(id(b), b) for b in it.bufs)
        planned.append(ScheduleItem(it.ast, bufs, it.device))
        for b in it.bufs:
            if last_use[id(b)] == i and id(b) in produced and id(b) not in keep and b.base is None:
                real = swap.get(id(b), b)
                free[(real.device, real.nbytes)].append(real)
    return planned
