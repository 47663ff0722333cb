"""Integer, floating-point, logic, comparison and select instructions (PTX ISA sections 9.7.1-9.7.7).

In: one parsed instruction. Out: a `step(threads, mask)` closure computing it on every lane with numpy.
Floating point: add/sub/mul/div/sqrt/rcp in the instruction's own precision are numpy's (correctly rounded, the PTX
`.rn` result); the other rounding modes are computed as `.rn`. `fma` on f32/f16 computes in float64 and rounds once
more (a double rounding, off by one ulp only on rare ties); f64 `fma` is `a * b + c` in float64. `.approx` functions
(ex2, lg2, sin, cos, rsqrt, tanh) use numpy's float32 functions, well inside the ISA's stated error. `.ftz` does not
flush subnormals. bf16 computes in float32 and rounds to nearest even.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from xgrad_nv.emulate.parse import TYPE_BYTES, Instruction, Operand
from xgrad_nv.emulate.values import (
    NP,
    SINT,
    UINT,
    Array,
    Decoder,
    Mask,
    Step,
    from_compute,
    imm_array,
    is_float,
    is_signed,
    to_compute,
)

OPS: dict[str, Callable[[Instruction, Decoder], Step]] = {}
Fn = Callable[..., Array]


def itype(ins: Instruction) -> str:
    """The instruction's (last) type suffix."""
    for part in reversed(ins.op):
        if part in TYPE_BYTES:
            return part
    return "b32"


def _reg(name: str) -> Callable[[Callable[[Instruction, Decoder], Step]], Callable[[Instruction, Decoder], Step]]:
    def wrap(f: Callable[[Instruction, Decoder], Step]) -> Callable[[Instruction, Decoder], Step]:
        for n in name.split():
            OPS[n] = f
        return f

    return wrap


def _sat(v: Array, t: str) -> Array:
    return np.where(np.isnan(v), 0, np.clip(v, 0, 1)).astype(v.dtype)


def _elementwise(
    ins: Instruction, dec: Decoder, fn: Fn, t: str, nsrc: int, srct: list[str] | None = None, dstt: str | None = None
) -> Step:
    """A step that computes `fn(*sources)` in the compute type of `t` and writes it as `dstt`."""
    srct = srct or [t] * nsrc
    dstt = dstt or t
    srcs = [dec.src(ins.operands[1 + k], srct[k]) for k in range(nsrc)]
    w = dec.dst(ins.operands[0], dstt)
    sat = "sat" in ins.op and is_float(dstt)
    conv = any(s in ("bf16", "bf16x2") for s in srct) or dstt in ("bf16", "bf16x2")
    if not conv and not sat and (fast := _direct_step(ins, dec, fn, srct, dstt)) is not None:
        return fast
    if not conv and not sat:
        if nsrc == 1:
            a = srcs[0]
            return lambda st, m: w(st, fn(a(st)), m)
        if nsrc == 2:
            a, b = srcs
            return lambda st, m: w(st, fn(a(st), b(st)), m)
        if nsrc == 3:
            a, b, c = srcs
            return lambda st, m: w(st, fn(a(st), b(st), c(st)), m)

    def step(st: Any, m: Mask) -> None:
        vals = [to_compute(s(st), tt) for s, tt in zip(srcs, srct, strict=True)]
        r = fn(*vals)
        if sat:
            r = _sat(r, dstt)
        w(st, from_compute(r, dstt), m)

    return step


def _direct_step(ins: Instruction, dec: Decoder, fn: Fn, srct: list[str], dstt: str) -> Step | None:
    """The hot path: sources that are registers of their type's width (read as views) or immediates, and a
    destination register of the result's width; one closure, no reader/writer calls. None where it does not apply."""
    plan: list[tuple[int, np.dtype[Any], Array | None]] = []
    for k, t in enumerate(srct):
        op = ins.operands[1 + k]
        if op.kind == "imm" and t != "pred":
            plan.append((0, NP[t], imm_array(op, t)))
            continue
        if op.kind != "reg" or op.neg or op.name not in dec.index or t in ("pred", "f16x2", "bf16x2"):
            return None
        idx = dec.index[op.name]
        if dec.width[idx] != TYPE_BYTES[t]:
            return None
        plan.append((idx, NP[t], None))
    d = ins.operands[0]
    if all(c is not None for _, _, c in plan) or d.kind != "reg" or d.name not in dec.index or dstt == "pred":
        return None
    di = dec.index[d.name]
    if dec.width[di] != TYPE_BYTES[dstt] or dstt in ("f16x2", "bf16x2"):
        return None
    ddt, uw = NP[dstt], UINT[TYPE_BYTES[dstt]]

    def step(st: Any, m: Mask) -> None:
        r = st.regs
        v = fn(*[r[i].view(dt) if c is None else c for i, dt, c in plan])
        if v.dtype != ddt:
            v = v.astype(ddt)
        bits = v.view(uw)
        r[di] = bits if m is None else np.where(m, bits, r[di])

    return step


