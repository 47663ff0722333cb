"""PTX's types, registers and arithmetic: the part of the PTX renderer (`xgrad_nv.ptx`) that turns one value's
operation into instructions, with no view of the kernel's structure (parameters, loops, memory, tensor cores).

Registers by class (`reg_class`): `%p` predicates, `%rs` 16-bit (8-bit ints kept sign- or zero-extended; half and
bfloat16 as bits), `%r` 32-bit, `%rd` 64-bit, `%f` float32, `%fd` float64. half computes with the `.f16`
instructions where they exist and through float32 otherwise; bfloat16 always through float32. Integer division and
remainder follow xgrad's total definition (x / 0 = 0, x % 0 = x, MIN / -1 = MIN) where the bounds say the divisor may
be 0 or -1.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xgrad.dtype import DType, dtypes
from xgrad.errors import DTypeError
from xgrad.uop.ops import Ops, UOp
from xgrad_codegen.renderer import divisor_may_be_zero, quotient_may_overflow

F16, BF16, F32, F64 = dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64
HALVES = (F16, BF16)


def ptx_type(dt: DType) -> str:
    """The PTX arithmetic type of a scalar dtype (bool: pred; half/bfloat16: their own names)."""
    d = dt.scalar()
    if d == dtypes.bool:
        return "pred"
    if d == dtypes.index:
        return "s32"
    if d in (F16, BF16, F32, F64):
        return {F16: "f16", BF16: "bf16", F32: "f32", F64: "f64"}[d]
    if d in dtypes.ints:
        return f"{'u' if dtypes.is_unsigned(d) else 's'}{8 * d.itemsize}"
    raise DTypeError(f"the PTX renderer has no type for {dt!r}; codegen should have decomposed it")


def reg_class(dt: DType) -> tuple[str, str]:
    """(register prefix, declared type) of a scalar dtype's registers."""
    t = ptx_type(dt)
    if t == "pred":
        return "%p", ".pred"
    size = dt.scalar().itemsize if dt.scalar() != dtypes.index else 4
    if t == "f32":
        return "%f", ".f32"
    if t == "f64":
        return "%fd", ".f64"
    return {1: ("%rs", ".b16"), 2: ("%rs", ".b16"), 4: ("%r", ".b32"), 8: ("%rd", ".b64")}[size]


def nbytes(dt: DType) -> int:
    """Bytes of a scalar dtype in registers and memory (index is a 32-bit int, as in the CUDA renderer)."""
    return 4 if dt.scalar() == dtypes.index else dt.scalar().itemsize


def op_type(dt: DType) -> str:
    """The type an integer op is written with on the register (8-bit values live in 16-bit registers)."""
    t = ptx_type(dt)
    return t[0] + "16" if t in ("s8", "u8") else t


def mem_type(dt: DType) -> str:
    """The type of a load/store of `dt` (half/bfloat16: raw 16 bits; bool: a byte)."""
    t = ptx_type(dt)
    if t in ("f16", "bf16"):
        return "b16"
    if t == "pred":
        return "u8"
    return t


@dataclass
class PTXContext:
    """One kernel's rendering state: its lines, register counts and declarations, the register(s) of each UOp."""

    lines: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    decl: dict[str, str] = field(default_factory=dict)
    regs: dict[UOp, Any] = field(default_factory=dict)  # UOp -> register name, or a tuple of them for vectors
    params: dict[int, str] = field(default_factory=dict)
    variables: list[str] = field(default_factory=list)
    shared: list[str] = field(default_factory=list)
    labels: int = 0
    loops: dict[UOp, tuple[str, str, str]] = field(default_factory=dict)  # RANGE -> (register, top label, end label)
    dynamic: bool = False  # the arrays live in dynamic shared memory (more than the static limit)
    shared_offset: int = 0  # bytes of dynamic shared memory given out

    def emit(self, line: str) -> None:
        self.lines.append("\t" + line)

    def new(self, dt: DType) -> str:
        prefix, t = reg_class(dt)
        return self.new_reg(prefix, t)

    def new_reg(self, prefix: str, t: str) -> str:
        n = self.counts.get(prefix, 0)
        self.counts[prefix] = n + 1
        self.decl[prefix] = t
        return f"{prefix}{n}"

    def label(self, what: str) -> str:
        self.labels += 1
        return f"$L_{what}_{self.labels}"


def _float_bits(value: float, dt: DType) -> str:
    """A float immediate as PTX writes it: 0d/0f + the bits (16-bit floats as a 0x bit pattern for mov.b16)."""
    if dt == F64:
        return "0d" + struct.pack(">d", value).hex().upper()
    with np.errstate(over="ignore"):
        if dt == F16:
            return f"0x{int(np.float16(value).view(np.uint16)):04X}"
        bits = int(np.float32(value).view(np.uint32))
    if dt == F32:
        return f"0f{bits:08X}"
    if (bits & 0x7F800000) == 0x7F800000 and bits & 0x7FFFFF:  # bfloat16: float32 bits rounded to nearest even
        return "0x7FC0"
    return f"0x{((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF:04X}"


