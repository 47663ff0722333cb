"""Memory planning: intermediate buffers of a schedule reuse the memory of intermediates that are no longer needed.

In: the ordered schedule and the buffers that must survive it (the realized outputs). Out: the same schedule with
some intermediate Buffers replaced by earlier, now dead ones of the same device and byte size.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from xgrad.buffer import Buffer
from xgrad.engine.capture import capture_pool
from xgrad.engine.schedule import ScheduleItem, buffer_of
from xgrad.helpers import NO_MEMORY_PLANNER
from xgrad.uop.ops import UOp

Pool = dict[tuple[str, int], list[Buffer]]


def share_buffers(
    items: list[ScheduleItem], may_share: Callable[[Buffer], bool], free: Pool | None = None
) -> list[ScheduleItem]:
    """`items` with the intermediates that `may_share` accepts given the memory of earlier ones of the same device
    and byte size that no later item uses. A buffer qualifies only where it first appears as an item's output and
    is not read by that item (it carries no value in), and when no item uses a view of it. Unchanged items are
    returned as they were. `free` (by (device, bytes)) offers buffers nothing will read any more before the first
    item; on return it holds them, less the ones taken, plus every qualifying buffer of `items`."""
    first: dict[int, int] = {}
    last_use: dict[int, int] = {}
    for i, it in enumerate(items):
        for b in it.bufs:
            first.setdefault(id(b), i)
            last_use[id(b)] = i
    viewed = {id(b.base) for it in items for b in it.bufs if b.base is not None}
    free = free if free is not None else defaultdict(list)
    swap: dict[int, Buffer] = {}
    sharing: set[int] = set()  # the qualifying buffers met so far
    planned = []
    for i, it in enumerate(items):
        out = it.bufs[0]
        if (
            first[id(out)] == i
            and out.base is None
            and id(out) not in viewed
            and all(b is not out for b in it.bufs[1:])
            and may_share(out)
        ):
            sharing.add(id(out))
            if pool := free[(out.device, out.nbytes)]:
                swap[id(out)] = pool.pop()
        bufs = tuple(swap.get(id(b), b) for b in it.bufs)
        planned.append(it if bufs == it.bufs else ScheduleItem(it.ast, bufs, it.device))
        for b in {id(x): x for x in it.bufs}.values():  # each once: a buffer read twice is freed once
            if last_use[id(b)] == i and id(b) in sharing:
                real = swap.get(id(b), b)
                free[(real.device, real.nbytes)].append(real)
    return planned


def plan_memory(items: list[ScheduleItem], outputs: list[UOp]) -> list[ScheduleItem]:
    """A schedule's intermediates (made inside it, not allocated yet, not outputs) share memory. While a TinyJit
    captures, they also share with the intermediates of the capture's earlier schedules, which nothing can read once
    their schedule ran (no tensor holds an intermediate) but which the capture keeps allocated: without that, a
    capture of a function that realizes step by step (a language model's layers) holds every step's at once."""
    pool = capture_pool()
    if NO_MEMORY_PLANNER or (len(items) < 3 and pool is None):
        return items
    keep = {id(buffer_of(o)) for o in outputs}
    return share_buffers(items, lambda b: id(b) not in keep and not b.is_allocated, pool)