def _split(x: Array) -> tuple[Array, Array]:
    """Veltkamp's split of float64 `x` into two halves of 26 bits each (x = hi + lo exactly)."""
    big = x * 134217729.0  # 2**27 + 1
    hi = big - (big - x)
    return hi, x - hi


def fma64(a: Array, b: Array, c: Array) -> Array:
    """a * b + c for float64 with the product kept exact (Dekker's two-product and Knuth's two-sum); the sum is
    rounded once more, so a result can be off by one ulp where the exact sum lies on a tie. Falls back to a * b + c
    where the splitting overflows (|a|, |b| near the float64 limit)."""
    a, b, c = (np.asarray(x, np.float64) for x in (a, b, c))
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl  # p + e == a * b exactly
    s = p + c
    bb = s - p
    t = (p - (s - bb)) + (c - bb)  # s + t == p + c exactly
    r = s + (t + e)
    plain = p + c
    ok = np.isfinite(r) & np.isfinite(e) & (np.abs(p) < 1e300)
    out: Array = np.where(ok, r, plain)
    return out


def _fma(t: str) -> Fn:
    if t in ("f64",):
        return fma64
    out = NP["f32"] if t in ("bf16", "bf16x2") else NP[t]
    return lambda a, b, c: (a.astype(np.float64) * b + c).astype(out)


def mulhi_u64(a: Array, b: Array) -> Array:
    """The high 64 bits of the 128-bit product of uint64 arrays."""
    a = np.asarray(a, np.uint64)
    b = np.asarray(b, np.uint64)
    lo32 = np.uint64(0xFFFFFFFF)
    s32 = np.uint64(32)
    a0, a1, b0, b1 = a & lo32, a >> s32, b & lo32, b >> s32
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    mid = (p00 >> s32) + (p01 & lo32) + (p10 & lo32)
    hi: Array = p11 + (p01 >> s32) + (p10 >> s32) + (mid >> s32)
    return hi


def _mulhi(t: str) -> Fn:
    size = TYPE_BYTES[t]
    if size < 8:
        wide = SINT[size * 2] if is_signed(t) else UINT[size * 2]
        sh = wide.type(8 * size)
        return lambda a, b: ((a.astype(wide) * b.astype(wide)) >> sh).astype(NP[t])
    if not is_signed(t):
        return mulhi_u64

    def hi_s64(a: Array, b: Array) -> Array:
        au = np.asarray(a).view(np.uint64) if np.ndim(a) else np.asarray(a).astype(np.uint64)
        bu = np.asarray(b).view(np.uint64) if np.ndim(b) else np.asarray(b).astype(np.uint64)
        hi = mulhi_u64(au, bu)
        hi = hi - np.where(np.asarray(a) < 0, bu, np.uint64(0)) - np.where(np.asarray(b) < 0, au, np.uint64(0))
        return hi.astype(np.uint64).view(np.int64) if np.ndim(hi) else hi.astype(np.int64)

    return hi_s64


def _wide(t: str) -> str:
    return t[0] + str(TYPE_BYTES[t] * 16)