class PTXArith:
    """Constants, moves, conversions and ALU ops on virtual registers (a base of `PTXRenderer`)."""

    def _const(self, ctx: PTXContext, value: Any, dt: DType) -> str:
        r = ctx.new(dt)
        t = ptx_type(dt)
        if t == "pred":
            ctx.emit(f"setp.ne.u32 {r}, {1 if value else 0}, 0;")
        elif t in ("f32", "f64"):
            ctx.emit(f"mov.{t} {r}, {_float_bits(float(value), dt)};")
        elif t in ("f16", "bf16"):
            ctx.emit(f"mov.b16 {r}, {_float_bits(float(value), dt)};")
        else:
            bits = int(value) & ((1 << (8 * max(dt.itemsize, 2) if dt != dtypes.index else 32)) - 1)
            ctx.emit(f"mov.b{reg_class(dt)[1][2:]} {r}, {bits};")
        return r

    def _mov(self, dst: str, src: str, dt: DType) -> str:
        _, t = reg_class(dt)
        return f"mov{t} {dst}, {src};"

    # ---- conversions ----
    def _cvt_int(self, ctx: PTXContext, r: str, src: DType, dst: DType) -> str:
        out = ctx.new(dst)
        dt_ = ptx_type(dst)
        if reg_class(src) == reg_class(dst):
            ctx.emit(self._mov(out, r, dst))
        else:
            ctx.emit(f"cvt.{op_type(dst)}.{op_type(src)} {out}, {r};")
        if dt_ in ("s8", "u8"):  # keep 8-bit values extended in their 16-bit register
            ctx.emit(f"cvt.{op_type(dst)}.{dt_} {out}, {out};")
        return out

    def _to_f32(self, ctx: PTXContext, r: str, src: DType) -> str:
        """A float32 copy of a 16-bit float register."""
        out = ctx.new(F32)
        if src == F16:
            ctx.emit(f"cvt.f32.f16 {out}, {r};")
        else:  # bfloat16 -> float32 is the bits moved to the top half
            ctx.emit(f"mov.b32 {out}, {{{self._zero16(ctx)}, {r}}};")
        return out

    def _zero16(self, ctx: PTXContext) -> str:
        z = ctx.new(dtypes.int16)
        ctx.emit(f"mov.b16 {z}, 0;")
        return z

    def _from_f32(self, ctx: PTXContext, r: str, dst: DType) -> str:
        out = ctx.new(dst)
        ctx.emit(f"cvt.rn.{ptx_type(dst)}.f32 {out}, {r};")
        return out

    def _r_cast(self, ctx: PTXContext, u: UOp) -> None:
        src, dst = u.src[0].dtype.scalar(), u.dtype.scalar()
        ctx.regs[u] = self._cast(ctx, ctx.regs[u.src[0]], src, dst)

    def _cast(self, ctx: PTXContext, r: str, src: DType, dst: DType) -> str:
        if src == dst or (ptx_type(src) == ptx_type(dst)):
            return r
        if dst == dtypes.bool:
            p = ctx.new(dst)
            if src in HALVES:
                r, src = self._to_f32(ctx, r, src), F32
            if src == dtypes.bool:
                return r
            cmp = "neu" if dtypes.is_float(src) else "ne"
            zero = {F32: "0f00000000", F64: "0d0000000000000000"}.get(src, "0")
            ctx.emit(f"setp.{cmp}.{op_type(src)} {p}, {r}, {zero};")
            return p
        if src == dtypes.bool:
            one = self._const(ctx, 1, dst)
            zero = self._const(ctx, 0, dst)
            out = ctx.new(dst)
            ctx.emit(f"selp.b{reg_class(dst)[1][2:]} {out}, {one}, {zero}, {r};")
            return out
        if src in HALVES and dst in HALVES:
            return self._from_f32(ctx, self._to_f32(ctx, r, src), dst)
        if src == BF16:
            return self._cast(ctx, self._to_f32(ctx, r, src), F32, dst)
        if dst == BF16:
            if src != F32:
                r = self._cast(ctx, r, src, F32)
            return self._from_f32(ctx, r, dst)
        sf, df = dtypes.is_float(src), dtypes.is_float(dst)
        out = ctx.new(dst)
        if sf and df:
            narrowing = dst.itemsize < src.itemsize
            ctx.emit(f"cvt{'.rn' if narrowing else ''}.{ptx_type(dst)}.{ptx_type(src)} {out}, {r};")
        elif sf:
            ctx.emit(f"cvt.rzi.{op_type(dst)}.{ptx_type(src)} {out}, {r};")
            if ptx_type(dst) in ("s8", "u8"):
                ctx.emit(f"cvt.{op_type(dst)}.{ptx_type(dst)} {out}, {out};")
        elif df:
            ctx.emit(f"cvt.rn.{ptx_type(dst)}.{op_type(src)} {out}, {r};")
        else:
            return self._cvt_int(ctx, r, src, dst)
        return out

    def _r_bitcast(self, ctx: PTXContext, u: UOp) -> None:
        src, dst = u.src[0].dtype.scalar(), u.dtype.scalar()
        if src.itemsize != dst.itemsize:
            raise DTypeError(f"BITCAST from {src!r} to {dst!r} needs equal sizes")
        r = ctx.regs[u.src[0]]
        out = ctx.new(dst)
        bits = 8 * max(dst.itemsize, 2)
        if dst.itemsize == 1:  # int8 <-> uint8: re-extend the low byte
            ctx.emit(f"cvt.{op_type(dst)}.{ptx_type(dst)} {out}, {r};")
        else:
            ctx.emit(f"mov.b{bits} {out}, {r};")
        ctx.regs[u] = out

    # ---- ALU ----
    def _alu(self, ctx: PTXContext, u: UOp) -> str:
        dt = u.dtype.scalar()
        srcs = [ctx.regs[s] for s in u.src]
        sdt = u.src[0].dtype.scalar() if u.src else dt
        if u.op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ):
            return self._compare(ctx, u.op, srcs, sdt)
        if u.op is Ops.WHERE:
            return self._where(ctx, srcs, dt)
        if dt == dtypes.bool:
            return self._bool_alu(ctx, u.op, srcs)
        if dt == BF16 or (dt == F16 and u.op not in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.MULACC, Ops.NEG)):
            wide = [self._to_f32(ctx, s, dt) for s in srcs]
            return self._from_f32(ctx, self._float_alu(ctx, u.op, wide, F32), dt)
        if dtypes.is_float(dt):
            return self._float_alu(ctx, u.op, srcs, dt)
        return self._int_alu(ctx, u, srcs, dt)

    def _float_alu(self, ctx: PTXContext, op: Ops, s: list[str], dt: DType) -> str:
        t = ptx_type(dt)
        out = ctx.new(dt)
        binary = {Ops.ADD: "add.rn", Ops.SUB: "sub.rn", Ops.MUL: "mul.rn", Ops.FDIV: "div.rn"}
        if op in binary:
            ctx.emit(f"{binary[op]}.{t} {out}, {s[0]}, {s[1]};")
        elif op is Ops.MULACC:
            ctx.emit(f"fma.rn.{t} {out}, {s[0]}, {s[1]}, {s[2]};")
        elif op is Ops.NEG:
            ctx.emit(f"neg.{t} {out}, {s[0]};")
        elif op is Ops.RECIPROCAL:
            ctx.emit(f"rcp.rn.{t} {out}, {s[0]};")
        elif op is Ops.SQRT:
            ctx.emit(f"sqrt.rn.{t} {out}, {s[0]};")
        elif op is Ops.TRUNC:
            ctx.emit(f"cvt.rzi.{t}.{t} {out}, {s[0]};")
        elif op is Ops.MAX:  # NaN in either operand gives NaN (PTX max returns the other operand)
            nan = ctx.new(dtypes.bool)
            ctx.emit(f"max.{t} {out}, {s[0]}, {s[1]};")
            ctx.emit(f"setp.nan.{t} {nan}, {s[0]}, {s[1]};")
            ctx.emit(f"@{nan} add.rn.{t} {out}, {s[0]}, {s[1]};")
        else:
            raise NotImplementedError(f"the PTX renderer has no {op} for {dt!r}")
        return out

    def _int_alu(self, ctx: PTXContext, u: UOp, s: list[str], dt: DType) -> str:
        op = u.op
        t = op_type(dt)
        bits = t[1:]
        out = ctx.new(dt)
        simple = {Ops.ADD: "add", Ops.SUB: "sub", Ops.MAX: "max"}
        if op in simple:
            ctx.emit(f"{simple[op]}.{t} {out}, {s[0]}, {s[1]};")
        elif op is Ops.MUL:
            ctx.emit(f"mul.lo.{t} {out}, {s[0]}, {s[1]};")
        elif op is Ops.MULACC:
            ctx.emit(f"mad.lo.{t} {out}, {s[0]}, {s[1]}, {s[2]};")
        elif op is Ops.NEG:
            ctx.emit(f"neg.{'s' + bits} {out}, {s[0]};")
        elif op in (Ops.AND, Ops.OR, Ops.XOR):
            ctx.emit(f"{op.name.lower()}.b{bits} {out}, {s[0]}, {s[1]};")
        elif op in (Ops.SHL, Ops.SHR):
            amount = s[1]
            adt = u.src[1].dtype.scalar()
            if reg_class(adt) != ("%r", ".b32"):
                amount = self._cvt_int(ctx, amount, adt, dtypes.uint32)
            name = "shl.b" + bits if op is Ops.SHL else f"shr.{t}"
            ctx.emit(f"{name} {out}, {s[0]}, {amount};")
        elif op in (Ops.IDIV, Ops.MOD):
            self._divmod(ctx, u, s, t, out)
        else:
            raise NotImplementedError(f"the PTX renderer has no {op} for {dt!r}")
        if ptx_type(dt) in ("s8", "u8"):
            ctx.emit(f"cvt.{t}.{ptx_type(dt)} {out}, {out};")
        return out

    def _divmod(self, ctx: PTXContext, u: UOp, s: list[str], t: str, out: str) -> None:
        a, b = s
        instr = "div" if u.op is Ops.IDIV else "rem"
        zero = divisor_may_be_zero(u)
        minus_one = quotient_may_overflow(u)
        if not zero and not minus_one:
            ctx.emit(f"{instr}.{t} {out}, {a}, {b};")
            return
        dt = u.dtype.scalar()
        safe = ctx.new(dt)
        ctx.emit(self._mov(safe, b, dt))
        pz = ctx.new(dtypes.bool)
        pm = ctx.new(dtypes.bool)
        if zero:
            ctx.emit(f"setp.eq.{t} {pz}, {b}, 0;")
            ctx.emit(f"@{pz} mov.b{t[1:]} {safe}, 1;")
        if minus_one:
            ctx.emit(f"setp.eq.{t} {pm}, {b}, -1;")
            ctx.emit(f"@{pm} mov.b{t[1:]} {safe}, 1;")
        ctx.emit(f"{instr}.{t} {out}, {a}, {safe};")
        if instr == "div":
            if zero:
                ctx.emit(f"@{pz} mov.b{t[1:]} {out}, 0;")
            if minus_one:
                ctx.emit(f"@{pm} neg.s{t[1:]} {out}, {a};")
        elif zero:
            ctx.emit(f"@{pz} mov.b{t[1:]} {out}, {a};")

    def _compare(self, ctx: PTXContext, op: Ops, s: list[str], sdt: DType) -> str:
        out = ctx.new(dtypes.bool)
        if sdt == dtypes.bool:
            if op is Ops.CMPNE:
                ctx.emit(f"xor.pred {out}, {s[0]}, {s[1]};")
            elif op is Ops.CMPEQ:
                x = ctx.new(dtypes.bool)
                ctx.emit(f"xor.pred {x}, {s[0]}, {s[1]};")
                ctx.emit(f"not.pred {out}, {x};")
            else:  # a < b: !a & b
                na = ctx.new(dtypes.bool)
                ctx.emit(f"not.pred {na}, {s[0]};")
                ctx.emit(f"and.pred {out}, {na}, {s[1]};")
            return out
        if sdt in HALVES:
            s = [self._to_f32(ctx, x, sdt) for x in s]
            sdt = F32
        t = op_type(sdt)
        isf = dtypes.is_float(sdt)
        name = {Ops.CMPLT: "lt", Ops.CMPEQ: "eq", Ops.CMPNE: "neu" if isf else "ne"}[op]
        ctx.emit(f"setp.{name}.{t} {out}, {s[0]}, {s[1]};")
        return out

    def _where(self, ctx: PTXContext, s: list[str], dt: DType) -> str:
        c, a, b = s
        out = ctx.new(dt)
        if dt == dtypes.bool:
            ctx.emit(f"@{c} mov.pred {out}, {a};")
            ctx.emit(f"@!{c} mov.pred {out}, {b};")
        else:
            _, t = reg_class(dt)
            ctx.emit(f"selp{t} {out}, {a}, {b}, {c};")
        return out

    def _bool_alu(self, ctx: PTXContext, op: Ops, s: list[str]) -> str:
        out = ctx.new(dtypes.bool)
        if op in (Ops.AND, Ops.OR, Ops.XOR):
            ctx.emit(f"{op.name.lower()}.pred {out}, {s[0]}, {s[1]};")
        elif op in (Ops.MAX, Ops.ADD):
            ctx.emit(f"or.pred {out}, {s[0]}, {s[1]};")
        elif op is Ops.MUL:
            ctx.emit(f"and.pred {out}, {s[0]}, {s[1]};")
        elif op is Ops.NEG:
            ctx.emit(f"not.pred {out}, {s[0]};")
        else:
            raise NotImplementedError(f"the PTX renderer has no {op} for bool")
        return out
