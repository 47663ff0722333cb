"""Bit-manipulation instructions: bfe, bfi, prmt, popc, clz, bfind, brev, lop3, shf (PTX ISA 9.7.1, 9.7.7)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from xgrad_nv.emulate.alu import _elementwise, itype
from xgrad_nv.emulate.parse import TYPE_BYTES, Instruction
from xgrad_nv.emulate.values import NP, SINT, UINT, Array, Decoder, Mask, Step

OPS: dict[str, Callable[[Instruction, Decoder], Step]] = {}


def _low_mask(n: Array, bits: int) -> Array:
    """(1 << n) - 1 as uint64 for n in [0, 64]."""
    n = np.asarray(n, np.uint64)
    full = np.uint64(2**64 - 1)
    return np.where(n >= 64, full, (np.uint64(1) << np.minimum(n, np.uint64(63))) - np.uint64(1))


def _bfe(ins: Instruction, dec: Decoder) -> Step:
    t = itype(ins)
    bits = 8 * TYPE_BYTES[t]
    signed = t[0] == "s"
    dt = NP[t]

    def f(a: Array, b: Array, c: Array) -> Array:
        pos = (b & 0xFF).astype(np.uint64)
        ln = (c & 0xFF).astype(np.uint64)
        au = np.asarray(a).astype(UINT[bits // 8]).astype(np.uint64)
        shifted = np.where(pos >= bits, np.uint64(0), au >> np.minimum(pos, np.uint64(bits - 1)))
        val = shifted & _low_mask(ln, bits)
        if signed:
            top = np.minimum(pos + ln - np.uint64(1), np.uint64(bits - 1)).astype(np.uint64)
            sbit = np.where(ln == 0, np.uint64(0), (au >> top) & np.uint64(1))
            ext = np.where(sbit == 1, ~_low_mask(ln, bits), np.uint64(0))
            val = val | ext
        return val.astype(UINT[bits // 8]).view(dt) if val.ndim else val.astype(UINT[bits // 8]).astype(dt)

    return _elementwise(ins, dec, f, t, 3, [t, "u32", "u32"])


def _bfi(ins: Instruction, dec: Decoder) -> Step:
    t = itype(ins)
    bits = 8 * TYPE_BYTES[t]
    ut = UINT[bits // 8]

    def f(a: Array, b: Array, c: Array, d: Array) -> Array:
        pos = (c & 0xFF).astype(np.uint64)
        ln = (d & 0xFF).astype(np.uint64)
        p = np.minimum(pos, np.uint64(63))
        m = np.where(pos >= bits, np.uint64(0), _low_mask(ln, bits) << p)
        r = (b.astype(np.uint64) & ~m) | ((a.astype(np.uint64) << p) & m)
        return r.astype(ut)

    srcs = [dec.src(ins.operands[k], tt) for k, tt in zip(range(1, 5), [t, t, "u32", "u32"], strict=True)]
    w = dec.dst(ins.operands[0], t)
    return lambda st, m: w(st, f(*(s(st) for s in srcs)), m)


def _prmt(ins: Instruction, dec: Decoder) -> Step:
    mode = next((p for p in ins.op[1:] if p in ("f4e", "b4e", "rc8", "ecl", "ecr", "rc16")), "")
    if mode:
        raise dec.error(f"prmt.{mode} is not supported (only the default byte selection)")

    def f(a: Array, b: Array, c: Array) -> Array:
        x = (b.astype(np.uint64) << np.uint64(32)) | a.astype(np.uint64)
        out = np.zeros(np.broadcast(a, b, c).shape, np.uint32)
        for i in range(4):
            sel = (c.astype(np.uint32) >> np.uint32(4 * i)) & np.uint32(0xF)
            byte = ((x >> (8 * (sel & 7)).astype(np.uint64)) & np.uint64(0xFF)).astype(np.uint32)
            sign = np.where((byte & 0x80) != 0, np.uint32(0xFF), np.uint32(0))
            byte = np.where((sel & 8) != 0, sign, byte)
            out = out | (byte << np.uint32(8 * i))
        return out

    return _elementwise(ins, dec, f, "b32", 3)


def _smear(u: Array, bits: int) -> Array:
    for s in (1, 2, 4, 8, 16, 32):
        if s < bits:
            u = u | (u >> u.dtype.type(s))
    return u


def _popc(ins: Instruction, dec: Decoder) -> Step:
    return _elementwise(ins, dec, lambda a: np.bitwise_count(a).astype(np.uint32), itype(ins), 1, dstt="u32")


def _clz(ins: Instruction, dec: Decoder) -> Step:
    t = itype(ins)
    bits = 8 * TYPE_BYTES[t]
    return _elementwise(
        ins, dec, lambda a: (bits - np.bitwise_count(_smear(a, bits))).astype(np.uint32), t, 1, dstt="u32"
    )


def _bfind(ins: Instruction, dec: Decoder) -> Step:
    t = itype(ins)
    bits = 8 * TYPE_BYTES[t]
    ut = UINT[bits // 8]
    shiftamt = "shiftamt" in ins.op

    def f(a: Array) -> Array:
        u = np.asarray(a).astype(ut) if t[0] == "u" else np.where(a < 0, ~a, a).astype(SINT[bits // 8]).astype(ut)
        cnt = np.bitwise_count(_smear(u, bits)).astype(np.int64)
        idx = cnt - 1
        r = np.where(cnt == 0, -1, (bits - 1 - idx) if shiftamt else idx)
        return r.astype(np.int64).astype(np.uint32)

    return _elementwise(ins, dec, f, t, 1, dstt="u32")


_REV8 = np.array([int(f"{i:08b}"[::-1], 2) for i in range(256)], np.uint8)


def _brev(ins: Instruction, dec: Decoder) -> Step:
    t = itype(ins)
    ut = UINT[TYPE_BYTES[t]]

    def f(a: Array) -> Array:
        u = np.ascontiguousarray(a, ut)
        return _REV8[u.view(np.uint8)].view(ut).byteswap()

    return _elementwise(ins, dec, f, t, 1)


def _lop3(ins: Instruction, dec: Decoder) -> Step:
    if len(ins.operands) != 5 or ins.operands[4].kind != "imm":
        raise dec.error("lop3 takes d, a, b, c, immLut (the predicate form is not supported)")
    lut = int(ins.operands[4].value) & 0xFF

    def f(a: Array, b: Array, c: Array) -> Array:
        out = np.zeros(np.broadcast(a, b, c).shape, np.uint32)
        for k in range(8):
            if lut >> k & 1:
                ta = a if k & 4 else ~a
                tb = b if k & 2 else ~b
                tc = c if k & 1 else ~c
                out = out | (ta & tb & tc)
        return out

    return _elementwise(ins, dec, f, "b32", 3)


def _shf(ins: Instruction, dec: Decoder) -> Step:
    left = "l" in ins.op
    wrap = "wrap" in ins.op
    srcs = [dec.src(ins.operands[k], "u32") for k in (1, 2, 3)]
    w = dec.dst(ins.operands[0], "b32")

    def step(st: Any, m: Mask) -> None:
        a, b, c = (s(st) for s in srcs)
        n = (c & np.uint32(31)) if wrap else np.minimum(c, np.uint32(32))
        x = (b.astype(np.uint64) << np.uint64(32)) | a.astype(np.uint64)
        n64 = n.astype(np.uint64)
        r = (x << n64) >> np.uint64(32) if left else x >> n64
        w(st, (r & np.uint64(0xFFFFFFFF)).astype(np.uint32), m)

    return step


def _mul24(ins: Instruction, dec: Decoder) -> Step:
    """mul24/mad24 .lo/.hi: the 48-bit product of the low 24 bits (sign-extended for .s32); .lo its low 32 bits,
    .hi its bits 16..47; mad24 adds c."""
    t = itype(ins)
    signed = t == "s32"
    hi = "hi" in ins.op
    nsrc = 3 if ins.op[0] == "mad24" else 2

    def f(*v: Array) -> Array:
        a, b = (np.asarray(x).astype(np.int64) & 0xFFFFFF for x in v[:2])
        if signed:
            a, b = ((x ^ 0x800000) - 0x800000 for x in (a, b))
        p = a * b
        r = (p >> 16) if hi else p
        if nsrc == 3:
            r = r + np.asarray(v[2]).astype(np.int64)
        return (r & 0xFFFFFFFF).astype(np.uint32).view(NP[t])

    return _elementwise(ins, dec, f, t, nsrc)


def _dp(ins: Instruction, dec: Decoder) -> Step:
    """dp4a: c + the dot product of a's and b's four bytes; dp2a.lo/.hi: c + a's two 16-bit halves times b's bytes
    0-1 (.lo) or 2-3 (.hi); each operand signed or unsigned by its type."""
    types = [p for p in ins.op[1:] if p in ("u32", "s32")]
    if len(types) != 2:
        raise dec.error(f"{ins.op[0]} needs two operand types (.u32/.s32)")
    ta, tb = types
    tc = "s32" if "s32" in types else "u32"
    four = ins.op[0] == "dp4a"
    high = "hi" in ins.op

    def parts(x: Array, width: int, signed: bool) -> list[Array]:
        u = np.asarray(x).astype(np.int64) & 0xFFFFFFFF
        mask, half = (1 << width) - 1, 1 << (width - 1)
        out = [(u >> (width * k)) & mask for k in range(32 // width)]
        return [(p ^ half) - half for p in out] if signed else out

    def f(a: Array, b: Array, c: Array) -> Array:
        bb = parts(b, 8, tb == "s32")
        if four:
            aa = parts(a, 8, ta == "s32")
            acc = sum(aa[k] * bb[k] for k in range(4))
        else:
            ah = parts(a, 16, ta == "s32")
            k = 2 if high else 0
            acc = ah[0] * bb[k] + ah[1] * bb[k + 1]
        r = np.asarray(c).astype(np.int64) + acc
        return (r & 0xFFFFFFFF).astype(np.uint32).view(NP[tc])

    return _elementwise(ins, dec, f, tc, 3, [ta, tb, tc])


OPS.update(
    {
        "mul24": _mul24,
        "mad24": _mul24,
        "dp4a": _dp,
        "dp2a": _dp,
        "bfe": _bfe,
        "bfi": _bfi,
        "prmt": _prmt,
        "popc": _popc,
        "clz": _clz,
        "bfind": _bfind,
        "brev": _brev,
        "lop3": _lop3,
        "shf": _shf,
    }
)