def _int_div(a: Array, b: Array) -> Array:
    safe = np.where(b == 0, 1, b).astype(np.result_type(a, b))
    if np.result_type(a, b).kind == "u":
        return np.where(b == 0, ~np.zeros_like(a), a // safe)
    r = np.fmod(a, safe)
    return np.where(b == 0, -1, (a - r) // safe).astype(np.result_type(a, b))


def _int_rem(a: Array, b: Array) -> Array:
    safe = np.where(b == 0, 1, b).astype(np.result_type(a, b))
    return np.where(b == 0, a, np.fmod(a, safe)).astype(np.result_type(a, b))


CARRY = "%__carry"  # the condition code's carry flag (CC.CF), one per thread


@_reg("addc subc madc")
def _carry(ins: Instruction, dec: Decoder) -> Step:
    """add.cc/addc, sub.cc/subc, mad.cc/madc (lo/hi): extended-precision arithmetic through the carry flag."""
    t = itype(ins)
    dt = NP["u" + t[1:]]
    op = ins.op[0].rstrip("c") if ins.op[0] in ("addc", "subc", "madc") else ins.op[0]
    carry_in = ins.op[0] in ("addc", "subc", "madc")
    carry_out = "cc" in ins.op
    cf = dec.reg(CARRY, "pred")
    nsrc = 3 if op == "mad" else 2
    srcs = [dec.src(ins.operands[1 + k], "u" + t[1:]) for k in range(nsrc)]
    w = dec.dst(ins.operands[0], "u" + t[1:])
    wcf = dec.dst(Operand("reg", CARRY), "pred")
    del cf
    hi = _mulhi("u" + t[1:])

    def step(st: Any, m: Mask) -> None:
        vals = [np.asarray(s(st), dt) for s in srcs]
        cin = st.regs[dec.index[CARRY]].astype(dt) if carry_in else dt.type(0)
        if op == "sub":
            a, b = vals
            d1 = a - b
            borrow = (a < b) | (d1 < cin)
            res, out = d1 - cin, borrow
        else:
            if op == "mad":
                a = hi(vals[0], vals[1]) if "hi" in ins.op else vals[0] * vals[1]
                b = vals[2]
            else:
                a, b = vals
            s1 = a + b
            s2 = s1 + cin
            res, out = s2, (s1 < a) | (s2 < s1)
        w(st, res, m)
        if carry_out:
            wcf(st, np.broadcast_to(out, (st.n,)), m)

    return step


@_reg("add sub mul div rem min max")
def _arith(ins: Instruction, dec: Decoder) -> Step:
    t = itype(ins)
    op = ins.op[0]
    if "cc" in ins.op:
        return _carry(ins, dec)
    if is_float(t):
        fns: dict[str, Fn] = {
            "add": np.add,
            "sub": np.subtract,
            "mul": np.multiply,
            "div": np.divide,
            "min": np.minimum if "NaN" in ins.op else np.fmin,
            "max": np.maximum if "NaN" in ins.op else np.fmax,
        }
        if op not in fns:
            raise dec.error(f"{op} has no floating-point form")
        return _elementwise(ins, dec, fns[op], t, 2)
    if op == "mul" and "hi" in ins.op:
        return _elementwise(ins, dec, _mulhi(t), t, 2)
    if op == "mul" and "wide" in ins.op:
        wt = _wide(t)
        wd = NP[wt]
        return _elementwise(ins, dec, lambda a, b: a.astype(wd) * b.astype(wd), t, 2, dstt=wt)
    if "sat" in ins.op:  # add.sat.s32 / sub.sat.s32
        sign = 1 if op == "add" else -1
        lo, hi = np.iinfo(np.int32).min, np.iinfo(np.int32).max
        return (
            _elementwise(
                ins, dec, lambda a, b: np.clip(a.astype(np.int64) + sign * b.astype(np.int64), lo, hi), t, 2, dstt="s32"
            )
            if t == "s32"
            else _int_sat(ins, dec)
        )
    fns = {
        "add": np.add,
        "sub": np.subtract,
        "mul": np.multiply,
        "div": _int_div,
        "rem": _int_rem,
        "min": np.minimum,
        "max": np.maximum,
    }
    return _elementwise(ins, dec, fns[op], t, 2)


def _int_sat(ins: Instruction, dec: Decoder) -> Step:
    raise dec.error(".sat integer arithmetic is defined only for .s32")


@_reg("mad fma")
def _mad(ins: Instruction, dec: Decoder) -> Step:
    t = itype(ins)
    if "cc" in ins.op:
        return _carry(ins, dec)
    if is_float(t):
        return _elementwise(ins, dec, _fma(t), t, 3)
    if "hi" in ins.op:
        hi = _mulhi(t)
        return _elementwise(ins, dec, lambda a, b, c: hi(a, b) + c, t, 3)
    if "wide" in ins.op:
        wt = _wide(t)
        wd = NP[wt]
        return _elementwise(ins, dec, lambda a, b, c: a.astype(wd) * b.astype(wd) + c, t, 3, [t, t, wt], wt)
    return _elementwise(ins, dec, lambda a, b, c: a * b + c, t, 3)


@_reg("sad")
def _sad(ins: Instruction, dec: Decoder) -> Step:
    t = itype(ins)
    return _elementwise(ins, dec, lambda a, b, c: np.where(a > b, a - b, b - a).astype(a.dtype) + c, t, 3)


def _unary_float(name: str) -> Fn:
    f32 = NP["f32"]
    fns: dict[str, Fn] = {
        "abs": np.abs,
        "neg": np.negative,
        "sqrt": np.sqrt,
        "rsqrt": lambda a: 1 / np.sqrt(a),
        "rcp": lambda a: 1 / a,
        "ex2": np.exp2,
        "lg2": np.log2,
        "sin": np.sin,
        "cos": np.cos,
        "tanh": np.tanh,
    }
    f = fns[name]
    if name in ("abs", "neg"):
        return f
    return lambda a: f(a.astype(f32)).astype(a.dtype) if a.dtype == np.float16 else f(a)


@_reg("abs neg sqrt rsqrt rcp ex2 lg2 sin cos tanh")
def _unary(ins: Instruction, dec: Decoder) -> Step:
    t = itype(ins)
    op = ins.op[0]
    if is_float(t):
        return _elementwise(ins, dec, _unary_float(op), t, 1)
    if op == "abs":
        return _elementwise(ins, dec, np.abs, t, 1)
    if op == "neg":
        return _elementwise(ins, dec, np.negative, t, 1)
    raise dec.error(f"{op} has no integer form")


@_reg("copysign")
def _copysign(ins: Instruction, dec: Decoder) -> Step:
    return _elementwise(ins, dec, lambda a, b: np.copysign(b, a), itype(ins), 2)


@_reg("and or xor not cnot")
def _logic(ins: Instruction, dec: Decoder) -> Step:
    t = itype(ins)
    fns: dict[str, Fn] = {
        "and": np.bitwise_and,
        "or": np.bitwise_or,
        "xor": np.bitwise_xor,
        "not": np.invert,
        "cnot": lambda a: (a == 0).astype(a.dtype),
    }
    op = ins.op[0]
    return _elementwise(ins, dec, fns[op], t, 1 if op in ("not", "cnot") else 2)


def _shift(left: bool, t: str) -> Fn:
    bits = 8 * TYPE_BYTES[t]
    dt = NP[t]

    def f(a: Array, n: Array) -> Array:
        n = np.minimum(n.astype(np.uint32), bits)
        k = np.minimum(n, bits - 1).astype(dt)
        out: Array
        if left:
            out = np.where(n >= bits, dt.type(0), a << k).astype(dt)
        elif dt.kind == "i":
            out = (a >> k).astype(dt)
        else:
            out = np.where(n >= bits, dt.type(0), a >> k).astype(dt)
        return out

    return f


@_reg("shl shr")
def _shifts(ins: Instruction, dec: Decoder) -> Step:
    t = itype(ins)
    return _elementwise(ins, dec, _shift(ins.op[0] == "shl", t), t, 2, [t, "u32"])


_CMP: dict[str, Fn] = {
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: (a != b) & (a == a) & (b == b),
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "lo": lambda a, b: a < b,
    "ls": lambda a, b: a <= b,
    "hi": lambda a, b: a > b,
    "hs": lambda a, b: a >= b,
    "equ": lambda a, b: (a == b) | (a != a) | (b != b),
    "neu": lambda a, b: a != b,
    "ltu": lambda a, b: ~(a >= b),
    "leu": lambda a, b: ~(a > b),
    "gtu": lambda a, b: ~(a <= b),
    "geu": lambda a, b: ~(a < b),
    "num": lambda a, b: (a == a) & (b == b),
    "nan": lambda a, b: (a != a) | (b != b),
}
_BOOL: dict[str, Fn] = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}


@_reg("setp set")
def _setp(ins: Instruction, dec: Decoder) -> Step:
    t = itype(ins)
    cmp = _CMP.get(ins.op[1])
    if cmp is None:
        raise dec.error(f"unknown comparison .{ins.op[1]}")
    boolop = next((_BOOL[p] for p in ins.op[2:] if p in _BOOL), None)
    dst = ins.operands[0]
    a = dec.src(ins.operands[1], t)
    b = dec.src(ins.operands[2], t)
    c = dec.src(ins.operands[3], "pred") if boolop is not None else None
    if ins.op[0] == "set":  # set.cmp.dtype.stype: all ones (int) or 1.0 (float) where true
        types = [p for p in ins.op if p in TYPE_BYTES]
        dt_name = types[0]
        w1 = dec.dst(dst, dt_name)
        one = NP[dt_name].type(1.0) if is_float(dt_name) else ~NP[dt_name].type(0)

        def set_step(st: Any, m: Mask) -> None:
            r = cmp(to_compute(a(st), t), to_compute(b(st), t))
            if boolop is not None and c is not None:
                r = boolop(r, c(st))
            w1(st, np.where(r, one, NP[dt_name].type(0)), m)

        return set_step
    pair = dst.items if dst.kind == "pair" else (dst,)
    wp = dec.dst(pair[0], "pred")
    wq = dec.dst(pair[1], "pred") if len(pair) > 1 else None

    def step(st: Any, m: Mask) -> None:
        r = cmp(to_compute(a(st), t), to_compute(b(st), t))
        q = ~r
        if boolop is not None and c is not None:
            cv = c(st)
            r = boolop(r, cv)
            q = boolop(q, cv)
        wp(st, r, m)
        if wq is not None:
            wq(st, q, m)

    return step


@_reg("selp")
def _selp(ins: Instruction, dec: Decoder) -> Step:
    t = itype(ins)
    a = dec.src(ins.operands[1], t)
    b = dec.src(ins.operands[2], t)
    c = dec.src(ins.operands[3], "pred")
    w = dec.dst(ins.operands[0], t)
    return lambda st, m: w(st, np.where(c(st), a(st), b(st)), m)


@_reg("slct")
def _slct(ins: Instruction, dec: Decoder) -> Step:
    t = itype(ins)
    ct = [p for p in ins.op if p in TYPE_BYTES][-1]
    a = dec.src(ins.operands[1], t)
    b = dec.src(ins.operands[2], t)
    c = dec.src(ins.operands[3], ct)
    w = dec.dst(ins.operands[0], t)
    return lambda st, m: w(st, np.where(c(st) >= 0, a(st), b(st)), m)


@_reg("testp")
def _testp(ins: Instruction, dec: Decoder) -> Step:
    t = itype(ins)
    fns: dict[str, Fn] = {
        "finite": np.isfinite,
        "infinite": np.isinf,
        "number": lambda a: ~np.isnan(a),
        "notanumber": np.isnan,
        "normal": lambda a: np.isfinite(a) & (np.abs(a) >= np.finfo(a.dtype).tiny),
        "subnormal": lambda a: (a != 0) & (np.abs(a) < np.finfo(a.dtype).tiny),
    }
    return _elementwise(ins, dec, fns[ins.op[1]], t, 1, dstt="pred")


@_reg("mov")
def _mov(ins: Instruction, dec: Decoder) -> Step:
    t = itype(ins)
    d, s = ins.operands[0], ins.operands[1]
    if s.kind == "vec":  # pack: mov.b32 %r, {%h0, %h1} / mov.b64 %rd, {%r0, %r1}
        return _pack(ins, dec, t, d, s.items)
    if d.kind == "vec":  # unpack
        return _unpack(ins, dec, t, d.items, s)
    a = dec.src(s, t)
    w = dec.dst(d, t)
    return lambda st, m: w(st, a(st), m)


def _pack(ins: Instruction, dec: Decoder, t: str, d: Operand, items: tuple[Operand, ...]) -> Step:
    size = TYPE_BYTES[t]
    part = size // len(items)
    pt = f"b{8 * part}"
    srcs = [dec.src(it, pt) for it in items]
    w = dec.dst(d, t)
    ut = UINT[size]

    def step(st: Any, m: Mask) -> None:
        acc = np.zeros((), ut)
        for k, s in enumerate(srcs):
            acc = acc | (s(st).astype(ut) << ut.type(8 * part * k))
        w(st, acc, m)

    return step


def _unpack(ins: Instruction, dec: Decoder, t: str, items: tuple[Operand, ...], s: Operand) -> Step:
    size = TYPE_BYTES[t]
    part = size // len(items)
    pt = f"b{8 * part}"
    a = dec.src(s, t)
    ws = [dec.dst(it, pt) for it in items]
    ut = UINT[size]
    pdt = UINT[part]

    def step(st: Any, m: Mask) -> None:
        v = a(st).astype(ut)
        for k, w in enumerate(ws):
            w(st, (v >> ut.type(8 * part * k)).astype(pdt), m)

    return step
