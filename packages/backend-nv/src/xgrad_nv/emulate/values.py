"""PTX types as numpy arrays, and the decode context that turns operands into readers and writers.

Registers hold raw bits, one numpy array per register over all emulated threads, of the unsigned type of the
register's width (bool for predicates). An instruction reads an operand as its own type: a view of the same width,
the low bits of a wider register, or the value extended (sign- or zero-, by the type) from a narrower one; it writes
back the same way. bf16 has no numpy type: it stays uint16 bits, converted through float32 where it is computed on.
Register arrays are never changed in place (a write makes a new array), so two registers may share one array.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from xgrad_nv.emulate.errors import EmulatorError
from xgrad_nv.emulate.parse import TYPE_BYTES, Function, Instruction, Operand

if TYPE_CHECKING:
    from xgrad_nv.emulate.machine import Threads

Array = np.ndarray[Any, Any]
Mask = Array | None
Reader = Callable[["Threads"], Array]
Writer = Callable[["Threads", Array, Mask], None]
Step = Callable[["Threads", Mask], None]

UINT: dict[int, np.dtype[Any]] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.uint16),
    4: np.dtype(np.uint32),
    8: np.dtype(np.uint64),
}
SINT: dict[int, np.dtype[Any]] = {
    1: np.dtype(np.int8),
    2: np.dtype(np.int16),
    4: np.dtype(np.int32),
    8: np.dtype(np.int64),
}
NP: dict[str, np.dtype[Any]] = {
    "pred": np.dtype(np.bool_),
    "f16": np.dtype(np.float16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "bf16": np.dtype(np.uint16),
    "f16x2": np.dtype(np.float16),
    "bf16x2": np.dtype(np.uint16),
    "tf32": np.dtype(np.float32),
}
for _n in (1, 2, 4, 8):
    NP[f"b{8 * _n}"] = UINT[_n]
    NP[f"u{8 * _n}"] = UINT[_n]
    NP[f"s{8 * _n}"] = SINT[_n]

SPECIAL = {"%tid", "%ntid", "%ctaid", "%nctaid", "%laneid", "%warpid", "%nwarpid", "%smid", "%nsmid", "%gridid"}
SPECIAL_FULL = {"%clock", "%clock64", "%lanemask_eq", "%lanemask_lt", "%lanemask_le", "%lanemask_gt", "%lanemask_ge"}


def is_float(t: str) -> bool:
    """Whether a PTX type name is floating-point."""
    return t[0] == "f" or t.startswith("bf") or t == "tf32"


def is_signed(t: str) -> bool:
    """Whether a PTX type name is a signed integer."""
    return t[0] == "s"


def bf16_to_f32(bits: Array) -> Array:
    """bfloat16 bits (uint16) -> float32 (exact)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16(x: Array, mode: str = "rn") -> Array:
    """float32 -> bfloat16 bits with a rounding mode (rn: to nearest even, rz, rm, rp); NaN stays a quiet NaN."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    trunc = (u >> np.uint32(16)).astype(np.uint16)
    low = u & np.uint32(0xFFFF)
    if mode == "rn":
        up = (low > 0x8000) | ((low == 0x8000) & ((trunc & 1) == 1))
    elif mode == "rz":
        up = np.zeros(u.shape, bool)
    else:
        neg = (u >> np.uint32(31)) == 1
        up = (low != 0) & (neg if mode == "rm" else ~neg)
    out = trunc + up.astype(np.uint16)
    nan = np.isnan(np.asarray(x, np.float32))
    return np.where(nan, trunc | np.uint16(0x40), out).astype(np.uint16)


def to_compute(v: Array, t: str) -> Array:
    """An operand's value in a numpy type that arithmetic works on (bf16 -> float32)."""
    return bf16_to_f32(v) if t in ("bf16", "bf16x2") else v


def from_compute(v: Array, t: str) -> Array:
    """A computed value back in the storage type of `t` (float32 -> bf16 bits, rounding to nearest)."""
    if t in ("bf16", "bf16x2"):
        return f32_to_bf16(np.asarray(v, np.float32))
    return np.asarray(v, NP[t])


