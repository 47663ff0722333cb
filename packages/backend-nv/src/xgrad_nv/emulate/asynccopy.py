"""Asynchronous copies (PTX ISA 9.7.9.25, sm_80+): cp.async, cp.async.commit_group, cp.async.wait_group/wait_all.

In: one parsed instruction. Out: a step over the lanes of its mask. `cp.async.{ca,cg}.shared.global [dst], [src],
cp-size{, src-size}` reads `src-size` bytes (default cp-size; 0 reads nothing) from global memory when it is issued
and fills the rest with zeros; both addresses must be aligned to cp-size (4, 8 or 16; .cg only 16). What the
destination holds is undefined until the copy completes: the emulator writes 0xFF bytes there at issue (a NaN in
every float format, so a read before the wait, or a copy issued into a buffer other threads still read, shows up
in the results) and the copied bytes only when the thread's `cp.async.wait_group N` finds the copy's group among
the completed ones (all but the N most recent of the thread's committed groups). `commit_group` closes the thread's
copies issued since its last commit into one group (possibly empty); `wait_all` is a commit and a wait for all.
Copies never waited for do not land. Other forms (cp.async.bulk, cache hints, the ignore-src predicate) raise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from xgrad_nv.emulate.memory import _lanes, _per_lane, _rows_access, _scatter, address
from xgrad_nv.emulate.parse import Instruction
from xgrad_nv.emulate.values import Array, Decoder, Mask, Step

OPS: dict[str, Callable[[Instruction, Decoder], Step]] = {}
GARBAGE = 0xFF


@dataclass
class _Copy:
    """Copies in flight, one per listed lane: the lane, its block's shared row, the shared offset, the bytes (one row
    per lane) and the group each is committed to (-1: not yet)."""

    lanes: Array
    rows: Array
    offsets: Array
    data: Array
    group: Array


class AsyncCopies:
    """A chunk's asynchronous copies in flight and each thread's count of committed groups."""

    def __init__(self, n: int) -> None:
        self.pending: list[_Copy] = []
        self.committed = np.zeros(n, np.int64)

    def commit(self, lanes: Array) -> None:
        for c in self.pending:
            open_ = (c.group < 0) & np.isin(c.lanes, lanes)
            c.group = np.where(open_, self.committed[c.lanes], c.group)
        self.committed[lanes] += 1

    def wait(self, st: Any, lanes: Array, pending: int) -> None:
        """Land the copies of `lanes` whose group is older than their `pending` most recent ones."""
        keep = []
        for c in self.pending:
            done = (c.group >= 0) & np.isin(c.lanes, lanes) & (c.group < self.committed[c.lanes] - pending)
            if done.any():
                _land(st, c.rows[done], c.offsets[done], c.data[done])
            if not done.all():
                keep.append(_Copy(c.lanes[~done], c.rows[~done], c.offsets[~done], c.data[~done], c.group[~done]))
        self.pending = keep


def _land(st: Any, rows: Array, offsets: Array, data: Array) -> None:
    size = data.shape[1]
    vals = np.ascontiguousarray(data).view(np.dtype((np.void, size))).reshape(-1)
    _scatter(st.shared, _rows_access(st.shared, rows, offsets, vals.dtype, st, "shared"), vals)


def _read(st: Any, addrs: Array, src_size: Array, size: int) -> Array:
    """`size` bytes per lane from global `addrs`: the first `src_size` of them read, the rest zeros."""
    out = np.zeros((addrs.size, size), np.uint8)
    full = src_size >= size
    if full.any():  # whole copies as 32-bit words (cp.async addresses are aligned to the copy's size)
        words = np.stack([st.global_load(addrs[full] + np.uint64(j), np.dtype(np.uint32)) for j in range(0, size, 4)])
        out[full] = np.ascontiguousarray(words.T).view(np.uint8).reshape(-1, size)
    part = ~full & (src_size > 0)
    for j in range(size):
        sel = part & (src_size > j)
        if sel.any():
            out[sel, j] = st.global_load(addrs[sel] + np.uint64(j), np.dtype(np.uint8))
    return out


def _cp(ins: Instruction, dec: Decoder) -> Step:
    op = ins.op
    if op[1:2] != ["async"]:
        raise dec.error(f"unsupported copy {'.'.join(op)} (only cp.async: copies from global to shared memory)")
    if op[2:3] in (["commit_group"], ["wait_group"], ["wait_all"]):
        return _group_op(ins, dec)
    cache = op[2] if len(op) > 2 else ""
    spaces = [p.split("::")[0] for p in op[3:]]
    if cache not in ("ca", "cg") or spaces != ["shared", "global"]:
        raise dec.error(f"unsupported asynchronous copy {'.'.join(op)} (cp.async.ca/cg.shared.global only)")
    if len(ins.operands) not in (3, 4) or ins.operands[2].kind != "imm":
        raise dec.error(f"{'.'.join(op)} takes [dst], [src], cp-size and an optional src-size (no cache hint)")
    size = int(ins.operands[2].value)
    if size not in ((16,) if cache == "cg" else (4, 8, 16)):
        raise dec.error(f"{'.'.join(op)} copies {'16' if cache == 'cg' else '4, 8 or 16'} bytes, not {size}")
    dst = address(ins.operands[0], dec, "shared")
    src = address(ins.operands[1], dec, "global")
    src_size = dec.src(ins.operands[3], "u32") if len(ins.operands) == 4 else None

    def step(st: Any, m: Mask) -> None:
        lanes = _lanes(st, m)
        d = _per_lane(dst(st), st, lanes).astype(np.uint64)
        s = _per_lane(src(st), st, lanes).astype(np.uint64)
        n = _per_lane(src_size(st), st, lanes).astype(np.int64) if src_size is not None else np.full(lanes.size, size)
        if ((d | s) % np.uint64(size)).any():
            raise st.fault(f"{'.'.join(op)}: an address is not aligned to the copy's {size} bytes")
        if (n > size).any():
            raise st.fault(f"{'.'.join(op)}: src-size {int(n.max())} is more than the copy's {size} bytes")
        data = _read(st, s, n, size)
        rows = st.blk[lanes]
        _land(st, rows, d, np.full_like(data, GARBAGE))
        st.copies.pending.append(_Copy(lanes, rows, d, data, np.full(lanes.size, -1, np.int64)))

    return step


def _group_op(ins: Instruction, dec: Decoder) -> Step:
    kind = ins.op[2]
    pending = 0
    if kind == "wait_group":
        if len(ins.operands) != 1 or ins.operands[0].kind != "imm":
            raise dec.error("cp.async.wait_group takes one integer constant")
        pending = int(ins.operands[0].value)
    elif ins.operands:
        raise dec.error(f"cp.async.{kind} takes no operands")

    def step(st: Any, m: Mask) -> None:
        lanes = _lanes(st, m)
        if kind in ("commit_group", "wait_all"):
            st.copies.commit(lanes)
        if kind != "commit_group":
            st.copies.wait(st, lanes, pending)

    return step


OPS["cp"] = _cp
