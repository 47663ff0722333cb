"""Kernel boundaries for devices that bind a limited number of buffers per kernel (WebGPU: the adapter's
`maxStorageBuffersPerShaderStage`, 8 on some adapters).

In: the tensor graph in source-first order and the nodes the scheduler already realizes. Out: more nodes to realize,
so that no kernel reads more than its device's limit minus one buffers (one binding is its output).

The limit is the `MAX_KERNEL_BUFFERS` knob when set, else the device's `max_kernel_buffers` attribute (an optional
part of `xgrad.buffer.RuntimeDevice`; a device without it has no limit).

How: walking sources first, each node gets the set of buffers its computation reads (a realized node counts as one).
Where a node's sources together read too many, its sources that read the most are realized on their own, largest
first, until the rest fits. Each of them fits by induction, so every kernel fits; a source is realized only where
the limit forces it, so small graphs fuse exactly as before.
"""

from __future__ import annotations

from xgrad.device import Device
from xgrad.errors import DeviceError
from xgrad.helpers import MAX_KERNEL_BUFFERS
from xgrad.uop.ops import GroupOp, Ops, UOp


def kernel_buffer_limit(device: str) -> int | None:
    """The most buffers (output included) one kernel on `device` may bind; None when unlimited or unknown."""
    if MAX_KERNEL_BUFFERS.value > 0:
        return int(MAX_KERNEL_BUFFERS.value)

    try:
        runtime = Device[device]
    except DeviceError:  # not openable here (several devices, unavailable): running it reports that
        return None
    limit = getattr(runtime, "max_kernel_buffers", None)
    return int(limit) if limit else None


def realizes_for_buffer_limit(order: list[UOp], realizes: set[UOp]) -> set[UOp]:
    """Nodes to realize besides `realizes` so that every kernel binds at most its device's limit of buffers.
    `order` lists the graph's nodes, sources before users."""
    extra: set[UOp] = set()
    reads: dict[UOp, frozenset[UOp]] = {}
    limits: dict[str, int | None] = {}
    for u in order:  # kernels read buffers on their own device: without a limit on those, there is nothing to do
        if u.op is Ops.BUFFER and isinstance(device := u.device, str) and device not in limits:
            limits[device] = kernel_buffer_limit(device)
    if not any(limit is not None for limit in limits.values()):
        return extra

    def read_by(s: UOp) -> frozenset[UOp]:
        return frozenset({s}) if s in realizes or s in extra else reads.get(s, frozenset())

    for u in order:
        if u.op is Ops.BUFFER:
            reads[u] = frozenset({u})
            continue
        srcs = [read_by(s) for s in u.src]
        total = frozenset().union(*srcs)
        if len(total) > 1 and u.op is not Ops.COPY and isinstance(device := u.device, str):
            if device not in limits:
                limits[device] = kernel_buffer_limit(device)
            limit = limits[device]
            if limit is not None and len(total) > limit - 1:
                total = _split_sources(u, srcs, limit - 1, extra)
        reads[u] = total
    return extra


def _split_sources(u: UOp, srcs: list[frozenset[UOp]], most: int, extra: set[UOp]) -> frozenset[UOp]:
    """Realize sources of `u` (largest reader first) until they read at most `most` buffers together."""
    sets = list(srcs)
    for i in sorted(range(len(sets)), key=lambda i: -len(sets[i])):
        if len(frozenset().union(*sets)) <= most:
            break
        node = u.src[i]
        while node.op in GroupOp.Movement:  # realize the computation, not a view of it
            node = node.src[0]
        if len(sets[i]) <= 1 or node.op is Ops.BUFFER:
            continue
        extra.add(node)
        sets[i] = frozenset({node})
    return frozenset().union(*sets)