def imm_array(op: Operand, t: str) -> Array:
    """An immediate as a 0-d array of type `t` (float literals given as bit patterns keep their bits for .b types)."""
    dt = NP[t]
    v = op.value
    text = op.text.lstrip("-")
    if t in ("bf16", "bf16x2") and isinstance(v, float):
        return np.asarray(f32_to_bf16(np.asarray(v, np.float32)))
    if dt.kind == "f":
        return np.asarray(v, dt)
    if isinstance(v, float):
        size = dt.itemsize
        single = text[:2] in ("0f", "0F")
        bits = np.asarray(v, np.float32 if single else np.float64).view(UINT[4 if single else 8])
        return np.asarray(int(bits) & ((1 << (8 * size)) - 1), UINT[size]).view(dt)
    if dt == np.bool_:
        return np.asarray(bool(v))
    size = dt.itemsize
    return np.asarray(int(v) & ((1 << (8 * size)) - 1), UINT[size]).view(dt)


class Decoder:
    """Per-kernel decode context: register numbers and widths, and the state-space symbols' names."""

    def __init__(self, fn: Function, symbols: dict[str, str]) -> None:
        self.fn = fn
        self.symbols = symbols  # name -> state space ('global', 'const', 'shared', 'local', 'param')
        self.index: dict[str, int] = {}
        self.width: list[int] = []  # bytes per register; 0 for predicates
        for name, t in fn.regs.items():
            self.reg(name, t[1:])
        self.ins: Instruction | None = None

    def reg(self, name: str, t: str = "b32") -> int:
        """The number of register `name` (declared on first use with type `t`)."""
        if name not in self.index:
            self.index[name] = len(self.width)
            self.width.append(0 if t == "pred" else TYPE_BYTES[t])
        return self.index[name]

    def error(self, what: str) -> EmulatorError:
        """An error naming the instruction being decoded and its PTX line."""
        ins = self.ins
        where = f" (PTX line {ins.line}: {ins.text})" if ins else ""
        return EmulatorError(f"kernel {self.fn.name}: {what}{where}")

    def src(self, op: Operand, t: str) -> Reader:
        """A reader of operand `op` as PTX type `t`."""
        if op.kind == "imm":
            c = imm_array(op, t)
            return lambda st: c
        if op.kind == "sym":
            name = op.name
            off = int(op.value)
            dt = NP[t]
            return lambda st: np.asarray(st.symbol(name) + off, np.uint64).astype(dt)
        if op.kind != "reg":
            raise self.error(f"operand kind {op.kind} cannot be read as a value")
        base = op.name.split(".")[0]
        if base in SPECIAL or op.name in SPECIAL_FULL:
            name = op.name
            sdt = NP[t]
            return lambda st: st.special(name).astype(sdt)
        if op.name not in self.index:
            raise self.error(f"register {op.name} is not declared")
        idx = self.index[op.name]
        w = self.width[idx]
        if t == "pred" or w == 0:
            if op.neg:
                return lambda st: ~st.regs[idx]
            return lambda st: st.regs[idx]
        dt = NP[t]
        size = TYPE_BYTES[t]
        if size == w:
            if dt == UINT[w]:
                return lambda st: st.regs[idx]
            if dt.itemsize == w:
                return lambda st: st.regs[idx].view(dt)
            return lambda st: np.ascontiguousarray(st.regs[idx]).view(dt)
        if size < w:
            narrow = UINT[size]
            return lambda st: st.regs[idx].astype(narrow).view(dt)
        if is_signed(t):
            sw = SINT[w]
            return lambda st: st.regs[idx].view(sw).astype(dt)
        return lambda st: st.regs[idx].astype(UINT[size]).view(dt)

    def dst(self, op: Operand, t: str) -> Writer:
        """A writer of a value of PTX type `t` into register operand `op` (masked lanes keep their value)."""
        if op.kind == "sink":
            return lambda st, v, mask: None
        if op.kind != "reg":
            raise self.error(f"cannot write to operand {op}")
        if op.name not in self.index:
            raise self.error(f"register {op.name} is not declared")
        idx = self.index[op.name]
        w = self.width[idx]
        if t == "pred" or w == 0:
            return lambda st, v, mask: st.write(idx, np.asarray(v, np.bool_), mask)
        dt = NP[t]
        size = TYPE_BYTES[t]
        uw = UINT[w]
        if size == w:
            if dt == uw:
                return lambda st, v, mask: st.write(idx, np.asarray(v, uw), mask)
            return lambda st, v, mask: st.write(idx, np.ascontiguousarray(v, dt).view(uw), mask)
        if size > w:
            us = UINT[size]
            return lambda st, v, mask: st.write(idx, np.ascontiguousarray(v, dt).view(us).astype(uw), mask)
        if is_signed(t):
            sw = SINT[w]
            return lambda st, v, mask: st.write(idx, np.asarray(v, dt).astype(sw).view(uw), mask)
        us = UINT[size]
        return lambda st, v, mask: st.write(idx, np.ascontiguousarray(v, dt).view(us).astype(uw), mask)
