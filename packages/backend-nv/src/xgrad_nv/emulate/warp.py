"""Warp-wide instructions: shfl.sync, vote.sync, activemask, mma.sync, ldmatrix (PTX ISA 9.7.8.6-9.7.8.8, 9.7.14.5).

In: one parsed instruction. Out: a step. A warp is 32 consecutive threads of a block (in linear thread order, the
chunk holds whole blocks), so lane `l` of warp `w` is thread `32 * w + l` of the chunk; blocks whose size is not a
multiple of 32 are refused for these instructions. `mma.sync` gathers each warp's fragments into matrices by the
ISA's fragment layouts ("Matrix Fragments for mma.m16n8k16 / m16n8k8"), multiplies in float64 and rounds the sum
once to the accumulator type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from xgrad_nv.emulate.memory import address, load
from xgrad_nv.emulate.parse import TYPE_BYTES, Instruction, Operand
from xgrad_nv.emulate.values import Array, Decoder, Mask, Step, bf16_to_f32

OPS: dict[str, Callable[[Instruction, Decoder], Step]] = {}

_LANE = np.arange(32)
_G = _LANE >> 2  # groupID
_T = _LANE % 4  # threadID_in_group


def _warps(st: Any, what: str) -> int:
    if st.bsize % 32:
        raise st.fault(f"{what} needs whole warps: a block of {st.bsize} threads is not a multiple of 32")
    return int(st.n // 32)


def _shfl(ins: Instruction, dec: Decoder) -> Step:
    mode = next((p for p in ins.op[1:] if p in ("up", "down", "bfly", "idx")), None)
    if mode is None:
        raise dec.error("shfl needs a mode (.up/.down/.bfly/.idx)")
    dst = ins.operands[0]
    pair = dst.items if dst.kind == "pair" else (dst,)
    wd = dec.dst(pair[0], "b32")
    wp = dec.dst(pair[1], "pred") if len(pair) > 1 else None
    a = dec.src(ins.operands[1], "b32")
    b = dec.src(ins.operands[2], "u32")
    c = dec.src(ins.operands[3], "u32")

    def step(st: Any, m: Mask) -> None:
        _warps(st, "shfl.sync")
        lane = st.special("%laneid").astype(np.int64)
        bval = np.broadcast_to(b(st), (st.n,)).astype(np.int64) & 31
        cv = np.broadcast_to(c(st), (st.n,)).astype(np.int64)
        cval = cv & 31
        seg = (cv >> 8) & 31
        max_lane = (lane & seg) | (cval & ~seg)
        min_lane = lane & seg
        if mode == "up":
            j = lane - bval
            ok = j >= max_lane
        elif mode == "down":
            j = lane + bval
            ok = j <= max_lane
        elif mode == "bfly":
            j = lane ^ bval
            ok = j <= max_lane
        else:
            j = min_lane | (bval & ~seg)
            ok = j <= max_lane
        j = np.where(ok, j, lane)
        src = np.arange(st.n) - lane + j
        vals = np.broadcast_to(a(st), (st.n,))[src]
        wd(st, vals, m)
        if wp is not None:
            wp(st, ok, m)

    return step


def _vote(ins: Instruction, dec: Decoder) -> Step:
    mode = next((p for p in ins.op[1:] if p in ("all", "any", "uni", "ballot")), None)
    if mode is None:
        raise dec.error("vote needs a mode (.all/.any/.uni/.ballot)")
    w = dec.dst(ins.operands[0], "b32" if mode == "ballot" else "pred")
    p = dec.src(ins.operands[1], "pred")

    def step(st: Any, m: Mask) -> None:
        nw = _warps(st, "vote.sync")
        active = np.ones(st.n, bool) if m is None else m
        pv = np.broadcast_to(p(st), (st.n,)) & active
        if mode == "ballot":
            bits = (pv.astype(np.uint64) << st.special("%laneid").astype(np.uint64)).reshape(nw, 32)
            w(st, np.repeat(np.bitwise_or.reduce(bits, axis=1).astype(np.uint32), 32), m)
            return
        pw = pv.reshape(nw, 32)
        aw = active.reshape(nw, 32)
        if mode == "all":
            r = (pw | ~aw).all(axis=1)
        elif mode == "any":
            r = pw.any(axis=1)
        else:
            r = (pw | ~aw).all(axis=1) | ~pw.any(axis=1)
        w(st, np.repeat(r, 32), m)

    return step


def _activemask(ins: Instruction, dec: Decoder) -> Step:
    w = dec.dst(ins.operands[0], "b32")

    def step(st: Any, m: Mask) -> None:
        nw = _warps(st, "activemask")
        active = np.ones(st.n, bool) if m is None else m
        bits = (active.astype(np.uint64) << st.special("%laneid").astype(np.uint64)).reshape(nw, 32)
        w(st, np.repeat(np.bitwise_or.reduce(bits, axis=1).astype(np.uint32), 32), m)

    return step


# (row, col) of each lane's elements, per operand, from the ISA's fragment tables
def _layout_k16() -> dict[str, tuple[Array, Array]]:
    e8 = np.arange(8)
    a_row = _G[:, None] + 8 * ((e8[None, :] >> 1) & 1)
    a_col = 2 * _T[:, None] + (e8[None, :] & 1) + 8 * (e8[None, :] >> 2)
    e4 = np.arange(4)
    b_row = 2 * _T[:, None] + (e4[None, :] & 1) + 8 * (e4[None, :] >> 1)
    b_col = np.broadcast_to(_G[:, None], (32, 4))
    c_row = _G[:, None] + 8 * (e4[None, :] >> 1)
    c_col = 2 * _T[:, None] + (e4[None, :] & 1)
    return {"a": (a_row, a_col), "b": (b_row, b_col), "c": (c_row, c_col)}


def _layout_k8_f16() -> dict[str, tuple[Array, Array]]:
    e4 = np.arange(4)
    a_row = _G[:, None] + 8 * (e4[None, :] >> 1)
    a_col = 2 * _T[:, None] + (e4[None, :] & 1)
    e2 = np.arange(2)
    b_row = 2 * _T[:, None] + e2[None, :]
    b_col = np.broadcast_to(_G[:, None], (32, 2))
    return {"a": (a_row, a_col), "b": (b_row, b_col), "c": _layout_k16()["c"]}


def _layout_k8_tf32() -> dict[str, tuple[Array, Array]]:
    e4 = np.arange(4)
    a_row = _G[:, None] + 8 * (e4[None, :] & 1)
    a_col = _T[:, None] + 4 * (e4[None, :] >> 1)
    e2 = np.arange(2)
    b_row = _T[:, None] + 4 * e2[None, :]
    b_col = np.broadcast_to(_G[:, None], (32, 2))
    return {"a": (a_row, a_col), "b": (b_row, b_col), "c": _layout_k16()["c"]}


_SHAPES = {"m16n8k16": (16, 8, 16), "m16n8k8": (16, 8, 8)}


def _elements(vals: list[Array], t: str) -> Array:
    """Registers (each lanes-long, b32) -> (lanes, elements) float64 values of type `t`."""
    regs = np.stack([np.ascontiguousarray(np.broadcast_to(v, vals[0].shape), np.uint32) for v in vals], axis=1)
    if t == "f16":
        return regs.view(np.float16).astype(np.float64)
    if t == "bf16":
        return bf16_to_f32(regs.view(np.uint16)).astype(np.float64)
    if t == "tf32":
        return (regs & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)
    return regs.view(np.float32).astype(np.float64)


def _mma(ins: Instruction, dec: Decoder) -> Step:
    shape = next((p for p in ins.op if p in _SHAPES), None)
    types = [p for p in ins.op if p in TYPE_BYTES]
    if shape is None or len(types) != 4 or "row" not in ins.op or "col" not in ins.op:
        raise dec.error(f"unsupported mma form {'.'.join(ins.op)} (m16n8k16 / m16n8k8 .row.col)")
    td, ta, tb, tc = types
    if ta not in ("f16", "bf16", "tf32") or ta != tb or td not in ("f32", "f16") or tc not in ("f32", "f16"):
        raise dec.error(f"unsupported mma types {'.'.join(ins.op)} (f16/bf16/tf32 inputs, f16/f32 accumulators)")
    m, n, k = _SHAPES[shape]
    if k == 16 and ta == "tf32" or (k == 8 and ta == "bf16"):
        raise dec.error(f"mma {shape} has no {ta} form")
    lay = _layout_k16() if k == 16 else (_layout_k8_tf32() if ta == "tf32" else _layout_k8_f16())
    d_items, a_items, b_items, c_items = (op.items for op in ins.operands)
    a_srcs = [dec.src(o, "b32") for o in a_items]
    b_srcs = [dec.src(o, "b32") for o in b_items]
    c_srcs = [dec.src(o, "b32" if tc == "f16" else "f32") for o in c_items]
    d_ws = [dec.dst(o, "b32" if td == "f16" else "f32") for o in d_items]
    if tc == "f16" and any(o.kind == "imm" for o in c_items):
        c_srcs = [dec.src(Operand("imm", value=0), "b32") if o.kind == "imm" else dec.src(o, "b32") for o in c_items]

    def step(st: Any, mask: Mask) -> None:
        nw = _warps(st, "mma.sync")
        lanes = (st.n,)
        av = _elements([np.broadcast_to(s(st), lanes) for s in a_srcs], ta).reshape(nw, 32, -1)
        bv = _elements([np.broadcast_to(s(st), lanes) for s in b_srcs], tb).reshape(nw, 32, -1)
        craw = [np.broadcast_to(s(st), lanes) for s in c_srcs]
        cv = (
            _elements(craw, "f16") if tc == "f16" else np.stack([np.asarray(x, np.float64) for x in craw], 1)
        ).reshape(nw, 32, -1)
        amat = np.zeros((nw, m, k))
        amat[:, lay["a"][0], lay["a"][1]] = av
        bmat = np.zeros((nw, k, n))
        bmat[:, lay["b"][0], lay["b"][1]] = bv
        cmat = np.zeros((nw, m, n))
        cmat[:, lay["c"][0], lay["c"][1]] = cv
        dmat = amat @ bmat + cmat
        dv = dmat[:, lay["c"][0], lay["c"][1]].reshape(st.n, 4)
        if td == "f16":
            pairs = np.ascontiguousarray(dv.astype(np.float16)).view(np.uint32)
            for i, w in enumerate(d_ws):
                w(st, pairs[:, i], mask)
        else:
            for i, w in enumerate(d_ws):
                w(st, dv[:, i].astype(np.float32), mask)

    return step


def _redux(ins: Instruction, dec: Decoder) -> Step:
    """redux.sync.op.type d, a, membermask: every active lane of a warp gets the reduction of their values."""
    op = next((p for p in ins.op[1:] if p in ("add", "min", "max", "and", "or", "xor")), None)
    t = next((p for p in ins.op[1:] if p in ("u32", "s32", "b32")), None)
    if op is None or t is None:
        raise dec.error(f"unsupported redux form {'.'.join(ins.op)} (add/min/max .u32/.s32, and/or/xor .b32)")
    a = dec.src(ins.operands[1], t)
    w = dec.dst(ins.operands[0], t)
    dt = np.dtype(np.int32 if t == "s32" else np.uint32)
    ident = {"add": 0, "and": ~0, "or": 0, "xor": 0, "min": np.iinfo(dt).max, "max": np.iinfo(dt).min}[op]
    ufunc = {"add": np.add, "min": np.minimum, "max": np.maximum, "and": np.bitwise_and, "or": np.bitwise_or}
    ufunc["xor"] = np.bitwise_xor

    def step(st: Any, m: Mask) -> None:
        nw = _warps(st, "redux.sync")
        v = np.broadcast_to(a(st), (st.n,)).astype(dt)
        if m is not None:
            v = np.where(m, v, np.asarray(ident).astype(dt))
        r = ufunc[op].reduce(v.reshape(nw, 32), axis=1).astype(dt)
        w(st, np.repeat(r, 32), m)

    return step


def _ldmatrix(ins: Instruction, dec: Decoder) -> Step:
    """ldmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared{::cta}.b16 {d...}, [a] (PTX ISA 9.7.14.5.15): lane 8i + r
    names the 16-byte row r of matrix i; lane l gets in d[i] the two b16 at row l / 4, columns 2 (l % 4) + {0, 1} of
    matrix i (.trans: rows 2 (l % 4) + {0, 1} of column l / 4), the first in the low half."""
    count = next((int(p[1:]) for p in ins.op if p in ("x1", "x2", "x4")), None)
    spaces = [p.split("::")[0] for p in ins.op if p.split("::")[0] in ("shared", "global", "local")]
    if count is None or "m8n8" not in ins.op or "b16" not in ins.op or spaces != ["shared"]:
        raise dec.error(f"unsupported ldmatrix form {'.'.join(ins.op)} (m8n8 .x1/.x2/.x4 [.trans] .shared .b16)")
    trans = "trans" in ins.op
    dst = ins.operands[0]
    items = dst.items if dst.kind == "vec" else (dst,)
    if len(items) != count:
        raise dec.error(f"{'.'.join(ins.op)} writes {count} registers, got {len(items)}")
    ws = [dec.dst(o, "b32") for o in items]
    addr = address(ins.operands[1], dec, "shared")

    def step(st: Any, mask: Mask) -> None:
        nw = _warps(st, "ldmatrix")
        rows = np.broadcast_to(addr(st), (st.n,)).astype(np.uint64).reshape(nw, 32)
        if (rows[:, : 8 * count] % np.uint64(16)).any():
            raise st.fault(f"{'.'.join(ins.op)}: a row address is not aligned to 16 bytes")
        lanes = np.arange(st.n)
        for i, w in enumerate(ws):
            if trans:
                halves = [
                    rows[lanes // 32, 8 * i + 2 * _T[lanes % 32] + j] + 2 * (_G[lanes % 32]).astype(np.uint64)
                    for j in range(2)
                ]
                lo, hi = (load(st, "shared", h, lanes, np.dtype(np.uint16)) for h in halves)
                word = lo.astype(np.uint32) | (hi.astype(np.uint32) << np.uint32(16))
            else:
                at = rows[lanes // 32, 8 * i + _G[lanes % 32]] + 4 * (_T[lanes % 32]).astype(np.uint64)
                word = load(st, "shared", at, lanes, np.dtype(np.uint32))
            w(st, word, mask)

    return step


OPS.update(
    {"redux": _redux, "shfl": _shfl, "vote": _vote, "activemask": _activemask, "mma": _mma, "ldmatrix": _ldmatrix}
)
